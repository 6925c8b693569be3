"""Transactions: `with producer.transaction(): ...`, and the check-back helper.

See docs/transactions.md. A Transaction sends half messages (and a consumer's acks or a group's
offsets) with its transaction id; leaving the `with` block commits, an exception rolls back.
`LocalTransactions` is RocketMQ's local-transaction-with-check-back pattern: it begins a
transaction with a check_url, runs the application's local transaction, and commits or rolls
back by its outcome; when the outcome never reached the broker (a crash), the broker asks the
application's check-back handler, which `check_back_app` (WSGI) or `CheckBackServer` serves.
"""

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ferry_client import errors, transport
from ferry_client.records import Delivery, Message, SendResult, Value

ANSWERS = ("commit", "rollback", "unknown")


@dataclass(frozen=True)
class TransactionInfo:
    """A transaction as the broker reports it (GET /transactions/{id})."""

    id: int
    producer_id: str
    epoch: int
    state: str
    reason: str
    messages: int
    raw: Mapping[str, Any]

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> "TransactionInfo":
        return cls(
            id=body["id"],
            producer_id=body["producer_id"],
            epoch=body["epoch"],
            state=body["state"],
            reason=body["reason"],
            messages=body["messages"],
            raw=dict(body),
        )


class _Steps:
    """What both transaction shells share: the requests, as exchanges either transport runs."""

    def __init__(self, producer_id: str, timeout_ms: int, check_url: str | None) -> None:
        self.producer_id = producer_id
        self.timeout_ms = timeout_ms
        self.check_url = check_url
        self.info: TransactionInfo | None = None
        self.results: list[SendResult] = []
        self.sent: list[tuple[str, Message]] = []
        self.ended = False

    def path(self, verb: str) -> str:
        assert self.info is not None  # noqa: S101 (every caller began first)
        return f"/transactions/{self.info.id}/{verb}"

    def begin(self, first: dict[str, Any] | None = None) -> transport.Exchange[TransactionInfo]:
        if self.info is None:
            body = yield transport.Request(
                "POST",
                "/transactions",
                json={
                    "producer_id": self.producer_id,
                    "timeout_ms": self.timeout_ms,
                    "check_url": self.check_url,
                    **(first or {}),
                },
                # A repeated begin would fence the first: send it once.
                idempotent=False,
            )
            self.info = TransactionInfo.from_wire(body)
        return self.info

    def send(self, topic: str, messages: Iterable[Message | Value]) -> transport.Exchange[None]:
        prepared = [(m if isinstance(m, Message) else Message(m)).with_id() for m in messages]
        if not prepared:
            return
        body = {"topic": topic, "messages": [m.to_wire() for m in prepared]}
        if self.info is None:
            yield from self.begin(body)
        else:
            # Retrying an add is safe: the ids make a repeated message one message at commit.
            yield transport.Request("POST", self.path("messages"), json=body)
        self.sent += [(topic, m) for m in prepared]

    def carry(self, verb: str, body: dict[str, Any]) -> transport.Exchange[None]:
        yield from self.begin()
        yield transport.Request("POST", self.path(verb), json=body)

    def commit(self) -> transport.Exchange[list[SendResult]]:
        if self.info is None:
            self.ended = True  # nothing was sent: nothing to commit
            return []
        body = yield transport.Request("POST", self.path("commit"))
        self.ended = True
        self.info = TransactionInfo.from_wire(body)
        results = body.get("results") or []
        if len(results) == len(self.sent):
            self.results = [
                SendResult.from_wire(topic, message, result)
                for (topic, message), result in zip(self.sent, results, strict=True)
            ]
        return self.results

    def rollback(self) -> transport.Exchange[None]:
        if self.info is None:
            self.ended = True
            return
        body = yield transport.Request("POST", self.path("rollback"))
        self.ended = True
        self.info = TransactionInfo.from_wire(body)


def _acks(group: str, receipts: Sequence[str]) -> dict[str, Any]:
    return {"group": group, "receipts": list(receipts)}


def _offsets(group: str, topic: str, offsets: Mapping[int, int]) -> dict[str, Any]:
    return {
        "group": group,
        "topic": topic,
        "offsets": [{"partition": p, "offset": o} for p, o in sorted(offsets.items())],
    }


class Transaction:
    """A transaction: send, ack, commit_offsets, then commit or rollback (once).

    It begins on the broker with its first call (the first send carries its messages in the
    begin request: one round trip fewer), and that begin fences the producer id's older one.
    """

    def __init__(
        self,
        client: transport.Transport,
        producer_id: str,
        timeout_ms: int,
        check_url: str | None,
    ) -> None:
        self._transport = client
        self._steps = _Steps(producer_id, timeout_ms, check_url)

    @property
    def info(self) -> TransactionInfo | None:
        return self._steps.info

    @property
    def results(self) -> list[SendResult]:
        return self._steps.results

    @property
    def ended(self) -> bool:
        return self._steps.ended

    @property
    def id(self) -> int:
        """The transaction's id (begins it on the broker if nothing was sent yet)."""
        return self._transport.run(self._steps.begin()).id

    def send(
        self,
        topic: str,
        value: Value,
        *,
        key: str | None = None,
        tag: str | None = None,
        headers: Mapping[str, str] | None = None,
        partition: int | None = None,
        id: str | None = None,
    ) -> None:
        """Add one half message: stored now, visible when the transaction commits."""
        message = Message(value, key, tag, dict(headers or {}), partition, id)
        self.send_batch(topic, [message])

    def send_batch(self, topic: str, messages: Iterable[Message | Value]) -> None:
        """Add half messages to one topic in one call (each gets a client id first)."""
        self._transport.run(self._steps.send(topic, messages))

    def ack(self, group: str, receipts: Sequence[str]) -> None:
        """Carry acks of deliveries (a consumer's receipts): settled when this commits."""
        self._transport.run(self._steps.carry("acks", _acks(group, receipts)))

    def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Carry a group's offset commit (partition -> next offset): applied when this commits."""
        self._transport.run(self._steps.carry("offsets", _offsets(group, topic, offsets)))

    def commit(self) -> list[SendResult]:
        """Make everything visible at once; returns where each message went, in send order."""
        return self._transport.run(self._steps.commit())

    def rollback(self) -> None:
        """Discard everything this transaction carries."""
        self._transport.run(self._steps.rollback())

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.ended:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()


class AsyncTransaction:
    """Transaction for asyncio (AsyncProducer.transaction): `async with`, awaited calls."""

    def __init__(
        self,
        client: transport.AsyncTransport,
        producer_id: str,
        timeout_ms: int,
        check_url: str | None,
    ) -> None:
        self._transport = client
        self._steps = _Steps(producer_id, timeout_ms, check_url)

    @property
    def info(self) -> TransactionInfo | None:
        return self._steps.info

    @property
    def results(self) -> list[SendResult]:
        return self._steps.results

    async def begin(self) -> int:
        """Begin it on the broker now (else its first call does); returns its id."""
        return (await self._transport.run(self._steps.begin())).id

    async def send(
        self,
        topic: str,
        value: Value,
        *,
        key: str | None = None,
        tag: str | None = None,
        headers: Mapping[str, str] | None = None,
        partition: int | None = None,
        id: str | None = None,
    ) -> None:
        message = Message(value, key, tag, dict(headers or {}), partition, id)
        await self.send_batch(topic, [message])

    async def send_batch(self, topic: str, messages: Iterable[Message | Value]) -> None:
        await self._transport.run(self._steps.send(topic, messages))

    async def ack(self, group: str, receipts: Sequence[str]) -> None:
        await self._transport.run(self._steps.carry("acks", _acks(group, receipts)))

    async def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        await self._transport.run(self._steps.carry("offsets", _offsets(group, topic, offsets)))

    async def commit(self) -> list[SendResult]:
        return await self._transport.run(self._steps.commit())

    async def rollback(self) -> None:
        await self._transport.run(self._steps.rollback())

    async def __aenter__(self) -> "AsyncTransaction":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._steps.ended:
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()


def begin(
    client: transport.Transport,
    producer_id: str | None = None,
    *,
    timeout_ms: int = 60_000,
    check_url: str | None = None,
) -> Transaction:
    """A transaction for producer_id (default: a random one); it begins with its first call."""
    return Transaction(client, producer_id or random_producer_id(), timeout_ms, check_url)


def random_producer_id() -> str:
    return f"ferry-client-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class CheckRequest:
    """What the broker asks the check-back handler about a transaction past its timeout."""

    transaction_id: int
    producer_id: str
    epoch: int
    checks: int
    messages: int


Check = Callable[[CheckRequest], str]


def answer(check: Check, body: bytes) -> dict[str, str]:
    """The handler's answer to one check-back body: {"status": commit | rollback | unknown}."""
    try:
        asked = json.loads(body)
        request = CheckRequest(
            transaction_id=int(asked["transaction_id"]),
            producer_id=str(asked["producer_id"]),
            epoch=int(asked["epoch"]),
            checks=int(asked.get("checks", 1)),
            messages=int(asked.get("messages", 0)),
        )
        decided = check(request)
    except Exception:
        # Anything that goes wrong answers unknown: the broker asks again later.
        decided = "unknown"
    return {"status": decided if decided in ANSWERS else "unknown"}


def check_back_app(check: Check) -> Callable[..., Iterator[bytes]]:
    """A WSGI app answering the broker's check-backs with check(request); mount it anywhere."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(min(length, 65536)) if length else b""
        out = json.dumps(answer(check, body)).encode()
        start_response(
            "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))]
        )
        yield out

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class CheckBackServer:
    """check_back_app served from a thread (`with CheckBackServer(check) as server:`).

    `url` is what to pass as check_url; it listens on host (default loopback) and port (0: any).
    """

    def __init__(self, check: Check, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server: WSGIServer = make_server(
            host, port, check_back_app(check), handler_class=_QuietHandler
        )
        self.url = f"http://{host}:{self._server.server_port}/"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ferry-check-back", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> "CheckBackServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalTransactions:
    """RocketMQ's transactional producer: half messages, the local transaction, check-back.

    `run(messages, local)` begins a transaction with this check_url, adds the messages, runs
    `local()` (the application's own database transaction) and commits when it returns, rolls
    back when it raises. If the process dies in between, the broker calls the check-back
    handler, which must answer from the application's own state (did the local transaction
    commit?): serve `check_back_app(check)` at check_url.
    """

    def __init__(
        self,
        client: transport.Transport,
        producer_id: str,
        check_url: str,
        *,
        timeout_ms: int = 60_000,
    ) -> None:
        self._transport = client
        self.producer_id = producer_id
        self.check_url = check_url
        self.timeout_ms = timeout_ms

    def run(
        self, topic: str, messages: Iterable[Message | Value], local: Callable[[int], object]
    ) -> list[SendResult]:
        """Half messages to topic, then local(transaction_id); commit after it, else roll back.

        local gets the transaction id to store with its own rows, so the check-back handler
        can tell whether they committed.
        """
        txn = begin(
            self._transport,
            self.producer_id,
            timeout_ms=self.timeout_ms,
            check_url=self.check_url,
        )
        txn.send_batch(topic, messages)
        with txn:
            local(txn.id)
        return txn.results


class ReadProcessWrite(transport.Closing):
    """Exactly-once read-process-write: a group member whose every batch is one transaction.

    `process(handler)` polls a batch of deliveries as member `member_id` of `group` on `topic`,
    runs `handler(deliveries, txn)` (which sends its output with `txn.send`), and commits the
    output together with the deliveries' acks. A handler exception rolls back: the batch is
    delivered again after its ack deadline. A commit refused as `transaction_aborted` (the
    deliveries went stale meanwhile) wrote and acked nothing: process() answers 0 and the work
    is redone from the next poll. The producer id defaults to the member id, so a restarted
    instance fences its previous life's transaction.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str,
        *,
        group: str,
        topic: str,
        member_id: str,
        producer_id: str | None = None,
        timeout_ms: int = 60_000,
        max_wait_ms: int = 1000,
        verify: transport.Verify = True,
    ) -> None:
        self._transport = transport.Transport(urls, api_key, verify=verify)
        self.group, self.topic, self.member_id = group, topic, member_id
        self.producer_id = producer_id or member_id
        self.timeout_ms = timeout_ms
        self.max_wait_ms = max_wait_ms
        self._transport.request(
            "POST", f"/groups/{group}/members", json={"topic": topic, "member_id": member_id}
        )

    def process(
        self, handler: Callable[[list[Delivery], Transaction], object], max_messages: int = 100
    ) -> int:
        """One batch, one transaction; returns how many deliveries it settled (0: none)."""
        body = self._transport.request(
            "POST",
            f"/groups/{self.group}/poll",
            json={
                "topic": self.topic,
                "member_id": self.member_id,
                "max_messages": max_messages,
                "max_wait_ms": self.max_wait_ms,
            },
            idempotent=False,
        )
        deliveries = [Delivery.from_wire(self.topic, m) for m in body["messages"]]
        if not deliveries:
            return 0
        txn = begin(self._transport, self.producer_id, timeout_ms=self.timeout_ms)
        try:
            handler(deliveries, txn)
            txn.ack(self.group, [d.receipt for d in deliveries])
        except BaseException:
            txn.rollback()
            raise
        try:
            txn.commit()
        except errors.FerryError as refused:
            if refused.code != "transaction_aborted":
                raise
            return 0
        return len(deliveries)

    def close(self) -> None:
        try:
            self._transport.request("DELETE", f"/groups/{self.group}/members/{self.member_id}")
        except errors.FerryError:
            pass  # already expired: nothing to leave
        finally:
            self._transport.close()
