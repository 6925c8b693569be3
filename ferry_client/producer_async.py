"""The asyncio producer: `await send(...)`, or `send_async(...)` and a linger task.

See docs/client.md#producing; the rules (ids, the request and its hooks, the futures' outcome,
batching, retries) are producer.py's, batching.py's and transport.py's: this is the asyncio shell.
"""

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType

import httpx

from ferry_client import batching, partitioner, producer, transactions, transport
from ferry_client.records import Message, SendHooks, SendResult, Value


class AsyncProducer:
    """The asyncio producer: `await send(...)`, or `send_async(...)` and a linger task.

    Same options and guarantees as Producer; use it from one event loop, and `await close()`
    (or `async with`) to send what is queued.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str,
        *,
        timeout: float = transport.DEFAULT_TIMEOUT_S,
        retries: int = producer.DEFAULT_RETRIES,
        backoff_ms: int = 100,
        max_backoff_ms: int = 5000,
        linger_ms: int = producer.DEFAULT_LINGER_MS,
        batch_size: int = producer.DEFAULT_BATCH_SIZE,
        hooks: Sequence[SendHooks] = (),
        http_transport: httpx.AsyncBaseTransport | None = None,
        verify: transport.Verify = True,
        route_by_partition: bool = False,
        metadata_max_age_ms: int = partitioner.DEFAULT_METADATA_MAX_AGE_MS,
    ) -> None:
        self._transport = transport.AsyncTransport(
            urls,
            api_key,
            timeout=timeout,
            policy=producer.retry_policy(retries, backoff_ms, max_backoff_ms),
            http_transport=http_transport,
            verify=verify,
        )
        self._sender = producer.Sender(hooks, route_by_partition, metadata_max_age_ms)
        self._batcher: batching.Batcher[tuple[Message, asyncio.Future[SendResult]]]
        self._batcher = batching.Batcher(linger_ms / 1000, batch_size)
        # Made on first use, inside the loop that uses them.
        self._wake: asyncio.Event | None = None
        self._progress: asyncio.Condition | None = None
        self._task: asyncio.Task[None] | None = None
        self._sending = False
        self._flushing = 0
        self._closed = False

    def transaction(
        self,
        producer_id: str | None = None,
        *,
        timeout_ms: int = 60_000,
        check_url: str | None = None,
    ) -> transactions.AsyncTransaction:
        """A transaction: `async with producer.transaction("billing-1") as txn: ...`.

        As Producer.transaction: it begins with its first call; the block's end commits, an
        exception rolls back (docs/transactions.md).
        """
        return transactions.AsyncTransaction(
            self._transport,
            producer_id or transactions.random_producer_id(),
            timeout_ms,
            check_url,
        )

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
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        level: int | None = None,
    ) -> SendResult:
        """Send one message; returns when it is durable (or, delayed, scheduled)."""
        message = producer.new_message(
            value, key, tag, headers, partition, id, delay_ms, deliver_at_ms, level
        )
        return (await self._send(topic, [message]))[0]

    async def send_batch(self, topic: str, messages: Iterable[Message | Value]) -> list[SendResult]:
        """Send messages in one request, one transaction: all are stored, or none is."""
        prepared = [producer.as_message(m) for m in messages]
        return await self._send(topic, prepared) if prepared else []

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
    ) -> "asyncio.Future[SendResult]":
        """Queue one message for the linger task (call it in the loop); await the future or not."""
        if self._closed:
            raise RuntimeError("The producer is closed.")
        message = producer.new_message(
            value, key, tag, headers, partition, id, delay_ms, deliver_at_ms, level
        )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SendResult] = loop.create_future()
        self._batcher.add(topic, (message, future), loop.time(), self._sender.lane(topic, message))
        wake, _ = self._events()
        if self._task is None:
            self._task = asyncio.create_task(self._linger(), name="ferry-producer")
        wake.set()
        return future

    async def flush(self) -> None:
        """Send everything queued by send_async now."""
        wake, progress = self._events()
        self._flushing += 1
        wake.set()
        try:
            async with progress:
                await progress.wait_for(lambda: not len(self._batcher) and not self._sending)
        finally:
            self._flushing -= 1

    async def close(self) -> None:
        """Send what is queued, stop the linger task, close the connections."""
        self._closed = True
        if self._task is not None:
            self._events()[0].set()
            await self._task
        await self._transport.aclose()

    async def __aenter__(self) -> "AsyncProducer":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _events(self) -> tuple[asyncio.Event, asyncio.Condition]:
        if self._wake is None or self._progress is None:
            self._wake, self._progress = asyncio.Event(), asyncio.Condition()
        return self._wake, self._progress

    async def _send(self, topic: str, messages: list[Message]) -> list[SendResult]:
        return await self._transport.run(self._sender.exchange(topic, messages))

    async def _linger(self) -> None:
        """The linger task: sends due batches one at a time, so a topic's order holds (a
        partition's, with route_by_partition)."""
        loop = asyncio.get_running_loop()
        wake, progress = self._events()
        while True:
            now = loop.time()
            batches = self._batcher.take(now, everything=bool(self._flushing) or self._closed)
            if batches:
                self._sending = True
                try:
                    for topic, items in batches:
                        # A future cancelled while it waited is not sent.
                        live = [(m, f) for m, f in items if not f.cancelled()]
                        if live:
                            await self._send_background(topic, live)
                finally:
                    self._sending = False
                    async with progress:
                        progress.notify_all()
                continue
            if self._closed:
                return
            # No await between take() and clear(): a message added since is in this take.
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self._batcher.next_due(now))

    async def _send_background(
        self, topic: str, items: list[tuple[Message, "asyncio.Future[SendResult]"]]
    ) -> None:
        outcome: list[SendResult] | Exception
        try:
            outcome = await self._send(topic, [m for m, _ in items])
        except Exception as exc:
            outcome = exc
        self._sender.resolve(topic, items, outcome)
