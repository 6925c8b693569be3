"""Request and response shapes of the REST API (docs/api.md); no rules live here."""

import base64
import binascii
from typing import Any, Literal

import orjson
from ninja import Schema
from pydantic import Field, model_validator

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


class TopicIn(Schema):
    name: str = Field(examples=["orders"])
    partitions: int = Field(1, ge=1)
    retention_ms: int | None = Field(None, ge=1)
    retention_bytes: int | None = Field(None, ge=1)
    max_message_bytes: int | None = Field(None, ge=1)
    capacity: int | None = Field(None, ge=1, description="Maximum messages kept per partition.")
    overflow_policy: Overflow = "reject"


class TopicPatch(Schema):
    """Fields to change; a field left out keeps its value, null clears a limit."""

    partitions: int | None = Field(None, ge=1)
    retention_ms: int | None = Field(None, ge=1)
    retention_bytes: int | None = Field(None, ge=1)
    max_message_bytes: int | None = Field(None, ge=1)
    capacity: int | None = Field(None, ge=1)
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


class MessageIn(Schema):
    """One message: exactly one of value (any JSON) or value_b64 (raw bytes, base64)."""

    value: Any = None
    value_b64: str | None = None
    key: str | None = Field(None, max_length=1024)
    tag: str | None = Field(None, max_length=200)
    headers: dict[str, str] = {}
    partition: int | None = Field(None, ge=0)
    id: str | None = Field(None, min_length=1, max_length=200, description="Client message id.")

    @model_validator(mode="after")
    def one_value(self) -> "MessageIn":
        has_value = "value" in self.model_fields_set
        has_b64 = self.value_b64 is not None
        if has_value == has_b64:
            raise ValueError("give exactly one of value or value_b64")
        if has_b64:
            try:
                base64.b64decode(self.value_b64 or "", validate=True)
            except binascii.Error as exc:
                raise ValueError(f"value_b64 is not valid base64: {exc}") from None
        return self

    def to_new_message(self) -> NewMessage:
        if self.value_b64 is not None:
            value, is_json = base64.b64decode(self.value_b64), False
        else:
            value, is_json = orjson.dumps(self.value), True
        return NewMessage(
            value=value,
            is_json=is_json,
            key=self.key,
            tag=self.tag,
            headers=self.headers,
            partition=self.partition,
            client_id=self.id,
        )


class ProduceIn(Schema):
    messages: list[MessageIn] = Field(min_length=1)


class AppendOut(Schema):
    partition: int
    offset: int
    duplicate: bool


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


class PollIn(Schema):
    topic: str
    max_messages: int = Field(100, ge=1)
    max_wait_ms: int = Field(0, ge=0)
    auto_commit: bool = False


class PartitionOffsetIn(Schema):
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)


class PartitionOffsetOut(Schema):
    partition: int
    offset: int


class PollOut(Schema):
    group: str
    topic: str
    messages: list[MessageOut]
    next_offsets: list[PartitionOffsetOut]
    committed: bool


class CommitIn(Schema):
    topic: str
    offsets: list[PartitionOffsetIn] = Field(min_length=1)


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


class GroupOut(Schema):
    name: str
    created_at_ms: int
    topics: list[GroupTopicOut]


class OverviewOut(Schema):
    topics: list[TopicOut]
    groups: list[GroupTopicOut]
