"""Broker tables, one model per DESIGN.md concept; the rules live in broker/core/.

A foreign key whose column leads a longer index of its table (a unique constraint, a
listing's index) has no index of its own (db_index=False): it served no lookup the longer one
does not, and with stale statistics PostgreSQL took it for lookups naming more columns
(docs/decisions/0027-lookups-the-planner-cannot-misread.md; tests/core/test_plans.py).
"""

from django.db import models


class Topic(models.Model):
    class Overflow(models.TextChoices):
        REJECT = "reject"
        DROP_OLDEST = "drop_oldest"

    name = models.CharField(max_length=200, unique=True)
    partition_count = models.PositiveIntegerField()
    retention_ms = models.BigIntegerField(null=True, blank=True)
    retention_bytes = models.BigIntegerField(null=True, blank=True)
    max_message_bytes = models.PositiveIntegerField()
    # Capacity counts retained messages per partition (docs/decisions/0003-capacity.md).
    capacity = models.PositiveBigIntegerField(null=True, blank=True)
    overflow_policy = models.CharField(
        max_length=16, choices=Overflow.choices, default=Overflow.REJECT
    )
    # A message older than this when a group would deliver it is dead-lettered (reason "expired").
    message_ttl_ms = models.BigIntegerField(null=True, blank=True)
    # Record per-delivery trace events (delivered, acked, nacked); retries and dead letters always.
    trace = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # Marked for deletion (docs/decisions/0013-readers-beside-the-writer.md): renamed to
    # "~deleting.<id>", which no client can name, so the name is free at once; its rows go in
    # chunks (topics.run_topic_deletions). deleted_name keeps the name it had.
    deleting_since_ms = models.BigIntegerField(null=True, blank=True, db_index=True)
    deleted_name = models.CharField(max_length=200, default="", blank=True)

    def __str__(self) -> str:
        return self.name


class Partition(models.Model):
    topic = models.ForeignKey(
        Topic, on_delete=models.CASCADE, related_name="partitions", db_index=False
    )
    number = models.PositiveIntegerField()
    # The offset the next appended message gets; its row lock serializes offset assignment.
    next_offset = models.BigIntegerField(default=0)
    # The lowest offset still stored; retention and drop_oldest advance it.
    start_offset = models.BigIntegerField(default=0)
    # Sum of size_bytes of the stored messages, kept under the same lock, for size retention.
    bytes_stored = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["topic", "number"], name="partition_topic_number_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.topic.name}[{self.number}]"


class Message(models.Model):
    # No index of its own: message_partition_offset_uniq leads with it, and a second one cost
    # every insert its upkeep and gave the planner a worse index for reads (0009). No database
    # foreign key on PostgreSQL: its check per message row cost a quarter of the server's work
    # on a produce; appends lock the partition row, and a topic's deletion removes its messages
    # before the partition (docs/decisions/0017-messages-without-a-foreign-key.md).
    partition = models.ForeignKey(
        Partition,
        on_delete=models.CASCADE,
        related_name="messages",
        db_index=False,
        db_constraint=False,
    )
    offset = models.BigIntegerField()
    timestamp_ms = models.BigIntegerField()
    key = models.CharField(max_length=1024, null=True, blank=True)
    tag = models.CharField(max_length=200, null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    # value holds JSON text when is_json, else the raw bytes.
    value = models.BinaryField()
    is_json = models.BooleanField(default=True)
    size_bytes = models.PositiveIntegerField()
    client_id = models.CharField(max_length=200, null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["partition", "offset"], name="message_partition_offset_uniq"
            )
        ]
        indexes = [
            models.Index(fields=["partition", "timestamp_ms"], name="message_partition_ts_idx"),
            # The console's message browser finds messages by key and by client message id
            # without a scan, newest first (the offset serves the ORDER BY); partial, so keyless
            # and id-less messages cost nothing to insert.
            models.Index(
                fields=["partition", "key", "offset"],
                condition=models.Q(key__isnull=False),
                name="message_partition_key_idx",
            ),
            models.Index(
                fields=["partition", "client_id", "offset"],
                condition=models.Q(client_id__isnull=False),
                name="message_partition_cid_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.partition.topic.name}[{self.partition.number}]@{self.offset}"


class ProducedId(models.Model):
    """A client message id seen on a topic within the dedup window, and where it was stored."""

    # No foreign key check on PostgreSQL, as broker_message (ADR 0017): every id of every
    # produce paid one at commit. The topic's deletion job removes its ids. No index of its
    # own: producedid_topic_id_uniq leads with it, and with stale statistics PostgreSQL read a
    # topic's every id through it to find a request's (0012).
    topic = models.ForeignKey(
        Topic,
        on_delete=models.CASCADE,
        related_name="produced_ids",
        db_constraint=False,
        db_index=False,
    )
    client_id = models.CharField(max_length=200)
    partition_number = models.PositiveIntegerField()
    offset = models.BigIntegerField()
    created_ms = models.BigIntegerField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["topic", "client_id"], name="producedid_topic_id_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.topic.name}:{self.client_id}"


class ScheduledMessage(models.Model):
    """A delayed message: durable at once, invisible until due_ms, then appended to its topic."""

    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="scheduled")
    due_ms = models.BigIntegerField()
    # The partition asked for, if any; otherwise it is chosen (key hash, round robin) on release.
    partition_number = models.PositiveIntegerField(null=True, blank=True)
    key = models.CharField(max_length=1024, null=True, blank=True)
    tag = models.CharField(max_length=200, null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    value = models.BinaryField()
    is_json = models.BooleanField(default=True)
    client_id = models.CharField(max_length=200, null=True, blank=True)
    created_ms = models.BigIntegerField()

    class Meta:
        # (due_ms, id): release_due orders by both, and many rows share a due time (one batch
        # with one delay), which PostgreSQL would otherwise sort on every claim.
        indexes = [models.Index(fields=["due_ms", "id"], name="scheduled_due_id_idx")]
        # The client id first: a delayed produce looks its ids up by them alone (delayed.py).
        # Led by the topic, PostgreSQL with stale statistics took the topic's own index
        # instead and read the topic's every scheduled message for each request (0013).
        constraints = [
            models.UniqueConstraint(
                fields=["client_id", "topic"],
                condition=models.Q(client_id__isnull=False),
                name="scheduled_client_id_topic_uniq",
            )
        ]

    def __str__(self) -> str:
        return f"{self.topic.name} due {self.due_ms}"


class ConsumerGroup(models.Model):
    class Mode(models.TextChoices):
        CLUSTERING = "clustering"  # each message to one member
        BROADCAST = "broadcast"  # every member gets every message, with its own offsets

    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.CLUSTERING)
    # At most one message of a partition in flight; a failure blocks the partition (ordered mode).
    ordered = models.BooleanField(default=False)
    ack_deadline_ms = models.PositiveIntegerField(default=30_000)
    max_attempts = models.PositiveIntegerField(default=16)
    # Backoff before redelivery after the n-th failure; empty means RocketMQ's levels.
    retry_delays_ms = models.JSONField(default=list, blank=True)
    # How partitions are spread over members: broker/core/assignment.py.
    strategy = models.CharField(max_length=20, default="sticky")
    # Bumped by every rebalance; a member's view of its partitions carries it.
    generation = models.BigIntegerField(default=0)
    session_timeout_ms = models.PositiveIntegerField(default=45_000)

    def __str__(self) -> str:
        return self.name


class GroupMember(models.Model):
    """A live consumer of a group on a topic; it expires when silent past the session timeout."""

    group = models.ForeignKey(
        ConsumerGroup, on_delete=models.CASCADE, related_name="members", db_index=False
    )
    member_id = models.CharField(max_length=100)
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="members")
    joined_ms = models.BigIntegerField()
    heartbeat_ms = models.BigIntegerField(db_index=True)
    # The subscription filter (broker/core/filters.py) as given; null delivers everything.
    filter = models.JSONField(null=True, blank=True)
    # What the consumer calls itself (Kafka's client.id) and where it connects from, for the
    # console and GET /groups/{g}: "billing-worker-3", "websocket 10.0.0.7".
    client = models.CharField(max_length=100, default="", blank=True)
    host = models.CharField(max_length=100, default="", blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "member_id"], name="groupmember_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.group.name}:{self.member_id}"


class PartitionLease(models.Model):
    """Which member of a group holds a partition: one row per (group, partition), so one holder."""

    group = models.ForeignKey(
        ConsumerGroup, on_delete=models.CASCADE, related_name="leases", db_index=False
    )
    partition = models.ForeignKey(Partition, on_delete=models.CASCADE, related_name="leases")
    member_id = models.CharField(max_length=100, null=True, blank=True)
    generation = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "partition"], name="partitionlease_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.group.name} {self.partition} -> {self.member_id or 'nobody'}"


class GroupOffset(models.Model):
    """A group's position on one partition (per member in broadcast mode).

    committed_offset is the lowest offset not yet settled: the next offset the group reads after
    a restart. delivered_offset is the next offset never delivered; the offsets between the two
    are in flight (InFlight rows) or settled out of order.
    """

    group = models.ForeignKey(
        ConsumerGroup, on_delete=models.CASCADE, related_name="offsets", db_index=False
    )
    partition = models.ForeignKey(Partition, on_delete=models.CASCADE, related_name="group_offsets")
    # "" in clustering mode; the member id in broadcast mode, where each member has its offsets.
    subscriber = models.CharField(max_length=100, default="", blank=True)
    committed_offset = models.BigIntegerField(default=0)
    delivered_offset = models.BigIntegerField(default=0)
    # Messages the subscription filter skipped: they advance the offsets and are not lag.
    filtered_count = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["group", "partition", "subscriber"], name="groupoffset_uniq"
            )
        ]

    def __str__(self) -> str:
        who = f" ({self.subscriber})" if self.subscriber else ""
        return f"{self.group.name}{who} {self.partition} = {self.committed_offset}"


class InFlight(models.Model):
    """Delivered messages not yet settled, or waiting for their retry (docs/semantics.md).

    One row holds a run of consecutive offsets [offset, last_offset] delivered together, so a
    batch costs one row per partition, not one per message. An ack that names part of a run
    leaves the offsets between those it named as runs, an extend or a nack of a whole run (and
    the sweep of one past its deadline) keeps it, and a waiting run goes out again as one; the
    other settlements carve the offsets they name out of it as rows of their own
    (docs/architecture.md#in-flight-by-runs). Receipts are
    "<token>.<partition id>.<offset>" (hex).
    """

    class State(models.TextChoices):
        DELIVERED = "delivered"  # with a member until acked, nacked or deadline_ms passes
        RETRY_WAIT = "retry_wait"  # redelivered to the group once deadline_ms passes

    group = models.ForeignKey(
        ConsumerGroup, on_delete=models.CASCADE, related_name="in_flight", db_index=False
    )
    partition = models.ForeignKey(Partition, on_delete=models.CASCADE, related_name="in_flight")
    subscriber = models.CharField(max_length=100, default="", blank=True)
    offset = models.BigIntegerField()
    last_offset = models.BigIntegerField()
    state = models.CharField(max_length=12, choices=State.choices)
    member_id = models.CharField(max_length=100)
    # Random per delivery: a redelivery gets a new one, so a stale receipt settles nothing.
    token = models.CharField(max_length=16)
    attempt = models.PositiveIntegerField(default=1)
    deadline_ms = models.BigIntegerField()
    last_error = models.TextField(default="", blank=True)
    # A redrive's retry: delivered even past the topic's TTL, as RabbitMQ removes a dead-lettered
    # message's expiration. Always a single row (a redrive makes one per letter, and only runs
    # are carved or split), so the raw inserts of pieces leave it to the database default.
    redriven = models.BooleanField(default=False, db_default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["group", "partition", "subscriber", "offset"], name="inflight_uniq"
            )
        ]
        # The deadline sweep reads expired deliveries by (state, deadline_ms).
        indexes = [models.Index(fields=["state", "deadline_ms"], name="inflight_state_deadline")]

    def __str__(self) -> str:
        return f"{self.group.name} {self.partition}@{self.offset}..{self.last_offset}"


class DeadLetter(models.Model):
    """A message a group gave up on: its coordinates, why, and a copy of it (retention-proof)."""

    group = models.ForeignKey(
        ConsumerGroup, on_delete=models.CASCADE, related_name="dead_letters", db_index=False
    )
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="dead_letters")
    subscriber = models.CharField(max_length=100, default="", blank=True)
    partition_number = models.PositiveIntegerField()
    offset = models.BigIntegerField()
    reason = models.CharField(max_length=20)  # max_attempts | rejected | expired | removed
    attempts = models.PositiveIntegerField()
    last_error = models.TextField(default="", blank=True)
    dead_ms = models.BigIntegerField()
    timestamp_ms = models.BigIntegerField()
    key = models.CharField(max_length=1024, null=True, blank=True)
    tag = models.CharField(max_length=200, null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    value = models.BinaryField()
    is_json = models.BooleanField(default=True)
    client_id = models.CharField(max_length=200, null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["group", "id"], name="deadletter_group_id_idx")]

    def __str__(self) -> str:
        return f"{self.group.name} {self.topic.name}[{self.partition_number}]@{self.offset}"


class TraceEvent(models.Model):
    """One step in a message's life (produced, delivered, acked, retried, dead-lettered, ...)."""

    # No index of its own: trace_message_idx leads with it, and with stale statistics
    # PostgreSQL read all of a topic's events through this one to find a message's (0014).
    topic = models.ForeignKey(
        Topic, on_delete=models.CASCADE, related_name="trace_events", db_index=False
    )
    partition_number = models.PositiveIntegerField()
    offset = models.BigIntegerField()
    at_ms = models.BigIntegerField(db_index=True)
    event = models.CharField(max_length=20)
    group = models.CharField(max_length=200, default="", blank=True)
    member_id = models.CharField(max_length=100, default="", blank=True)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["topic", "partition_number", "offset"], name="trace_message_idx")
        ]

    def __str__(self) -> str:
        return f"{self.topic.name}[{self.partition_number}]@{self.offset} {self.event}"


class ApiKey(models.Model):
    name = models.CharField(max_length=200, unique=True)
    # SHA-256 of the secret: keys are 256-bit random, so a slow hash would add nothing.
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    # [{"action": "produce" | "consume" | "admin", "pattern": "orders.*"}, ...]
    permissions = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Who made it: "user:<username>" from the dashboard, "console", or "key:<name>" over REST.
    created_by = models.CharField(max_length=200, default="", blank=True)
    # Written at most every few seconds from memory (keys.note_used), never on the hot path.
    last_used_ms = models.BigIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class AuditEntry(models.Model):
    """One action that changed data, from the dashboard, REST or the console: who, what, result."""

    at_ms = models.BigIntegerField(db_index=True)
    # "user:<username>" (dashboard), "key:<name>" (REST) or "console" (management command).
    actor = models.CharField(max_length=200)
    source = models.CharField(max_length=20)  # dashboard | api | console
    action = models.CharField(max_length=60)  # e.g. topic.create, group.reset, dlq.redrive
    target = models.CharField(max_length=400, default="", blank=True)
    params = models.JSONField(default=dict, blank=True)
    # "ok", or the BrokerError code that refused it.
    outcome = models.CharField(max_length=60)
    result = models.JSONField(default=dict, blank=True)
    client_ip = models.CharField(max_length=64, default="", blank=True)
    user_agent = models.CharField(max_length=300, default="", blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["action", "at_ms"], name="audit_action_at_idx"),
            models.Index(fields=["actor", "at_ms"], name="audit_actor_at_idx"),
        ]
        # The console's two roles (docs/console-ui.md): view every page, operate (change data).
        permissions = [
            ("view_console", "Can view the Ferry console"),
            ("operate_console", "Can change data from the Ferry console"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.target}"


class TopicSample(models.Model):
    """A topic's size at one moment, for the console's charts (core/history.py)."""

    topic = models.ForeignKey(
        Topic, on_delete=models.CASCADE, related_name="samples", db_index=False
    )
    at_ms = models.BigIntegerField()
    # Seconds this sample stands for: the sampling interval, or more once downsampled.
    resolution_s = models.PositiveIntegerField()
    # Sum over partitions of the end offset: every message ever appended (the "in" counter).
    end_offset_total = models.BigIntegerField()
    message_count = models.BigIntegerField()
    bytes_stored = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["topic", "at_ms"], name="topicsample_topic_at_idx")]

    def __str__(self) -> str:
        return f"{self.topic.name}@{self.at_ms}"


class GroupSample(models.Model):
    """A group's position on a topic at one moment, for lag history (core/history.py)."""

    group = models.ForeignKey(
        ConsumerGroup, on_delete=models.CASCADE, related_name="samples", db_index=False
    )
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="group_samples")
    at_ms = models.BigIntegerField()
    resolution_s = models.PositiveIntegerField()
    # Sums over partitions (the "out" counter and the total lag).
    committed_total = models.BigIntegerField()
    lag = models.BigIntegerField()
    in_flight = models.BigIntegerField()
    # Age of the oldest message the group has not consumed, over its partitions; null: none.
    oldest_age_ms = models.BigIntegerField(null=True, blank=True)
    # Per partition: {"<n>": [committed, end, lag, oldest_age_ms or null]}.
    partitions = models.JSONField(default=dict)

    class Meta:
        indexes = [
            models.Index(fields=["group", "topic", "at_ms"], name="groupsample_g_t_at_idx"),
            models.Index(fields=["at_ms"], name="groupsample_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.group.name}/{self.topic.name}@{self.at_ms}"


class BrokerProcess(models.Model):
    """A broker process (server or worker) and its last heartbeat, for the overview."""

    name = models.CharField(max_length=200, unique=True)  # host:pid
    kind = models.CharField(max_length=20)  # server | worker
    version = models.CharField(max_length=40)
    started_ms = models.BigIntegerField()
    heartbeat_ms = models.BigIntegerField(db_index=True)

    def __str__(self) -> str:
        return self.name


class JobRun(models.Model):
    """A background job's last runs by any process (core/processes.record_job_run)."""

    name = models.CharField(max_length=100, unique=True)  # core/periodic.py's job name
    ok_ms = models.BigIntegerField(null=True)
    ok_by = models.CharField(max_length=200, default="")  # host:pid
    failed_ms = models.BigIntegerField(null=True)
    error = models.TextField(default="")

    def __str__(self) -> str:
        return self.name


class RedriveJob(models.Model):
    """A throttled redrive of dead letters in the background, with its progress."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    group = models.ForeignKey(ConsumerGroup, on_delete=models.CASCADE, related_name="redrives")
    # What it redrives: the chosen ids, or every dead letter matching topic and reason.
    ids = models.JSONField(null=True, blank=True)
    topic_name = models.CharField(max_length=200, null=True, blank=True)
    reason = models.CharField(max_length=20, null=True, blank=True)
    rate_per_second = models.PositiveIntegerField()
    total = models.PositiveIntegerField()
    done = models.PositiveIntegerField(default=0)
    missing = models.PositiveIntegerField(default=0)
    # The highest dead-letter id handled: the job resumes after it.
    cursor_id = models.BigIntegerField(default=0)
    state = models.CharField(max_length=12, choices=State.choices, default=State.QUEUED)
    error = models.TextField(default="", blank=True)
    created_by = models.CharField(max_length=200)
    created_ms = models.BigIntegerField()
    updated_ms = models.BigIntegerField()
    finished_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "id"], name="redrivejob_state_idx")]

    def __str__(self) -> str:
        return f"redrive {self.id} of {self.group.name}"


class TransactionProducer(models.Model):
    """A transactional producer id and its epoch: a newer begin fences the older transaction."""

    producer_id = models.CharField(max_length=200, unique=True)
    epoch = models.BigIntegerField(default=0)
    # The actor (keys.actor_name) that first used the id; other keys may not (but admin:*).
    owner = models.CharField(max_length=200)
    updated_ms = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.producer_id}@{self.epoch}"


class Transaction(models.Model):
    """A transaction's half messages, offsets and acks wait in the staged tables until it ends.

    docs/transactions.md. Outbox transactions (kind "outbox") are written in the caller's own
    database transaction in state "prepared" and appended by outbox.promote or the sweeper.
    """

    class State(models.TextChoices):
        OPEN = "open"
        PREPARED = "prepared"  # outbox: the caller's transaction committed; appending follows
        COMMITTED = "committed"
        ROLLED_BACK = "rolled_back"

    class Kind(models.TextChoices):
        PRODUCER = "producer"
        OUTBOX = "outbox"

    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.PRODUCER)
    producer_id = models.CharField(max_length=200, default="", blank=True)
    epoch = models.BigIntegerField(default=0)
    owner = models.CharField(max_length=200, default="", blank=True)
    owner_key_id = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=12, choices=State.choices, default=State.OPEN)
    # Why it ended this way: "fenced", "timeout", "check_back", "check_back_unknown", ...
    reason = models.CharField(max_length=40, default="", blank=True)
    timeout_ms = models.BigIntegerField(default=0)
    check_url = models.CharField(max_length=2000, default="", blank=True)
    created_ms = models.BigIntegerField()
    deadline_ms = models.BigIntegerField()
    ended_ms = models.BigIntegerField(null=True, blank=True)
    # Staged counts, kept with the staged rows (a deleted topic's half messages show up here).
    message_count = models.PositiveIntegerField(default=0)
    offset_count = models.PositiveIntegerField(default=0)
    ack_count = models.PositiveIntegerField(default=0)
    # Check-back: how many were made, when the next is due, who holds it until when, the last.
    checks = models.PositiveIntegerField(default=0)
    next_check_ms = models.BigIntegerField(null=True, blank=True)
    checking_until_ms = models.BigIntegerField(null=True, blank=True)
    last_check = models.CharField(max_length=500, default="", blank=True)

    class Meta:
        indexes = [
            # The check job finds open transactions past their deadline, prepared ones, and
            # ended ones to purge.
            models.Index(fields=["state", "deadline_ms"], name="transaction_state_deadline"),
            models.Index(fields=["producer_id", "state"], name="transaction_producer_state"),
        ]

    def __str__(self) -> str:
        return f"transaction {self.id} ({self.state})"


class StagedMessage(models.Model):
    """A half message: stored with its transaction, read by no fetch, poll or push until commit."""

    transaction = models.ForeignKey(
        Transaction, on_delete=models.CASCADE, related_name="staged", db_index=False
    )
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="staged")
    partition_number = models.PositiveIntegerField(null=True, blank=True)
    key = models.CharField(max_length=1024, null=True, blank=True)
    tag = models.CharField(max_length=200, null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    value = models.BinaryField()
    is_json = models.BooleanField(default=True)
    client_id = models.CharField(max_length=200, null=True, blank=True)
    delay_ms = models.BigIntegerField(null=True, blank=True)
    deliver_at_ms = models.BigIntegerField(null=True, blank=True)
    delay_level = models.IntegerField(null=True, blank=True)
    timestamp_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["transaction", "id"], name="staged_transaction_id_idx")]

    def __str__(self) -> str:
        return f"staged {self.id} of transaction {self.transaction_id}"


class StagedOffset(models.Model):
    """A group offset commit carried by a transaction; the last one per partition wins."""

    transaction = models.ForeignKey(
        Transaction, on_delete=models.CASCADE, related_name="staged_offsets", db_index=False
    )
    group_name = models.CharField(max_length=200)
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="staged_offsets")
    partition_number = models.PositiveIntegerField()
    offset = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["transaction", "group_name", "topic", "partition_number"],
                name="stagedoffset_uniq",
            )
        ]

    def __str__(self) -> str:
        return f"{self.group_name} {self.topic_id}[{self.partition_number}] = {self.offset}"


class StagedAck(models.Model):
    """An ack of a delivered message carried by a transaction."""

    transaction = models.ForeignKey(
        Transaction, on_delete=models.CASCADE, related_name="staged_acks", db_index=False
    )
    group_name = models.CharField(max_length=200)
    receipt = models.CharField(max_length=40)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["transaction", "group_name", "receipt"], name="stagedack_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.group_name} {self.receipt}"
