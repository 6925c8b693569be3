"""Client frames of the WebSocket protocol under /ws/v1/ (docs/websocket.md); no rules live here."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, TypeAdapter

from broker.schemas import DurationMs, FilterIn, Int64, MessageIn, ProduceIn, Receipt

SubId = Annotated[str, Field(min_length=1, max_length=100)]
Receipts = Annotated[list[Receipt], Field(min_length=1, max_length=10_000)]
# A ref is echoed as given: a string or an integer (not a boolean), bounded like one.
Ref = StrictStr | Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | None


class Frame(BaseModel):
    # A misspelt field must not be silently dropped; true is not 1 (strict, as REST bodies).
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    ref: Ref = None


class AuthFrame(Frame):
    type: Literal["auth"]
    token: str


class SubscribeFrame(Frame):
    type: Literal["subscribe"]
    sub: SubId
    topic: str
    group: str
    member_id: str | None = None
    filter: FilterIn | None = None
    prefetch: StrictInt = Field(100, ge=1, le=10_000)
    # Where to begin where the group (broadcast: the member) has no position yet.
    start: Literal["committed", "earliest", "latest", "timestamp"] = Field(
        "committed", alias="from"
    )
    timestamp_ms: Int64 | None = None
    # This consumer's name for itself (Kafka's client.id), shown with the member.
    client: str | None = Field(None, max_length=100)


class UnsubscribeFrame(Frame):
    type: Literal["unsubscribe"]
    sub: SubId


class AckFrame(Frame):
    type: Literal["ack"]
    sub: SubId
    receipts: Receipts


class NackFrame(Frame):
    type: Literal["nack"]
    sub: SubId
    receipts: Receipts
    error: str = ""
    delay_ms: DurationMs | None = None


class RejectFrame(Frame):
    type: Literal["reject"]
    sub: SubId
    receipts: Receipts
    error: str = ""


class ExtendFrame(Frame):
    type: Literal["extend"]
    sub: SubId
    receipts: Receipts
    extend_ms: DurationMs


class CreditFrame(Frame):
    type: Literal["credit"]
    sub: SubId
    n: StrictInt = Field(ge=1, le=1_000_000)


class PublishFrame(ProduceIn):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["publish"]
    ref: Ref = None
    topic: str


class PingFrame(Frame):
    type: Literal["ping"]


# Transactions (docs/websocket.md#transactions): the REST endpoints' bodies, as frames.
TransactionId = Annotated[StrictInt, Field(ge=1, le=2**63 - 1)]


class BeginFrame(Frame):
    type: Literal["begin"]
    producer_id: str
    timeout_ms: DurationMs
    check_url: str | None = None
    # Optional: the first add, made with the begin (REST's POST /transactions takes them too).
    topic: str | None = None
    messages: list[MessageIn] | None = None


class AddFrame(ProduceIn):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["add"]
    ref: Ref = None
    transaction: TransactionId
    topic: str


class CommitFrame(Frame):
    type: Literal["commit"]
    transaction: TransactionId


class RollbackFrame(Frame):
    type: Literal["rollback"]
    transaction: TransactionId


ClientFrame = Annotated[
    AuthFrame
    | SubscribeFrame
    | UnsubscribeFrame
    | AckFrame
    | NackFrame
    | RejectFrame
    | ExtendFrame
    | CreditFrame
    | PublishFrame
    | PingFrame
    | BeginFrame
    | AddFrame
    | CommitFrame
    | RollbackFrame,
    Field(discriminator="type"),
]
client_frame = TypeAdapter(ClientFrame)
TYPES = frozenset(
    {"auth", "subscribe", "unsubscribe", "ack", "nack", "reject", "extend", "credit", "publish"}
    | {"ping"}
    | {"begin", "add", "commit", "rollback"}
)
