"""Broker tables, one model per DESIGN.md concept; the rules live in broker/core/."""

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
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Partition(models.Model):
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="partitions")
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
        return f"{self.topic_id}/{self.number}"


class Message(models.Model):
    partition = models.ForeignKey(Partition, on_delete=models.CASCADE, related_name="messages")
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
            models.Index(fields=["partition", "timestamp_ms"], name="message_partition_ts_idx")
        ]

    def __str__(self) -> str:
        return f"{self.partition_id}@{self.offset}"


class ProducedId(models.Model):
    """A client message id seen on a topic within the dedup window, and where it was stored."""

    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="produced_ids")
    client_id = models.CharField(max_length=200)
    partition_number = models.PositiveIntegerField()
    offset = models.BigIntegerField()
    created_ms = models.BigIntegerField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["topic", "client_id"], name="producedid_topic_id_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.topic_id}:{self.client_id}"


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
        constraints = [
            models.UniqueConstraint(
                fields=["topic", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="scheduled_topic_client_id_uniq",
            )
        ]

    def __str__(self) -> str:
        return f"{self.topic_id}@{self.due_ms}"


class ConsumerGroup(models.Model):
    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # How partitions are spread over members: broker/core/assignment.py.
    strategy = models.CharField(max_length=20, default="sticky")
    # Bumped by every rebalance; a member's view of its partitions carries it.
    generation = models.BigIntegerField(default=0)
    session_timeout_ms = models.PositiveIntegerField(default=45_000)

    def __str__(self) -> str:
        return self.name


class GroupMember(models.Model):
    """A live consumer of a group on a topic; it expires when silent past the session timeout."""

    group = models.ForeignKey(ConsumerGroup, on_delete=models.CASCADE, related_name="members")
    member_id = models.CharField(max_length=100)
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="members")
    joined_ms = models.BigIntegerField()
    heartbeat_ms = models.BigIntegerField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "member_id"], name="groupmember_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.group_id}:{self.member_id}"


class PartitionLease(models.Model):
    """Which member of a group holds a partition: one row per (group, partition), so one holder."""

    group = models.ForeignKey(ConsumerGroup, on_delete=models.CASCADE, related_name="leases")
    partition = models.ForeignKey(Partition, on_delete=models.CASCADE, related_name="leases")
    member_id = models.CharField(max_length=100, null=True, blank=True)
    generation = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "partition"], name="partitionlease_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.group_id}:{self.partition_id}->{self.member_id}"


class GroupOffset(models.Model):
    """The committed offset of a group on one partition: the next offset the group will read."""

    group = models.ForeignKey(ConsumerGroup, on_delete=models.CASCADE, related_name="offsets")
    partition = models.ForeignKey(Partition, on_delete=models.CASCADE, related_name="group_offsets")
    committed_offset = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "partition"], name="groupoffset_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.group_id}:{self.partition_id}={self.committed_offset}"


class ApiKey(models.Model):
    name = models.CharField(max_length=200, unique=True)
    # SHA-256 of the secret: keys are 256-bit random, so a slow hash would add nothing.
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    # [{"action": "produce" | "consume" | "admin", "pattern": "orders.*"}, ...]
    permissions = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name
