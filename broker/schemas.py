"""Request and response shapes of the REST API (docs/api.md); no rules live here."""

import base64
import binascii
from typing import Annotated, Any, Literal, NotRequired

import orjson
from ninja import Schema
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    StrictInt,
    StringConstraints,
    model_validator,
)
from typing_extensions import TypedDict

from broker.core.records import NewMessage

Overflow = Literal["reject", "drop_oldest"]
DeadLetterReason = Literal["max_attempts", "rejected", "expired", "removed"]


class ErrorBody(Schema):
    code: str
    message: str
    detail: dict[str, Any] = {}


class ErrorOut(Schema):
    error: ErrorBody


class HealthOut(Schema):
    status: str
    database: str
    redis: str


class In(Schema):
    """Request bodies refuse unknown fields: a misspelt option must not be silently dropped.

    Strict: a boolean is not an integer (true is not 1), nor a number a boolean or a string.
    """

    model_config = ConfigDict(extra="forbid", strict=True)


# Every integer a request takes is bounded by the column that stores it (PostgreSQL integer or
# bigint), so an absurd one is a 422, never an overflow in the database. The ranges that mean
# something are the core's to check.
Int32 = Annotated[StrictInt, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
# A duration in ms: wide, but now_ms() plus it still fits 64 bits.
DurationMs = Annotated[StrictInt, Field(ge=-(2**53), le=2**53)]


class TopicIn(In):
    name: str = Field(examples=["orders"])
    partitions: Int32 | None = Field(None, description="Default FERRY_DEFAULT_PARTITIONS (1).")
    retention_ms: DurationMs | None = None
    retention_bytes: Int64 | None = None
    max_message_bytes: Int32 | None = None
    capacity: Int64 | None = Field(None, description="Maximum messages kept per partition.")
    overflow_policy: Overflow = "reject"
    message_ttl_ms: DurationMs | None = Field(
        None, description="Messages older than this are dead-lettered instead of delivered."
    )
    trace: bool = Field(False, description="Record every message's delivery events.")


class TopicPatch(In):
    """Fields to change; a field left out keeps its value, null clears a limit."""

    partitions: Int32 | None = None
    retention_ms: DurationMs | None = None
    retention_bytes: Int64 | None = None
    max_message_bytes: Int32 | None = None
    capacity: Int64 | None = None
    overflow_policy: Overflow | None = None
    message_ttl_ms: DurationMs | None = None
    trace: bool | None = None


class PartitionOut(Schema):
    partition: int
    start_offset: int
    end_offset: int
    message_count: int = Field(0, description="Stored now: end_offset - start_offset.")
    bytes_stored: int = Field(0, description="Size of the stored messages (key, value, headers).")


class TopicOut(Schema):
    name: str
    partitions: int
    retention_ms: int | None
    retention_bytes: int | None
    max_message_bytes: int
    capacity: int | None
    overflow_policy: str
    message_ttl_ms: int | None
    trace: bool
    created_at_ms: int
    partition_offsets: list[PartitionOut]
    message_count: int = Field(0, description="Total over the partitions.")
    bytes_stored: int = Field(0, description="Total over the partitions.")


class PurgeTopicIn(In):
    # JSON object keys are strings: the partition numbers alone are parsed from them.
    up_to: dict[Annotated[Int32, Strict(False)], Int64] | None = Field(
        None,
        examples=[{"0": 10}],
        description="Per partition, remove the messages below this offset; left out: all.",
    )


class PurgeTopicOut(Schema):
    removed: int
    partition_offsets: list[PartitionOut]


class MessageIn(TypedDict):
    """One message: exactly one of value (any JSON) or value_b64 (raw bytes, base64).

    At most one of delay_ms, deliver_at_ms and level makes it a delayed message (docs/api.md).
    """

    # A TypedDict, not a model: validating a thousand plain dicts costs a fifth of building a
    # thousand model instances, on the produce hot path (docs/benchmarks.md).
    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # type: ignore[misc]

    value: NotRequired[Any]
    value_b64: NotRequired[str | None]
    key: NotRequired[Annotated[str, StringConstraints(max_length=1024)] | None]
    tag: NotRequired[Annotated[str, StringConstraints(max_length=200)] | None]
    headers: NotRequired[dict[str, str]]
    partition: NotRequired[Int32 | None]
    id: NotRequired[Annotated[str, StringConstraints(min_length=1, max_length=200)] | None]
    delay_ms: NotRequired[Int64 | None]
    deliver_at_ms: NotRequired[Int64 | None]
    level: NotRequired[Int64 | None]
    timestamp_ms: NotRequired[Int64 | None]


def new_messages(messages: list[MessageIn]) -> list[NewMessage]:
    """Request messages as the core's: exactly one of value/value_b64, base64 decoded once."""
    converted = []
    for index, m in enumerate(messages):
        value_b64 = m.get("value_b64")
        if ("value" in m) == (value_b64 is not None):
            raise ValueError(f"messages.{index}: give exactly one of value or value_b64")
        if value_b64 is None:
            try:
                value, is_json = orjson.dumps(m["value"]), True
            except orjson.JSONEncodeError as exc:
                # Nested deeper than the encoder goes (254 levels), or not JSON at all.
                raise ValueError(f"messages.{index}: value cannot be stored: {exc}") from None
        else:
            try:
                value, is_json = base64.b64decode(value_b64, validate=True), False
            except binascii.Error as exc:
                raise ValueError(f"messages.{index}: value_b64 is not base64: {exc}") from None
        converted.append(
            NewMessage(
                value,
                is_json,
                m.get("key"),
                m.get("tag"),
                m.get("headers") or {},
                m.get("partition"),
                m.get("id"),
                m.get("delay_ms"),
                m.get("deliver_at_ms"),
                m.get("level"),
                m.get("timestamp_ms"),
            )
        )
    return converted


class ProduceIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    messages: list[MessageIn] = Field(min_length=1)
    _new_messages: list[NewMessage] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def one_value_each(self) -> "ProduceIn":
        """One pass over the batch: exactly one of value/value_b64, base64 decoded once."""
        self._new_messages = new_messages(self.messages)
        return self

    def to_new_messages(self) -> list[NewMessage]:
        return self._new_messages


class AppendOut(Schema):
    """A stored message has partition and offset; a delayed one scheduled_id and deliver_at_ms.

    A delayed message whose id was already released answers its partition and offset.
    """

    partition: int | None = None
    offset: int | None = None
    duplicate: bool
    scheduled_id: int | None = None
    deliver_at_ms: int | None = None


class ProduceOut(Schema):
    results: list[AppendOut]


class MessageOut(Schema):
    """A stored message; it carries value (JSON) or value_b64 (bytes), never both."""

    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    tag: str | None
    headers: dict[str, str]
    value: Any = None
    value_b64: str | None = None
    id: str | None = None


class ScheduledOut(Schema):
    """A delayed message not released yet: id is the scheduled id, message_id the client's id."""

    id: int
    topic: str
    deliver_at_ms: int
    partition: int | None
    key: str | None
    tag: str | None
    headers: dict[str, str]
    value: Any = None
    value_b64: str | None = None
    message_id: str | None = None


class ScheduledPageOut(Schema):
    scheduled: list[ScheduledOut]
    next_after: int | None = Field(description="The last id on this page: pass it as after.")


class FetchOut(Schema):
    messages: list[MessageOut]
    next_offset: int
    start_offset: int
    end_offset: int


class OffsetOut(Schema):
    partition: int
    start_offset: int
    end_offset: int
    offset_for_timestamp: int | None = None


class OffsetsOut(Schema):
    topic: str
    partitions: list[OffsetOut]


class PollIn(In):
    topic: str
    max_messages: Int32 = 100
    max_wait_ms: Int32 = 0
    auto_commit: bool = Field(
        False,
        description="Settle the messages as they are handed out (at most once). Without a "
        "member_id: move the group's offsets past them.",
    )
    member_id: str | None = Field(
        None,
        description="Poll as this member: its partitions (or all, in broadcast mode), its "
        "filter, receipts to ack; counts as a heartbeat.",
    )


class HeaderConditionIn(In):
    """A header condition: name and exactly one of eq, in, exists (the core checks which)."""

    name: str
    eq: str | None = None
    # "in" is a Python keyword: the field goes by its JSON name only through the alias.
    in_: list[str] | None = Field(None, alias="in")
    exists: bool | None = None


class FilterIn(In):
    """A subscription filter: RocketMQ's tag expression and header conditions, all must hold."""

    tags: str | None = Field(None, examples=["created || paid"], description='"*": every tag.')
    headers: list[HeaderConditionIn] | None = None

    def to_spec(self) -> dict[str, Any]:
        """The filter as the client wrote it, which is how the core stores and echoes it."""
        return self.model_dump(exclude_unset=True, by_alias=True)


class JoinIn(In):
    topic: str
    member_id: str | None = Field(
        None, description="Rejoin under this id; left out, the broker makes one up."
    )
    filter: FilterIn | None = Field(
        None, description="Deliver only matching messages to this member; a rejoin replaces it."
    )
    start: Literal["earliest", "latest", "timestamp"] = Field(
        "earliest",
        description="Where the group (broadcast: this member) starts on partitions where it "
        "has no position yet; an existing position is kept.",
    )
    start_timestamp_ms: Int64 | None = Field(None, description="With start: timestamp.")
    client: str | None = Field(
        None,
        max_length=100,
        description="This consumer's name for itself (Kafka's client.id), shown beside the "
        "member in GET /groups/{group} and the console.",
    )

    def filter_spec(self) -> dict[str, Any] | None:
        return self.filter.to_spec() if self.filter is not None else None


class MemberOut(Schema):
    """A member's view of the group: its partitions in the current generation."""

    group: str
    member_id: str
    topic: str
    generation: int
    partitions: list[int]
    session_timeout_ms: int
    heartbeat_interval_ms: int
    mode: str
    filter: dict[str, Any] | None


class PartitionOffsetIn(In):
    partition: Int32
    offset: Int64


class PartitionOffsetOut(Schema):
    partition: int
    offset: int


class PolledMessageOut(MessageOut):
    receipt: str | None = Field(
        None, description="Names this delivery in ack, nack, reject and extend (member polls)."
    )
    attempt: int | None = Field(None, description="1 on first delivery, then one per redelivery.")
    deadline_ms: int | None = Field(None, description="Redelivered if not settled by then.")


class PollOut(Schema):
    group: str
    topic: str
    messages: list[PolledMessageOut]
    next_offsets: list[PartitionOffsetOut]
    committed: bool
    member_id: str | None = None
    generation: int | None = None
    filtered: int = Field(0, description="Messages the member's filter skipped in this poll.")
    expired: int = Field(0, description="Messages past the topic's TTL, dead-lettered instead.")


class CommitIn(In):
    topic: str
    offsets: list[PartitionOffsetIn] = Field(min_length=1)
    member_id: str | None = Field(
        None, description="Commit as this member: only partitions it holds (fenced)."
    )
    generation: Int64 | None = Field(
        None, description="The generation the member last saw; refused if the group moved on."
    )


class GroupPatch(In):
    """Group settings to change; a field left out keeps its value."""

    strategy: Literal["range", "round_robin", "sticky"] | None = None
    session_timeout_ms: Int32 | None = None
    mode: Literal["clustering", "broadcast"] | None = Field(
        None, description="Changes only while the group has no members."
    )
    ordered: bool | None = None
    ack_deadline_ms: Int32 | None = None
    max_attempts: Int32 | None = None
    retry_delays_ms: list[Int32] | None = Field(
        None, description="The backoff per retry; [] means RocketMQ's levels."
    )


class ResetIn(In):
    """Where to move the group's committed offsets on topic (Kafka's --reset-offsets)."""

    topic: str
    to: Literal["earliest", "latest", "timestamp", "offsets", "shift"]
    timestamp_ms: Int64 | None = None
    offsets: list[PartitionOffsetIn] | None = None
    shift_by: Int64 | None = Field(
        None, description='With to "shift": move each committed offset by this (negative replays).'
    )
    force: bool = False
    dry_run: bool = Field(False, description="Answer what would move, and move nothing.")


class ResetPreviewRowOut(Schema):
    partition: int
    current: int = Field(description="The committed offset now.")
    target: int = Field(description="The committed offset after the reset.")
    delta: int = Field(description="target - current: negative replays, positive skips.")


class ResetPreviewOut(Schema):
    group: str
    topic: str
    dry_run: bool
    partitions: list[ResetPreviewRowOut]


class PartitionLagOut(Schema):
    partition: int
    committed_offset: int
    start_offset: int
    end_offset: int
    lag: int
    in_flight: int = Field(description="Delivered to a member and not settled yet.")
    retry_waiting: int = Field(0, description="Nacked or past their deadline, waiting to retry.")
    filtered: int = Field(description="Messages the subscription filter skipped, all time.")
    skipped_by_retention: int = Field(
        0,
        description="Messages retention removed before the group settled them (start_offset "
        "less the group's stored committed offset); the group reads on from start_offset.",
    )


class GroupTopicOut(Schema):
    group: str
    topic: str
    member: str | None = Field(
        description="Broadcast mode: the member these offsets are its own; else null."
    )
    capacity: int | None
    max_offset: int = Field(
        description="Deprecated, one partition's figure: the highest end_offset - 1 (-1: empty)."
    )
    committed_offset: int = Field(description="Deprecated name of committed_total.")
    end_offset: int = Field(description="Deprecated name of end_total.")
    end_total: int = Field(0, description="Total over partitions of end_offset.")
    committed_total: int = Field(0, description="Total over partitions of committed_offset.")
    lag: int = Field(description="Total over partitions of lag.")
    in_flight: int = Field(0, description="Total over partitions of in_flight.")
    retry_waiting: int = Field(0, description="Total over partitions of retry_waiting.")
    partitions: list[PartitionLagOut]


class GroupMemberOut(Schema):
    member_id: str
    topic: str
    partitions: list[int]
    joined_ms: int
    heartbeat_ms: int
    filter: dict[str, Any] | None
    client: str = Field(description="What the consumer calls itself (join's client), or empty.")
    host: str = Field(description='Where it joined from: "rest 10.0.0.7", "websocket 10.0.0.7".')


class GroupSettingsOut(Schema):
    mode: str
    ordered: bool
    ack_deadline_ms: int
    max_attempts: int
    retry_delays_ms: list[int] = Field(description="[]: RocketMQ's levels, 10s to 2h.")
    session_timeout_ms: int = Field(description="A member silent this long expires.")


class GroupOut(Schema):
    name: str
    created_at_ms: int
    generation: int
    strategy: str
    topics: list[GroupTopicOut]
    members: list[GroupMemberOut]
    settings: GroupSettingsOut
    dead_letters: int = Field(description="Letters in the group's dead-letter queue.")


class OverviewOut(Schema):
    topics: list[TopicOut]
    groups: list[GroupTopicOut]
    next_topics_after: str | None = Field(
        None, description="With limit: pass as topics_after for the next page; null: no more."
    )
    next_groups_after: str | None = Field(
        None, description="With limit: pass as groups_after for the next page; null: no more."
    )


# Acknowledged delivery: settle what a member poll handed out, by receipt.

# <token: 16 hex>.<partition id: hex>.<offset: hex>, as core/delivery/inflight.py makes them;
# each number fits 63 bits, and the whole is at most 40 characters.
RECEIPT_PATTERN = (
    r"^[0-9a-f]{16}\.(?:[0-7][0-9a-f]{15}|[0-9a-f]{1,15})\.(?:[0-7][0-9a-f]{15}|[0-9a-f]{1,15})$"
)
Receipt = Annotated[
    str,
    StringConstraints(max_length=40, pattern=RECEIPT_PATTERN),
    Field(examples=["9d2e4f6a8b0c1d3e.2a.1f4"]),
]
Receipts = Annotated[
    list[Receipt],
    Field(min_length=1, description="Receipts from a member poll (at most max_messages)."),
]


class AckIn(In):
    receipts: Receipts


class NackIn(In):
    receipts: Receipts
    error: str = Field("", description="Why it failed; kept with the retry and the dead letter.")
    delay_ms: DurationMs | None = Field(
        None, description="Redeliver after this long; left out, the group's backoff."
    )


class RejectIn(In):
    receipts: Receipts
    error: str = ""


class ExtendIn(In):
    receipts: Receipts
    extend_ms: DurationMs = Field(description="The new deadline is now + extend_ms.")


class SettleOut(Schema):
    settled: int = Field(description="Receipts that named a delivery in flight.")
    stale: list[str] = Field(
        description="Receipts naming no delivery in flight: settled already, or redelivered "
        "under a new receipt (for extend, also those waiting for a retry)."
    )
    dead_lettered: int


class DeadLetterOut(Schema):
    id: int
    group: str
    topic: str
    member: str | None = Field(description="Broadcast mode: the member it failed for.")
    partition: int
    offset: int
    reason: str = Field(description="max_attempts, rejected, expired or removed.")
    attempts: int
    last_error: str
    dead_ms: int
    message: MessageOut


class DeadLetterPageOut(Schema):
    items: list[DeadLetterOut]
    total: int = Field(description="Letters matching the filters, on every page.")
    next_after_id: int | None = Field(description="Pass as after_id for the next page.")


DeadLetterId = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]


class DeadLetterSelectionIn(In):
    """Which dead letters: exactly one of ids, or all (that match topic and reason)."""

    ids: list[DeadLetterId] | None = Field(None, min_length=1)
    all: bool = False
    topic: str | None = None
    reason: DeadLetterReason | None = None

    @model_validator(mode="after")
    def ids_or_all(self) -> "DeadLetterSelectionIn":
        # A selection that forgot its ids must not widen to the whole queue.
        if (self.ids is not None) == self.all:
            raise ValueError('give exactly one of ids or "all": true')
        return self


class RedriveOut(Schema):
    redriven: int
    missing: list[int] = Field(
        description="Letters whose message retention already removed: left in the queue."
    )


class PurgeOut(Schema):
    purged: int


# Redrive jobs (core/redrives.py): a redrive in the background, throttled, with progress.


class RedriveJobIn(DeadLetterSelectionIn):
    rate_per_second: StrictInt = Field(
        500,
        ge=1,
        le=2**31 - 1,
        description="Letters per second at most (capped by FERRY_MAX_REDRIVE_RATE_PER_SECOND).",
    )
    dry_run: bool = Field(False, description="Only count the letters the job would take.")


class RedriveCountOut(Schema):
    count: int


class RedriveJobOut(Schema):
    id: int
    group: str
    topic: str | None
    reason: str | None
    ids_count: int | None = Field(
        description="Letters named by id; null for a selection by filter."
    )
    rate_per_second: int
    total: int = Field(description="Letters selected when the job started.")
    done: int = Field(description="Letters redriven so far.")
    missing: int = Field(
        description="Letters whose message is gone (left in the queue, or purged)."
    )
    state: str = Field(description="queued, running, done, failed or cancelled.")
    error: str
    progress: float = Field(description="(done + missing) / total, 0 to 1.")
    created_by: str
    created_ms: int
    updated_ms: int
    finished_ms: int | None


class TraceEventOut(Schema):
    at_ms: int
    event: str
    group: str | None
    member_id: str | None
    attempt: int | None
    detail: dict[str, Any]


class TraceOut(Schema):
    topic: str
    partition: int
    offset: int
    events: list[TraceEventOut]


class BrowsedMessageOut(MessageOut):
    size_bytes: int


class MessageLookupOut(Schema):
    messages: list[BrowsedMessageOut]
    indexed: bool = Field(description="An index answered (key, id); nothing was scanned.")
    scanned: int = Field(description="Messages a scan read (0 when indexed).")
    complete: bool = Field(description="Every stored message was considered.")


class ApiKeyIn(In):
    name: str = Field(min_length=1, max_length=200)
    permissions: list[str] = Field(min_length=1, examples=[["produce:orders.*"]])


class ApiKeyOut(Schema):
    name: str
    prefix: str
    permissions: list[str]
    created_at_ms: int
    created_by: str
    last_used_ms: int | None
    revoked: bool


class ApiKeyCreatedOut(ApiKeyOut):
    secret: str = Field(description="Shown once: send as Authorization: Bearer <secret>.")


class RescheduleIn(In):
    deliver_at_ms: StrictInt = Field(
        ge=0, le=2**63 - 1, description="The new due time, ms since 1970."
    )


class AuditEntryOut(Schema):
    id: int
    at_ms: int
    actor: str
    source: str
    action: str
    target: str
    params: dict[str, Any]
    outcome: str
    result: dict[str, Any]
    client_ip: str
    user_agent: str


class AuditPageOut(Schema):
    items: list[AuditEntryOut]
    next_before_id: int | None = Field(description="Pass as before_id for older entries.")


class TopicPointOut(Schema):
    at_ms: int
    end_offset_total: int = Field(description="Messages ever appended: the sum of end offsets.")
    message_count: int
    bytes_stored: int
    in_per_s: float | None = Field(description="Appended per second since the sample before.")
    resolution_s: int = Field(description="Seconds this sample stands for (downsampled: more).")


class TopicHistoryOut(Schema):
    topic: str
    points: list[TopicPointOut]


class GroupPointOut(Schema):
    at_ms: int
    topic: str
    lag: int = Field(description="Messages after the committed offsets, summed over partitions.")
    committed_total: int
    out_per_s: float | None = Field(description="Committed per second since the sample before.")
    oldest_age_ms: int | None = Field(
        description="Age of the oldest message not yet consumed (the consume delay); null: none."
    )
    in_flight: int
    resolution_s: int


class GroupHistoryOut(Schema):
    group: str
    points: list[GroupPointOut]


# Transactions (docs/transactions.md).


class TransactionIn(In):
    producer_id: str = Field(
        examples=["order-service"],
        description="Names the producer: a newer begin for it fences its open transaction.",
    )
    timeout_ms: DurationMs = Field(
        description="After this the transaction is checked back (check_url) or rolled back."
    )
    check_url: str | None = Field(
        None,
        description="POSTed to when the transaction times out: answer commit/rollback/unknown.",
    )
    topic: str | None = Field(None, description="With messages: the first add, in the begin.")
    messages: list[MessageIn] | None = Field(
        None, description="The first half messages (produce's shape), added with the begin."
    )
    _new_messages: list[NewMessage] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def one_value_each(self) -> "TransactionIn":
        self._new_messages = new_messages(self.messages or [])
        return self

    def to_new_messages(self) -> list[NewMessage]:
        return self._new_messages


class TransactionMessagesIn(ProduceIn):
    """Half messages for one topic, in produce's message shape; any number of calls and topics."""

    topic: str


class TransactionOffsetsIn(In):
    group: str
    topic: str
    offsets: list[PartitionOffsetIn] = Field(min_length=1)


class TransactionAcksIn(In):
    group: str
    receipts: Receipts


class TransactionOut(Schema):
    id: int
    kind: str = Field(description="producer, or outbox (published from inside the project)")
    producer_id: str
    epoch: int
    state: str = Field(description="open, prepared (outbox), committed or rolled_back")
    reason: str = Field(description="Why it ended so: producer, operator, fenced, timeout, …")
    owner: str
    timeout_ms: int
    check_url: str | None
    created_ms: int
    deadline_ms: int
    ended_ms: int | None
    messages: int
    offsets: int
    acks: int
    topics: list[str]
    checks: int
    next_check_ms: int | None
    last_check: str


class TransactionResultOut(Schema):
    topic: str
    partition: int | None = None
    offset: int | None = None
    duplicate: bool
    scheduled_id: int | None = None
    deliver_at_ms: int | None = None


class TransactionCommitOut(TransactionOut):
    results: list[TransactionResultOut] = Field(
        description="Where each message went, in the order added (empty on a repeated commit)."
    )
