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
    StringConstraints,
    model_validator,
)
from typing_extensions import TypedDict

from broker.core.records import NewMessage

Overflow = Literal["reject", "drop_oldest"]


class ErrorBody(Schema):
    code: str
    message: str
    detail: dict[str, Any] = {}


class ErrorOut(Schema):
    error: ErrorBody


class HealthOut(Schema):
    status: str
    database: str


class In(Schema):
    """Request bodies refuse unknown fields: a misspelt option must not be silently dropped."""

    model_config = ConfigDict(extra="forbid")


class TopicIn(In):
    name: str = Field(examples=["orders"])
    partitions: int | None = Field(None, description="Default FERRY_DEFAULT_PARTITIONS (1).")
    retention_ms: int | None = None
    retention_bytes: int | None = None
    max_message_bytes: int | None = None
    capacity: int | None = Field(None, description="Maximum messages kept per partition.")
    overflow_policy: Overflow = "reject"


class TopicPatch(In):
    """Fields to change; a field left out keeps its value, null clears a limit."""

    partitions: int | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    max_message_bytes: int | None = None
    capacity: int | None = None
    overflow_policy: Overflow | None = None


class PartitionOut(Schema):
    partition: int
    start_offset: int
    end_offset: int


class TopicOut(Schema):
    name: str
    partitions: int
    retention_ms: int | None
    retention_bytes: int | None
    max_message_bytes: int
    capacity: int | None
    overflow_policy: str
    created_at_ms: int
    partition_offsets: list[PartitionOut]


# A 64-bit integer, what the database column holds: a past deliver_at_ms is stored as given, so
# a wider one would overflow there. The ranges that mean something are the core's to check.
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class MessageIn(TypedDict):
    """One message: exactly one of value (any JSON) or value_b64 (raw bytes, base64).

    At most one of delay_ms, deliver_at_ms and level makes it a delayed message (docs/api.md).
    """

    # A TypedDict, not a model: validating a thousand plain dicts costs a fifth of building a
    # thousand model instances, on the produce hot path (docs/benchmarks.md).
    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    value: NotRequired[Any]
    value_b64: NotRequired[str | None]
    key: NotRequired[Annotated[str, StringConstraints(max_length=1024)] | None]
    tag: NotRequired[Annotated[str, StringConstraints(max_length=200)] | None]
    headers: NotRequired[dict[str, str]]
    partition: NotRequired[int | None]
    id: NotRequired[Annotated[str, StringConstraints(min_length=1, max_length=200)] | None]
    delay_ms: NotRequired[Int64 | None]
    deliver_at_ms: NotRequired[Int64 | None]
    level: NotRequired[Int64 | None]


class ProduceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[MessageIn] = Field(min_length=1)
    _new_messages: list[NewMessage] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def one_value_each(self) -> "ProduceIn":
        """One pass over the batch: exactly one of value/value_b64, base64 decoded once."""
        converted = []
        for index, m in enumerate(self.messages):
            value_b64 = m.get("value_b64")
            if ("value" in m) == (value_b64 is not None):
                raise ValueError(f"messages.{index}: give exactly one of value or value_b64")
            if value_b64 is None:
                value, is_json = orjson.dumps(m["value"]), True
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
                )
            )
        self._new_messages = converted
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
    max_messages: int = 100
    max_wait_ms: int = 0
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


class JoinIn(In):
    topic: str
    member_id: str | None = Field(
        None, description="Rejoin under this id; left out, the broker makes one up."
    )


class MemberOut(Schema):
    """A member's view of the group: its partitions in the current generation."""

    group: str
    member_id: str
    topic: str
    generation: int
    partitions: list[int]
    session_timeout_ms: int
    heartbeat_interval_ms: int


class PartitionOffsetIn(In):
    partition: int
    offset: int


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


class GroupPatch(In):
    """Group settings to change; a field left out keeps its value."""

    strategy: Literal["range", "round_robin", "sticky"] | None = None
    session_timeout_ms: int | None = None


class ResetIn(In):
    """Where to move the group's committed offsets on topic (Kafka's --reset-offsets)."""

    topic: str
    to: Literal["earliest", "latest", "timestamp", "offsets"]
    timestamp_ms: int | None = None
    offsets: list[PartitionOffsetIn] | None = None
    force: bool = False


class PartitionLagOut(Schema):
    partition: int
    committed_offset: int
    start_offset: int
    end_offset: int
    lag: int


class GroupTopicOut(Schema):
    group: str
    topic: str
    capacity: int | None
    max_offset: int
    committed_offset: int
    end_offset: int
    lag: int
    partitions: list[PartitionLagOut]


class GroupMemberOut(Schema):
    member_id: str
    topic: str
    partitions: list[int]
    joined_ms: int
    heartbeat_ms: int


class GroupOut(Schema):
    name: str
    created_at_ms: int
    generation: int
    strategy: str
    topics: list[GroupTopicOut]
    members: list[GroupMemberOut]


class OverviewOut(Schema):
    topics: list[TopicOut]
    groups: list[GroupTopicOut]
