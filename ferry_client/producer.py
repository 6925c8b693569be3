"""The producer: send and wait until durable, or send in the background with linger.

See docs/client.md#producing. `Producer` is for threads (a linger thread sends the background
batches); producer_async.py has the asyncio twin. Both are shells over what is written once
here: the messages (`new_message`, `as_message`), the request and its hooks (`Sender.exchange`,
run by either transport), the futures' outcome (`Sender.resolve`), batching with linger
(batching.py) and retries with failover (transport.py). Every message gets a client id before
its first attempt, so a retry after a timeout or a lost connection stores it once.
"""

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import httpx

from ferry_client import batching, errors, partitioner, transactions, transport
from ferry_client.records import Message, SendHooks, SendResult, Value

logger = logging.getLogger(__name__)

DEFAULT_LINGER_MS = 5
DEFAULT_BATCH_SIZE = 500
DEFAULT_RETRIES = 5

R = TypeVar("R", contravariant=True)


class Outcome(Protocol[R]):
    """What both producers' futures have (concurrent.futures.Future, asyncio.Future)."""

    def done(self) -> bool: ...

    def set_result(self, result: R, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


def as_message(item: Message | Value) -> Message:
    """A Message as given, or a plain value wrapped in one; either way with a client id."""
    message = item if isinstance(item, Message) else Message(item)
    return message.with_id()


def new_message(
    value: Value,
    key: str | None,
    tag: str | None,
    headers: Mapping[str, str] | None,
    partition: int | None,
    id: str | None,
    delay_ms: int | None,
    deliver_at_ms: int | None,
    level: int | None,
) -> Message:
    return Message(
        value, key, tag, dict(headers or {}), partition, id, delay_ms, deliver_at_ms, level
    ).with_id()


class Sender:
    """What both producers share: the request body, its results, and the hooks around it."""

    def __init__(
        self, hooks: Sequence[SendHooks], route_by_partition: bool, metadata_max_age_ms: int
    ) -> None:
        self.hooks = tuple(hooks)
        # None: no routing hints, no reads of a topic's partition count, a batch per topic.
        self.partitions = (
            partitioner.Partitions(metadata_max_age_ms / 1000) if route_by_partition else None
        )

    def lane(self, topic: str, message: Message) -> batching.Lane:
        """Where send_async queues a message: per partition while hints are on, as a Kafka
        producer batches, so that each batch can take its partition's route."""
        if self.partitions is None:
            return batching.ONE_LANE
        return self.partitions.lane(topic, message)

    @staticmethod
    def path(topic: str, messages: Sequence[Message] = ()) -> str:
        """The topic's URL, or one partition's when every message names that partition: a load
        balancer sends those to the one process appending to it (docs/client.md#partitions)."""
        partitions = {m.partition for m in messages}
        if len(partitions) == 1 and (only := partitions.pop()) is not None and only >= 0:
            return f"/topics/{topic}/partitions/{only}/messages"
        return f"/topics/{topic}/messages"

    @staticmethod
    def body(messages: Sequence[Message]) -> dict[str, Any]:
        return {"messages": [m.to_wire() for m in messages]}

    @staticmethod
    def results(topic: str, messages: Sequence[Message], body: Any) -> list[SendResult]:
        return [
            SendResult.from_wire(topic, m, r)
            for m, r in zip(messages, body["results"], strict=True)
        ]

    def exchange(
        self, topic: str, messages: Sequence[Message]
    ) -> transport.Exchange[list[SendResult]]:
        """One send: the hooks around one request; either transport runs it."""
        self.before(topic, messages)
        try:
            headers = yield from self.hint(topic, messages)
            body = yield transport.Request(
                "POST", self.path(topic, messages), json=self.body(messages), headers=headers
            )
            results = self.results(topic, messages, body)
        except Exception as exc:
            self.after(topic, messages, exc)
            raise
        if self.partitions is not None:
            self.partitions.check(topic, messages, results)
        self.after(topic, messages, results)
        return results

    def hint(self, topic: str, messages: Sequence[Message]) -> transport.Exchange[dict[str, str]]:
        """The header naming the partition of a keyed request to the topic's URL, for the load
        balancer (docs/client.md#partitions); the topic's partition count is read first when
        it is not known, or old. The broker ignores the header."""
        partitions = self.partitions
        if partitions is None or all(m.partition is not None for m in messages):
            return {}  # the partition's own URL, or no one partition
        if partitions.to_read(topic, messages, time.monotonic()):
            count = None
            try:
                count = (yield transport.Request("GET", f"/topics/{topic}"))["partitions"]
            except errors.FerryError as exc:
                # Only the routing needs it: the send goes on, and its own answer tells.
                logger.debug("reading %s's partition count failed: %s", topic, exc)
            partitions.read(topic, count, time.monotonic())
        route = partitions.route(topic, messages)
        return {} if route is None else {partitioner.HINT_HEADER: str(route)}

    @staticmethod
    def resolve(
        topic: str,
        items: Sequence[tuple[Message, Outcome[SendResult]]],
        outcome: Sequence[SendResult] | Exception,
    ) -> None:
        """Hand a background batch's results, or its error, to the futures still waiting."""
        if isinstance(outcome, Exception):
            logger.warning("sending %d messages to %s failed: %s", len(items), topic, outcome)
            for _, future in items:
                if not future.done():
                    future.set_exception(outcome)
            return
        for (_, future), result in zip(items, outcome, strict=True):
            if not future.done():
                future.set_result(result)

    def before(self, topic: str, messages: Sequence[Message]) -> None:
        for hook in self.hooks:
            if hook.before_send is not None:
                try:
                    hook.before_send(topic, messages)
                except Exception:
                    logger.exception("before_send hook failed")

    def after(
        self, topic: str, messages: Sequence[Message], outcome: Sequence[SendResult] | BaseException
    ) -> None:
        for hook in self.hooks:
            if hook.after_send is not None:
                try:
                    hook.after_send(topic, messages, outcome)
                except Exception:
                    logger.exception("after_send hook failed")


def retry_policy(retries: int, backoff_ms: int, max_backoff_ms: int) -> transport.RetryPolicy:
    return transport.RetryPolicy(retries, backoff_ms / 1000, max_backoff_ms / 1000)


class Producer(transport.Closing):
    """Sends messages to Ferry over REST, from any number of threads.

    `send` and `send_batch` return once the broker has committed the messages. `send_async`
    returns a future at once; a linger thread sends such messages in batches of up to
    `batch_size` per topic (per partition with `route_by_partition`), waiting at most
    `linger_ms` for a batch to fill. `close()` (or the `with` block's end) sends what still
    waits.

    `urls` is one broker URL or several (a list, or comma-separated): a request that fails on
    one is retried on the next. Connection errors, timeouts and 5xx answers are retried up to
    `retries` times with backoff; a 4xx raises FerryError at once.

    `route_by_partition=True`: send_async batches per partition, and a keyed request whose
    messages share a partition names it in a header that a load balancer routes by; the
    topic's partition count for that is read once every `metadata_max_age_ms`. See
    docs/client.md#partitions.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str,
        *,
        timeout: float = transport.DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        backoff_ms: int = 100,
        max_backoff_ms: int = 5000,
        linger_ms: int = DEFAULT_LINGER_MS,
        batch_size: int = DEFAULT_BATCH_SIZE,
        hooks: Sequence[SendHooks] = (),
        http_transport: httpx.BaseTransport | None = None,
        verify: transport.Verify = True,
        route_by_partition: bool = False,
        metadata_max_age_ms: int = partitioner.DEFAULT_METADATA_MAX_AGE_MS,
    ) -> None:
        self._transport = transport.Transport(
            urls,
            api_key,
            timeout=timeout,
            policy=retry_policy(retries, backoff_ms, max_backoff_ms),
            http_transport=http_transport,
            verify=verify,
        )
        self._sender = Sender(hooks, route_by_partition, metadata_max_age_ms)
        self._batcher: batching.Batcher[tuple[Message, concurrent.futures.Future[SendResult]]]
        self._batcher = batching.Batcher(linger_ms / 1000, batch_size)
        self._cond = threading.Condition()
        self._sending = 0
        self._flushing = 0
        self._closed = False
        self._thread: threading.Thread | None = None

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
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        level: int | None = None,
    ) -> SendResult:
        """Send one message; returns when it is durable (or, delayed, scheduled)."""
        message = new_message(
            value, key, tag, headers, partition, id, delay_ms, deliver_at_ms, level
        )
        return self._send(topic, [message])[0]

    def send_batch(self, topic: str, messages: Iterable[Message | Value]) -> list[SendResult]:
        """Send messages in one request, one transaction: all are stored, or none is."""
        prepared = [as_message(m) for m in messages]
        return self._send(topic, prepared) if prepared else []

    def send_async(
        self,
        topic: str,
        value: Value,
        *,
        key: str | None = None,
        tag: str | None = None,
        headers: Mapping[str, str] | None = None,
        partition: int | None = None,
        id: str | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        level: int | None = None,
    ) -> "concurrent.futures.Future[SendResult]":
        """Queue one message for the linger thread; the future holds its result or error.

        Fire and forget: ignore the future, and watch failures with an after_send hook.
        """
        message = new_message(
            value, key, tag, headers, partition, id, delay_ms, deliver_at_ms, level
        )
        future: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("The producer is closed.")
            lane = self._sender.lane(topic, message)
            self._batcher.add(topic, (message, future), time.monotonic(), lane)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._linger, name="ferry-producer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        return future

    def transaction(
        self,
        producer_id: str | None = None,
        *,
        timeout_ms: int = 60_000,
        check_url: str | None = None,
    ) -> transactions.Transaction:
        """Begin a transaction: `with producer.transaction("billing-1") as txn: txn.send(...)`.

        The block's end commits (every message visible at once), an exception rolls back. A
        newer transaction of the same producer_id fences this one (docs/transactions.md).
        """
        return transactions.begin(
            self._transport, producer_id, timeout_ms=timeout_ms, check_url=check_url
        )

    def local_transactions(
        self, producer_id: str, check_url: str, *, timeout_ms: int = 60_000
    ) -> transactions.LocalTransactions:
        """RocketMQ's local transaction with check-back (docs/transactions.md#check-back)."""
        return transactions.LocalTransactions(
            self._transport, producer_id, check_url, timeout_ms=timeout_ms
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued by send_async now; False if `timeout` s passed first."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(
                    lambda: not len(self._batcher) and not self._sending, timeout
                )
            finally:
                self._flushing -= 1

    def close(self) -> None:
        """Send what is queued, stop the linger thread, close the connections."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        self._transport.close()

    def _send(self, topic: str, messages: list[Message]) -> list[SendResult]:
        return self._transport.run(self._sender.exchange(topic, messages))

    def _linger(self) -> None:
        """The linger thread: sends due batches one at a time, so a topic's order holds (a
        partition's, with route_by_partition)."""
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    batches = self._batcher.take(
                        now, everything=bool(self._flushing) or self._closed
                    )
                    if batches:
                        self._sending += 1
                        break
                    if self._closed:
                        return
                    self._cond.wait(self._batcher.next_due(now))
            try:
                for topic, items in batches:
                    # A future cancelled while it waited is not sent.
                    live = [(m, f) for m, f in items if f.set_running_or_notify_cancel()]
                    if live:
                        self._send_background(topic, live)
            finally:
                with self._cond:
                    self._sending -= 1
                    self._cond.notify_all()

    def _send_background(
        self, topic: str, items: list[tuple[Message, "concurrent.futures.Future[SendResult]"]]
    ) -> None:
        outcome: list[SendResult] | Exception
        try:
            outcome = self._send(topic, [m for m, _ in items])
        except Exception as exc:
            outcome = exc
        self._sender.resolve(topic, items, outcome)
