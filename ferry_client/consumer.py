"""Consumers: a handler per message, acked on success and nacked on an exception.

See docs/client.md#consuming. `AsyncConsumer` is the engine (asyncio); `Consumer` runs it on
its own event loop for code that is not async. Both take sync or async handlers: sync ones
run on a thread pool of `concurrency` threads, async ones as tasks.
"""

import asyncio
import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import httpx

from ferry_client import transport, workers
from ferry_client.pull import Poller
from ferry_client.push import Subscriber
from ferry_client.records import Subscription, default_client_name

Mode = Literal["push", "pull"]
Start = Literal["committed", "earliest", "latest"]

DEFAULT_ACK_INTERVAL_MS = 50


def default_prefetch(concurrency: int) -> int:
    """Enough messages on hand to keep every worker busy, few enough to meet ack deadlines."""
    return max(10, 2 * concurrency)


class AsyncConsumer:
    """A group member that runs `handler` on each message of `topic` until `stop()`.

    - `mode="push"`: a WebSocket subscription; the broker pushes up to `prefetch` messages
      ahead. `mode="pull"`: REST long polls of at most `prefetch` messages.
    - The handler returning acks the message; raising nacks it with `str(exc)` as its error
      (redelivered after the group's backoff, with `attempt` one higher); raising
      `ferry_client.Reject` sends it to the dead-letter queue. Acks go in batches.
    - `concurrency` handlers run at once. `ordered=True` runs one message per partition at a
      time, in the order delivered (set the group's `ordered` setting too, for a failure to
      block its partition until it succeeds).
    - A lost connection is retried, on the next URL first; the group resumes from its
      committed offset. `filter` is the subscription filter (docs/api.md), `start` where a new
      group begins, `member_id` names this member (broadcast mode resumes a member by it).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str,
        group: str,
        topic: str,
        handler: workers.Handler,
        *,
        mode: Mode = "push",
        concurrency: int = 1,
        prefetch: int | None = None,
        filter: Mapping[str, Any] | None = None,
        ordered: bool = False,
        member_id: str | None = None,
        start: Start = "committed",
        client: str | None = None,
        timeout: float = transport.DEFAULT_TIMEOUT_S,
        retries: int = 3,
        ack_interval_ms: int = DEFAULT_ACK_INTERVAL_MS,
        http_transport: httpx.AsyncBaseTransport | None = None,
        verify: transport.Verify = True,
    ) -> None:
        if mode not in ("push", "pull"):
            raise ValueError(f"mode is 'push' or 'pull', not {mode!r}.")
        if concurrency < 1:
            raise ValueError("concurrency is at least 1.")
        if mode == "pull" and start != "committed":
            # REST joins take no start position (docs/api.md); WebSocket subscribes do.
            raise ValueError("start is for push mode; a pull member starts from 'committed'.")
        self.urls = urls
        self.api_key = api_key
        self.handler = handler
        self.mode = mode
        self.concurrency = concurrency
        self.ordered = ordered
        self.timeout = timeout
        self.policy = transport.RetryPolicy(retries=retries)
        self.ack_interval_s = ack_interval_ms / 1000
        self.http_transport = http_transport
        # One TLS context for the WebSocket and the REST calls (a CA file read once).
        self.tls = transport.tls_context(verify)
        self.subscription = Subscription(
            group=group,
            topic=topic,
            prefetch=prefetch or default_prefetch(concurrency),
            filter=dict(filter) if filter is not None else None,
            start=start,
            member_id=member_id,
            client=client if client is not None else default_client_name(),
        )
        self._member_id = member_id
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False

    @property
    def member_id(self) -> str | None:
        """This member's id in the group, once it has joined."""
        return self._member_id

    def stop(self) -> None:
        """Stop run(): finish the handlers running now, settle, leave. Safe from any thread."""
        self._stop_requested = True
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            loop.call_soon_threadsafe(stopping.set)

    async def run(self) -> None:
        """Consume until stop(); raises FerryError if the broker refuses the subscription."""
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping = asyncio.Event()
        if self._stop_requested:
            stopping.set()
        executor = None
        if not workers.is_async(self.handler):
            executor = concurrent.futures.ThreadPoolExecutor(
                self.concurrency, thread_name_prefix="ferry-handler"
            )
        pool = workers.Pool(self.handler, self.concurrency, ordered=self.ordered, executor=executor)
        pool.start()
        try:
            if self.mode == "push":
                await self._push(pool, stopping)
            else:
                await self._pull(pool, stopping)
        finally:
            await pool.close()
            if executor is not None:
                # Handlers still running (after a cancel) finish on their own threads.
                executor.shutdown(wait=False, cancel_futures=True)
            self._loop = self._stopping = None
            self._stop_requested = False

    def _settlements(self, settler: workers.Settler) -> workers.Settlements:
        batch = max(1, min(100, self.subscription.prefetch // 2))
        return workers.Settlements(settler, batch, self.ack_interval_s)

    async def _push(self, pool: workers.Pool, stopping: asyncio.Event) -> None:
        subscriber = Subscriber(
            transport.Endpoints(self.urls),
            self.api_key,
            self.subscription,
            pool,
            stopping,
            policy=self.policy,
            timeout=self.timeout,
            make_settlements=self._settlements,
            on_member=self._joined,
            tls=self.tls,
        )
        await subscriber.run()

    async def _pull(self, pool: workers.Pool, stopping: asyncio.Event) -> None:
        rest = transport.AsyncTransport(
            self.urls,
            self.api_key,
            timeout=self.timeout,
            policy=self.policy,
            http_transport=self.http_transport,
            verify=self.tls,
        )
        try:
            poller = Poller(
                rest,
                self.subscription,
                pool,
                stopping,
                make_settlements=self._settlements,
                on_member=self._joined,
            )
            await poller.run()
        finally:
            await rest.aclose()

    def _joined(self, member_id: str) -> None:
        self._member_id = member_id


class Consumer:
    """The blocking consumer: `run()` consumes until `stop()` (from a handler, a signal
    handler or another thread). Same arguments and behaviour as AsyncConsumer."""

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str,
        group: str,
        topic: str,
        handler: workers.Handler,
        *,
        mode: Mode = "push",
        concurrency: int = 1,
        prefetch: int | None = None,
        filter: Mapping[str, Any] | None = None,
        ordered: bool = False,
        member_id: str | None = None,
        start: Start = "committed",
        client: str | None = None,
        timeout: float = transport.DEFAULT_TIMEOUT_S,
        retries: int = 3,
        ack_interval_ms: int = DEFAULT_ACK_INTERVAL_MS,
        http_transport: httpx.AsyncBaseTransport | None = None,
        verify: transport.Verify = True,
    ) -> None:
        self._consumer = AsyncConsumer(
            urls,
            api_key,
            group,
            topic,
            handler,
            mode=mode,
            concurrency=concurrency,
            prefetch=prefetch,
            filter=filter,
            ordered=ordered,
            member_id=member_id,
            start=start,
            client=client,
            timeout=timeout,
            retries=retries,
            ack_interval_ms=ack_interval_ms,
            http_transport=http_transport,
            verify=verify,
        )

    @property
    def member_id(self) -> str | None:
        """This member's id in the group, once it has joined."""
        return self._consumer.member_id

    def run(self) -> None:
        """Consume until stop(), on an event loop of this thread's own."""
        asyncio.run(self._consumer.run())

    def stop(self) -> None:
        """Stop run(): finish the handlers running now, settle, leave. Safe from any thread."""
        self._consumer.stop()
