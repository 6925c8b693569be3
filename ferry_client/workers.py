"""A consumer's engine room: run the handler with concurrency or in order, settle the outcome.

See docs/client.md#consuming. Shared by push (WebSocket) and pull (REST): the source submits
deliveries to the `Pool`, the pool runs the handler and records each outcome in the source's
`Settlements`, which sends acks in batches and nacks and rejects at once.
"""

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from ferry_client import errors
from ferry_client.records import Delivery

logger = logging.getLogger(__name__)

# A handler returns when the message is done; raising nacks it (Reject: dead letter).
SyncHandler = Callable[[Delivery], object]
AsyncHandler = Callable[[Delivery], Awaitable[object]]
Handler = SyncHandler | AsyncHandler

Action = Literal["ack", "nack", "reject"]


@dataclass(frozen=True)
class Outcome:
    action: Action
    error: str = ""


def outcome_of(exc: BaseException | None) -> Outcome:
    """What a handler's result means: success acks, Reject rejects, any other error nacks."""
    if exc is None:
        return Outcome("ack")
    # The text goes to the broker as the message's last error; a bare exception has none.
    text = str(exc) or type(exc).__name__
    return Outcome("reject" if isinstance(exc, errors.Reject) else "nack", text)


def is_async(handler: Handler) -> bool:
    """An `async def` function, or an object whose __call__ is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 -- looking for an async __call__.
    )


class Settler(Protocol):
    """Sends settlements to the broker: over the subscription's socket, or over REST."""

    async def settle(self, action: Action, receipts: list[str], error: str) -> None: ...


class Settlements:
    """Outcomes waiting to be sent for one session (a connection, or a pull membership).

    Acks go in one frame or request per `batch_size` receipts or per `interval_s`, whichever
    comes first; nacks and rejects go at once (each error text with its receipts). Once the
    session is closed, outcomes are dropped: the broker redelivers those messages anyway.
    """

    def __init__(self, settler: Settler, batch_size: int, interval_s: float) -> None:
        self.settler = settler
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.closed = False
        self._acks: list[str] = []
        self._failed: list[tuple[str, Outcome]] = []
        self._wake = asyncio.Event()

    def add(self, receipt: str, outcome: Outcome) -> None:
        if self.closed:
            return
        if outcome.action == "ack":
            self._acks.append(receipt)
        else:
            self._failed.append((receipt, outcome))
        if self._failed or len(self._acks) == 1 or len(self._acks) >= self.batch_size:
            self._wake.set()

    def _urgent(self) -> bool:
        return bool(self._failed) or len(self._acks) >= self.batch_size

    async def run(self) -> None:
        """The flusher task of the session."""
        while not self.closed:
            self._wake.clear()
            if not (self._acks or self._failed):
                await self._wake.wait()
                continue
            if not self._urgent():
                # Let more acks join this batch; a full batch or a failure cuts the wait short.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Send every outcome that waits."""
        acks, self._acks = self._acks, []
        failed, self._failed = self._failed, []
        grouped: dict[tuple[Action, str], list[str]] = {}
        for receipt, outcome in failed:
            grouped.setdefault((outcome.action, outcome.error), []).append(receipt)
        if acks:
            grouped = {("ack", ""): acks, **grouped}
        for (action, error), receipts in grouped.items():
            try:
                await self.settler.settle(action, receipts, error)
            except Exception as exc:
                # The messages come back after their ack deadline or when the session ends.
                logger.warning("could not %s %d messages: %r", action, len(receipts), exc)

    def close(self) -> None:
        self.closed = True
        self._wake.set()


class Pool:
    """Runs the handler on deliveries, `concurrency` at a time.

    Ordered mode: a partition's deliveries go to one worker (partition % concurrency), so a
    partition has one message in the handler at a time, in the order they came. Sync handlers
    run on `executor` threads, async handlers on the event loop.
    """

    def __init__(
        self,
        handler: Handler,
        concurrency: int,
        *,
        ordered: bool,
        executor: concurrent.futures.Executor | None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency is at least 1.")
        self.concurrency = concurrency
        self.ordered = ordered
        self.executor = executor
        self._async_handler = cast(AsyncHandler, handler) if is_async(handler) else None
        self._sync_handler: SyncHandler = handler
        self._queues: list[asyncio.Queue[tuple[Delivery, Settlements]]] = [
            asyncio.Queue() for _ in range(concurrency if ordered else 1)
        ]
        self._workers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.pending = 0  # submitted and not finished (queued or in the handler)
        self.running = 0
        self._changed = asyncio.Event()

    def start(self) -> None:
        for i in range(self.concurrency):
            queue = self._queues[i % len(self._queues)]
            self._workers.append(asyncio.create_task(self._work(queue), name=f"ferry-worker-{i}"))

    def submit(self, delivery: Delivery, settlements: Settlements) -> None:
        shard = delivery.partition % len(self._queues) if self.ordered else 0
        self.pending += 1
        self._queues[shard].put_nowait((delivery, settlements))

    async def changed(self) -> None:
        """Wait until a delivery finishes (or is dropped)."""
        self._changed.clear()
        await self._changed.wait()

    async def drain(self) -> None:
        """Let the handlers running now finish; drop what waits (the broker redelivers it)."""
        self._stopping = True
        while self.running:
            await self.changed()

    async def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()

    async def _work(self, queue: "asyncio.Queue[tuple[Delivery, Settlements]]") -> None:
        while True:
            delivery, settlements = await queue.get()
            try:
                # A closed session's deliveries go back to the group: do not run them.
                if self._stopping or settlements.closed:
                    continue
                self.running += 1
                try:
                    outcome = outcome_of(await self._call(delivery))
                finally:
                    self.running -= 1
                settlements.add(delivery.receipt, outcome)
            finally:
                self.pending -= 1
                self._changed.set()

    async def _call(self, delivery: Delivery) -> Exception | None:
        try:
            if self._async_handler is not None:
                await self._async_handler(delivery)
            else:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self.executor, self._sync_handler, delivery)
        except Exception as exc:
            logger.info(
                "handler failed on %s/%s@%s (attempt %s): %r",
                delivery.topic,
                delivery.partition,
                delivery.offset,
                delivery.attempt,
                exc,
            )
            return exc
        return None
