"""Frozen records the core returns instead of model instances (docs/architecture.md#records)."""

from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson


@dataclass(frozen=True)
class Permission:
    action: str  # "produce" | "consume" | "admin"
    pattern: str  # a glob over topic names, e.g. "orders.*"

    def __str__(self) -> str:
        return f"{self.action}:{self.pattern}"


@dataclass(frozen=True)
class Principal:
    """Who is calling: an API key, or the console (management commands, embedded jobs)."""

    name: str
    permissions: tuple[Permission, ...] = ()
    is_system: bool = False
    key_id: int | None = None


@dataclass(frozen=True)
class ApiKeyInfo:
    id: int
    name: str
    prefix: str
    permissions: tuple[Permission, ...]
    created_at_ms: int
    revoked: bool
    # "user:<username>", "key:<name>" or "console"; "" for keys made before it was recorded.
    created_by: str = ""
    # When the key last authenticated, to within the flush interval (keys.flush_last_used).
    last_used_ms: int | None = None


@dataclass(frozen=True)
class PartitionInfo:
    number: int
    start_offset: int
    end_offset: int
    # Sum of the stored messages' size_bytes (key, value and headers; docs/semantics.md).
    bytes_stored: int = 0

    @property
    def message_count(self) -> int:
        return self.end_offset - self.start_offset


@dataclass(frozen=True)
class TopicInfo:
    id: int
    name: str
    partition_count: int
    retention_ms: int | None
    retention_bytes: int | None
    max_message_bytes: int
    capacity: int | None
    overflow_policy: str
    created_at_ms: int
    partitions: tuple[PartitionInfo, ...] = ()
    message_ttl_ms: int | None = None
    trace: bool = False

    @property
    def bytes_stored(self) -> int:
        """Total over the partitions."""
        return sum(p.bytes_stored for p in self.partitions)

    @property
    def message_count(self) -> int:
        """Messages stored now, total over the partitions (end minus start offsets)."""
        return sum(p.message_count for p in self.partitions)


@dataclass(frozen=True)
class PurgeTopicResult:
    """What purge_topic removed, and the partitions after it."""

    removed: int
    partitions: tuple[PartitionInfo, ...]


# The three per-message records are NamedTuples, immutable like the dataclasses here but built
# several times faster: a batch makes thousands of them on the produce and fetch hot paths.


class NewMessage(NamedTuple):
    """A message to append, already validated for shape by the edge."""

    value: bytes
    is_json: bool = True
    key: str | None = None
    tag: str | None = None
    headers: dict[str, str] = {}  # shared default: the core never mutates headers
    partition: int | None = None
    client_id: str | None = None
    # At most one of these makes the message delayed (docs/semantics.md#delayed-messages).
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    delay_level: int | None = None
    # The producer's timestamp (Kafka's CreateTime); None: the broker's clock at append.
    timestamp_ms: int | None = None

    @property
    def is_delayed(self) -> bool:
        return (
            self.delay_ms is not None
            or self.deliver_at_ms is not None
            or self.delay_level is not None
        )


class AppendResult(NamedTuple):
    """Where a message went: a partition and offset, or (delayed) a scheduled id and due time."""

    partition: int | None
    offset: int | None
    duplicate: bool
    scheduled_id: int | None = None
    deliver_at_ms: int | None = None


@dataclass(frozen=True)
class ScheduledInfo:
    id: int
    topic: str
    deliver_at_ms: int
    partition: int | None
    key: str | None
    tag: str | None
    headers: dict[str, str]
    value: bytes
    is_json: bool
    client_id: str | None
    created_ms: int


class StoredMessage(NamedTuple):
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    tag: str | None
    # The stored JSON text: edges send it on as is; .headers parses it.
    headers_json: str
    value: bytes
    is_json: bool
    client_id: str | None

    @property
    def headers(self) -> dict[str, str]:
        parsed: dict[str, str] = orjson.loads(self.headers_json)
        return parsed


@dataclass(frozen=True)
class FetchResult:
    topic_id: int
    partition: int
    messages: tuple[StoredMessage, ...]
    next_offset: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True)
class OffsetLookup:
    partition: int
    start_offset: int
    end_offset: int
    # The earliest offset with timestamp_ms >= the asked timestamp (end_offset if none), or None.
    offset_for_timestamp: int | None


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    committed_offset: int
    start_offset: int
    end_offset: int
    # Delivered to a member and not settled yet (acknowledged delivery only).
    in_flight: int = 0
    # Messages the subscription filter skipped on this partition, all time.
    filtered: int = 0
    # Nacked or past their deadline, waiting for their retry (acknowledged delivery only).
    retry_waiting: int = 0
    # Messages retention removed before the group settled them: its committed offset was behind
    # the start offset, and it reads on from there (DESIGN.md: Retention). Until it commits past.
    skipped_by_retention: int = 0

    @property
    def lag(self) -> int:
        return max(0, self.end_offset - max(self.committed_offset, self.start_offset))


@dataclass(frozen=True)
class GroupTopicOffsets:
    group: str
    topic: str
    capacity: int | None
    partitions: tuple[PartitionLag, ...]
    # The member whose own offsets these are in broadcast mode; "" for the group's (clustering).
    subscriber: str = ""

    # Every figure below but max_offset is a total: a sum over the partitions.

    @property
    def max_offset(self) -> int:
        """Deprecated: one partition's figure (the highest end_offset - 1; -1 when empty).

        Kept for seed 000's maxIndex and REST compatibility; use end_total beside the totals.
        """
        return max((p.end_offset for p in self.partitions), default=0) - 1

    @property
    def committed_total(self) -> int:
        return sum(p.committed_offset for p in self.partitions)

    @property
    def end_total(self) -> int:
        return sum(p.end_offset for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def in_flight(self) -> int:
        return sum(p.in_flight for p in self.partitions)

    @property
    def retry_waiting(self) -> int:
        return sum(p.retry_waiting for p in self.partitions)

    @property
    def skipped_by_retention(self) -> int:
        return sum(p.skipped_by_retention for p in self.partitions)


@dataclass(frozen=True)
class ResetPreviewRow:
    """What reset_offsets would do to one partition: current and target committed offsets."""

    partition: int
    current: int
    target: int
    # target - current: negative replays messages, positive skips them.
    delta: int


@dataclass(frozen=True)
class MemberSummary:
    member_id: str
    topic: str
    partitions: tuple[int, ...]
    joined_ms: int
    heartbeat_ms: int
    filter: dict[str, Any] | None = None
    client: str = ""
    host: str = ""


@dataclass(frozen=True)
class MemberInfo:
    """What a member is told on join and heartbeat: its partitions in the current generation."""

    group: str
    member_id: str
    topic: str
    generation: int
    partitions: tuple[int, ...]
    session_timeout_ms: int
    heartbeat_interval_ms: int
    mode: str = "clustering"
    filter: dict[str, Any] | None = None
    topic_id: int = 0


@dataclass(frozen=True)
class GroupSettings:
    """How a group delivers: docs/semantics.md#acknowledgements."""

    mode: str = "clustering"
    ordered: bool = False
    ack_deadline_ms: int = 30_000
    max_attempts: int = 16
    retry_delays_ms: tuple[int, ...] = ()
    # A member silent this long expires (its partitions go to the others).
    session_timeout_ms: int = 45_000


@dataclass(frozen=True)
class GroupTopicTotals:
    """A group's totals over a topic's partitions, summed in SQL (the console's lists)."""

    group: str
    topic: str
    subscriber: str
    committed_total: int
    end_total: int
    lag: int
    in_flight: int
    retry_waiting: int


@dataclass(frozen=True)
class GroupInfo:
    name: str
    created_at_ms: int
    topics: tuple[GroupTopicOffsets, ...]
    generation: int = 0
    strategy: str = "sticky"
    members: tuple[MemberSummary, ...] = ()
    settings: GroupSettings = GroupSettings()
    dead_letters: int = 0


@dataclass(frozen=True)
class PollResult:
    topic_id: int
    group: str
    topic: str
    messages: tuple[StoredMessage, ...]
    # Per partition, the offset after the last returned message: what to commit to move past them.
    next_offsets: dict[int, int]
    committed: bool
    # Messages past the topic's TTL this poll dead-lettered (reason expired) instead.
    expired: int = 0


@dataclass(frozen=True)
class TopicDeletion:
    """A topic marked for deletion: its name, since when, and its messages (still) stored."""

    name: str
    since_ms: int
    messages: int


@dataclass(frozen=True)
class Overview:
    topics: tuple[TopicInfo, ...]
    groups: tuple[GroupTopicOffsets, ...]
    # Where the next pages start (topics_after, groups_after); None: this was the last page.
    next_topics_after: str | None = None
    next_groups_after: str | None = None


class Delivery(NamedTuple):
    """A message handed to a member: settle it with its receipt before deadline_ms."""

    message: StoredMessage
    receipt: str
    attempt: int
    deadline_ms: int


@dataclass(frozen=True)
class DeliveryResult:
    topic_id: int
    group: str
    topic: str
    member_id: str
    generation: int
    deliveries: tuple[Delivery, ...]
    # Messages the member's filter skipped in this poll (they advance the offsets).
    filtered: int = 0
    # Messages past the topic's message TTL, dead-lettered instead of delivered.
    expired: int = 0
    # An ordered group has a message in flight on a partition this member reads: settling it
    # lets that partition's next message go, so the delivery may not have taken all there is.
    held_back: bool = False


@dataclass(frozen=True)
class SettleResult:
    """What an ack, nack, reject or extend did: receipts that matched, and those that did not."""

    settled: int
    # Receipts naming no current delivery: settled already, or redelivered under a new receipt.
    stale: tuple[str, ...] = ()
    dead_lettered: int = 0


@dataclass(frozen=True)
class AckAndDelivery:
    """What delivery.ack_and_deliver did: the ack, then the delivery of the credit it freed.

    delivered is None when no delivery was tried (no credit) or the member could not take one
    (gone, or its key lost the topic): the caller's push task finds out why.
    """

    acked: SettleResult
    delivered: DeliveryResult | None = None


@dataclass(frozen=True)
class DeadLetterInfo:
    id: int
    group: str
    topic: str
    subscriber: str
    partition: int
    offset: int
    reason: str
    attempts: int
    last_error: str
    dead_ms: int
    message: StoredMessage


@dataclass(frozen=True)
class DeadLetterPage:
    items: tuple[DeadLetterInfo, ...]
    total: int
    # Pass as after_id for the next page; None on the last page.
    next_after_id: int | None


@dataclass(frozen=True)
class RedriveResult:
    redriven: int
    # Dead letters whose original message retention already removed: left in the queue.
    missing: tuple[int, ...] = ()


@dataclass(frozen=True)
class TraceInfo:
    at_ms: int
    event: str
    group: str
    member_id: str
    attempt: int | None
    detail: dict[str, Any]


@dataclass(frozen=True)
class Actor:
    """Who asked for an audited action, and through which edge (core/audit.py)."""

    name: str  # "user:<username>", "key:<keyname>" or "console"
    source: str  # "dashboard" | "api" | "console"
    client_ip: str = ""
    user_agent: str = ""


@dataclass(frozen=True)
class AuditInfo:
    id: int
    at_ms: int
    actor: str
    source: str
    action: str
    target: str
    params: dict[str, Any]
    # "ok", or the code of the BrokerError that refused the action.
    outcome: str
    result: dict[str, Any]
    client_ip: str
    user_agent: str


@dataclass(frozen=True)
class AuditPage:
    items: tuple[AuditInfo, ...]
    # Pass as before_id for the next (older) page; None on the last page.
    next_before_id: int | None


@dataclass(frozen=True)
class BrowsedMessage:
    """A stored message as the message browser shows it."""

    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    tag: str | None
    headers: dict[str, str]
    value: bytes
    is_json: bool
    client_id: str | None
    size_bytes: int


@dataclass(frozen=True)
class BrowsePage:
    items: tuple[BrowsedMessage, ...]
    # Opaque cursors for browse_messages(cursor=...): the next page in this page's direction
    # (older when newest first), and the page before this one, read in the other direction.
    # None when there is nothing more that way.
    next_cursor: str | None
    prev_cursor: str | None


@dataclass(frozen=True)
class SearchResult:
    items: tuple[BrowsedMessage, ...]
    # Messages read to find these; 0 for an indexed lookup.
    scanned: int
    # Whether every stored message was considered (False: the scan stopped at scan_limit).
    complete: bool
    # Whether an index answered (key, client id) instead of a scan (tag, header).
    indexed: bool


@dataclass(frozen=True)
class TopicPoint:
    """One history sample of a topic (core/history.py); in_per_s is None for the first."""

    at_ms: int
    end_offset_total: int
    message_count: int
    bytes_stored: int
    in_per_s: float | None
    resolution_s: int = 0


@dataclass(frozen=True)
class GroupPoint:
    """One history sample of a group on a topic; sums over partitions (and broadcast members)."""

    at_ms: int
    topic: str
    lag: int
    committed_total: int
    out_per_s: float | None
    oldest_age_ms: int | None
    in_flight: int = 0
    resolution_s: int = 0


@dataclass(frozen=True)
class Rates:
    """Messages per second over the newest samples' window: in per topic, out per group/topic."""

    window_ms: int
    in_per_s: dict[str, float]
    out_per_s: dict[tuple[str, str], float]

    @property
    def in_total_per_s(self) -> float:
        return sum(self.in_per_s.values())

    @property
    def out_total_per_s(self) -> float:
        return sum(self.out_per_s.values())


@dataclass(frozen=True)
class LagEstimate:
    """How far behind a group is on a topic, and when it catches up at the current rates."""

    topic: str
    lag: int
    # Age of the oldest message the group has not consumed, at the newest sample; None: none.
    seconds_behind: float | None
    # Out rate minus in rate over the window: positive while the lag falls.
    drain_rate_per_s: float
    # None when the lag is not falling; 0.0 when there is no lag.
    time_to_drain_s: float | None
    at_ms: int


@dataclass(frozen=True)
class ProcessInfo:
    name: str  # host:pid
    kind: str  # server | worker
    version: str
    started_ms: int
    heartbeat_ms: int
    alive: bool


@dataclass(frozen=True)
class RedriveJobInfo:
    """A throttled background redrive of dead letters (core/redrives.py) and its progress."""

    id: int
    group: str
    topic_name: str | None
    reason: str | None
    # How many dead letters the job was given by id; None when it selects by topic and reason.
    ids_count: int | None
    rate_per_second: int
    total: int
    done: int
    missing: int
    state: str  # queued | running | done | failed | cancelled
    error: str
    created_by: str
    created_ms: int
    updated_ms: int
    finished_ms: int | None

    @property
    def progress(self) -> float:
        """Handled (redriven or missing) over total, 0..1; a finished job is 1."""
        if self.state == "done" or self.total <= 0:
            return 1.0 if self.state == "done" else 0.0
        return min(1.0, (self.done + self.missing) / self.total)


@dataclass(frozen=True)
class PartitionFigures:
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    bytes_stored: int


@dataclass(frozen=True)
class GroupPartitionFigures:
    """A group's position on a partition now; broadcast groups' are sums over their members."""

    group: str
    topic: str
    partition: int
    committed_offset: int
    lag: int
    in_flight: int  # delivered, not settled
    retry_waiting: int  # nacked or expired, waiting for redelivery


@dataclass(frozen=True)
class BrokerFigures:
    """Every figure /metrics exports, read at once (core/figures.py)."""

    partitions: tuple[PartitionFigures, ...]
    groups: tuple[GroupPartitionFigures, ...]
    # (group, topic) -> dead letters
    dead_letters: dict[tuple[str, str], int]
    # topic -> delayed messages not yet due
    scheduled: dict[str, int]
    # kind -> processes alive (heartbeat within 30 s)
    processes_alive: dict[str, int]


@dataclass(frozen=True)
class TransactionInfo:
    """A transaction and what it carries (docs/transactions.md)."""

    id: int
    kind: str  # "producer" | "outbox"
    producer_id: str
    epoch: int
    state: str  # "open" | "prepared" | "committed" | "rolled_back"
    reason: str
    owner: str
    timeout_ms: int
    check_url: str
    created_ms: int
    deadline_ms: int
    ended_ms: int | None
    messages: int
    offsets: int
    acks: int
    checks: int
    next_check_ms: int | None
    last_check: str
    topics: tuple[str, ...] = ()


@dataclass(frozen=True)
class TransactionResult:
    """A commit's answer: the transaction, and where each of its messages went, in add order."""

    transaction: TransactionInfo
    results: tuple[tuple[str, AppendResult], ...] = ()


@dataclass(frozen=True)
class TransactionCheck:
    """What one round of transactions.check_transactions did."""

    committed: int = 0
    rolled_back: int = 0
    checked: int = 0
    promoted: int = 0
    purged: int = 0
