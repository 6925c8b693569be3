"""What the client sends and gets back: messages, send results, deliveries (docs/client.md)."""

import base64
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# The JSON value of a message, or raw bytes (sent as value_b64).
Value = Any


def new_id() -> str:
    """A new id: for client message ids (a message sent twice under one id is stored once)
    and member ids chosen by the client.

    32 hex digits as a uuid4's, but UUIDv7's order: the time in milliseconds, then 80 random
    bits. The broker keeps every message id in two indexes for the dedup window; ids that grow
    with time are added at their end instead of anywhere (docs/benchmarks.md, session 41).
    """
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


@dataclass(frozen=True)
class Message:
    """A message to send: any JSON value, or bytes; the fields are those of docs/api.md.

    At most one of delay_ms, deliver_at_ms and level makes it a delayed message. Without an
    `id`, the producer gives it a new one before the first attempt, so retries are idempotent.
    """

    value: Value
    key: str | None = None
    tag: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    partition: int | None = None
    id: str | None = None
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    level: int | None = None

    def with_id(self) -> "Message":
        return self if self.id is not None else replace(self, id=new_id())

    def to_wire(self) -> dict[str, Any]:
        """The produce body's message: only the fields that are set."""
        out: dict[str, Any] = {}
        if isinstance(self.value, bytes | bytearray | memoryview):
            out["value_b64"] = base64.b64encode(bytes(self.value)).decode()
        else:
            out["value"] = self.value
        optional = {
            "key": self.key,
            "tag": self.tag,
            "partition": self.partition,
            "id": self.id,
            "delay_ms": self.delay_ms,
            "deliver_at_ms": self.deliver_at_ms,
            "level": self.level,
        }
        out.update({name: value for name, value in optional.items() if value is not None})
        if self.headers:
            out["headers"] = dict(self.headers)
        return out


@dataclass(frozen=True)
class SendResult:
    """Where a sent message is: its partition and offset, or, delayed, its scheduled id.

    `duplicate` is true when the broker already had a message with this id (a retry): the
    coordinates are the original's and nothing new was stored.
    """

    topic: str
    id: str | None
    partition: int | None
    offset: int | None
    duplicate: bool
    scheduled_id: int | None = None
    deliver_at_ms: int | None = None

    @property
    def scheduled(self) -> bool:
        """Delayed: stored now, appended to its topic at deliver_at_ms."""
        return self.partition is None

    @classmethod
    def from_wire(cls, topic: str, message: Message, result: Mapping[str, Any]) -> "SendResult":
        return cls(
            topic=topic,
            id=message.id,
            partition=result.get("partition"),
            offset=result.get("offset"),
            duplicate=bool(result.get("duplicate")),
            scheduled_id=result.get("scheduled_id"),
            deliver_at_ms=result.get("deliver_at_ms"),
        )


@dataclass(frozen=True)
class Delivery:
    """A message handed to this consumer, with the receipt that settles it.

    `value` is the JSON value, or bytes for a message produced as bytes. `attempt` is 1 on the
    first delivery and grows with each redelivery.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    tag: str | None
    headers: Mapping[str, str]
    id: str | None
    value: Value
    receipt: str
    attempt: int
    deadline_ms: int | None

    @classmethod
    def from_wire(cls, topic: str, item: Mapping[str, Any]) -> "Delivery":
        """A delivered message as a member poll or a `messages` frame has it."""
        if "value_b64" in item and item["value_b64"] is not None:
            value: Value = base64.b64decode(item["value_b64"])
        else:
            value = item.get("value")
        return cls(
            topic=topic,
            partition=item["partition"],
            offset=item["offset"],
            timestamp_ms=item["timestamp_ms"],
            key=item.get("key"),
            tag=item.get("tag"),
            headers=item.get("headers") or {},
            id=item.get("id"),
            value=value,
            receipt=item.get("receipt") or "",
            attempt=item.get("attempt") or 1,
            deadline_ms=item.get("deadline_ms"),
        )


@dataclass(frozen=True)
class Subscription:
    """What a consumer subscribes to: the subscribe frame's (or the join request's) fields."""

    group: str
    topic: str
    prefetch: int
    filter: dict[str, Any] | None
    start: str
    member_id: str | None
    # What this consumer calls itself (Kafka's client.id), shown with the member in the console.
    client: str = ""


def default_client_name() -> str:
    """The default client name, "ferry_client <host>:<pid>": which process a member is."""
    return f"ferry_client {socket.gethostname()}:{os.getpid()}"[:100]


# Send hooks (RocketMQ's SendMessageHook): called around every request.
BeforeSend = Callable[[str, Sequence[Message]], None]
AfterSend = Callable[[str, Sequence[Message], "Sequence[SendResult] | BaseException"], None]


@dataclass(frozen=True)
class SendHooks:
    """Callables run around each produce request (one batch), on the sending thread or task.

    `before_send(topic, messages)` runs once before the first attempt; `after_send(topic,
    messages, outcome)` once after the last, with the results or the exception the send
    raises. A hook that raises is logged and ignored: a hook never loses a message.
    """

    before_send: BeforeSend | None = None
    after_send: AfterSend | None = None
