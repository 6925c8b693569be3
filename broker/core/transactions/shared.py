"""Shared commits: transaction operations arriving together share one database transaction.

See docs/architecture.md#transactions. A transactional producer's begin, add and commit are
small writes that each wait for the disk; call_async queues them per event loop and run_shared
runs a group in one transaction, each call in a savepoint of its own, as produces do
(groupcommit.py): each is still all or nothing on its own.
"""

import asyncio
import collections
import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import transaction

from broker.core import dbthreads, errors

T = TypeVar("T")

_shared = threading.local()
# Operations per shared commit at most.
MAX_SHARED = 32


def atomic() -> Any:
    """An operation's transaction: its own (durable), or its savepoint inside run_shared."""
    if getattr(_shared, "active", False):
        return transaction.atomic()
    return transaction.atomic(durable=True)


def run_shared(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run transaction operations in one database transaction, each all or nothing on its own.

    Each outcome is the call's result or the BrokerError that refused it (its savepoint rolled
    back, the others commit).
    """
    outcomes: list[Any] = []
    _shared.active = True
    try:
        with transaction.atomic(durable=True):
            for call in calls:
                try:
                    outcomes.append(call())
                except errors.BrokerError as exc:
                    outcomes.append(exc)
    finally:
        _shared.active = False
    return outcomes


@dataclass
class _Queue:
    waiting: "collections.deque[tuple[Callable[[], Any], asyncio.Future[Any]]]" = field(
        default_factory=collections.deque
    )
    draining: bool = False
    tasks: set["asyncio.Task[None]"] = field(default_factory=set)


_queues: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue]" = (
    weakref.WeakKeyDictionary()
)


async def call_async(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a database thread, sharing a commit with the calls arriving alongside."""
    loop = asyncio.get_running_loop()
    queue = _queues.setdefault(loop, _Queue())
    future: asyncio.Future[T] = loop.create_future()
    queue.waiting.append((functools.partial(fn, *args), future))
    if not queue.draining:
        queue.draining = True
        task = loop.create_task(_drain(queue))
        queue.tasks.add(task)
        task.add_done_callback(queue.tasks.discard)
    return await future


async def _drain(queue: _Queue) -> None:
    try:
        while queue.waiting:
            group = [queue.waiting.popleft() for _ in range(min(MAX_SHARED, len(queue.waiting)))]
            try:
                outcomes = await dbthreads.run(run_shared, [call for call, _ in group])
            except Exception:
                # The shared commit failed as a whole (a deadlock between processes on
                # PostgreSQL, a lost connection): each call again on its own.
                for call, future in group:
                    try:
                        result = await dbthreads.run(call)
                    except Exception as exc:
                        if not future.done():
                            future.set_exception(exc)
                    else:
                        if not future.done():
                            future.set_result(result)
                continue
            for (_, future), outcome in zip(group, outcomes, strict=True):
                if future.done():
                    continue  # the caller went away
                if isinstance(outcome, errors.BrokerError):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
    finally:
        queue.draining = False
