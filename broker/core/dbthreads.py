"""Long-lived threads that run core functions for the async edges, keeping their connections.

See docs/decisions/0007-database-threads.md. Django's ASGI handler runs each request's sync
code on a new thread, so every request would open (and leak) a database connection. The async
edges (REST hot paths, long polls, WebSocket consumers) call the core through run() instead.

Read-only calls (listings, fetch, health, console reads) go through read() to a pool of reader
threads of their own (docs/decisions/0013-readers-beside-the-writer.md): on SQLite the one
writer thread is never queued behind a slow read, and WAL lets the readers run beside it. A
reader's connection refuses every write (PRAGMA query_only on SQLite, a read-only session on
PostgreSQL), so a write sent to the wrong pool fails loudly instead of racing the writer.
"""

import asyncio
import functools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.signals import connection_created
from django.db.utils import DatabaseError

from broker import settings as ferry_settings
from broker.core import outages

T = TypeVar("T")

_local = threading.local()
_pool: ThreadPoolExecutor | None = None
_read_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()

# Makes the connection of the thread it runs on refuse writes, per database vendor.
READ_ONLY_SQL = {
    "sqlite": "PRAGMA query_only = 1",
    "postgresql": "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
}


@dataclass
class CallFigures:
    """What one kind of call cost this process's threads of one pool, since it started."""

    calls: int = 0
    busy_s: float = 0.0  # on a thread, from start to end
    queued_s: float = 0.0  # submitted, waiting for a free thread


# (pool, call name) -> its figures: the operator's view of how busy the threads are
# (/metrics, docs/metrics.md). Only calls run on a pool's thread are counted.
_figures: dict[tuple[str, str], CallFigures] = {}
_figures_lock = threading.Lock()


def call_figures() -> dict[tuple[str, str], CallFigures]:
    """A copy of the figures of every (pool, call) run so far: pool "write" (run()) or "read"."""
    with _figures_lock:
        return {key: CallFigures(f.calls, f.busy_s, f.queued_s) for key, f in _figures.items()}


def _name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _counted(pool: str, submitted: float, call: Callable[[], T], fn: Callable[..., Any]) -> T:
    """call() on a pool's thread (submitted at the perf_counter() given), its time there and in
    the queue added to fn's figures: a clock read at each end and a lock, about a microsecond."""
    started = time.perf_counter()
    try:
        return call()
    finally:
        ended = time.perf_counter()
        key = (pool, _name(fn))
        with _figures_lock:
            figures = _figures.get(key)
            if figures is None:
                figures = _figures[key] = CallFigures()
            figures.calls += 1
            figures.busy_s += ended - started
            figures.queued_s += started - submitted


def thread_count() -> int:
    """FERRY_DB_THREADS, or by default one for SQLite (one writer anyway) and four otherwise."""
    configured = ferry_settings.get("DB_THREADS")
    if configured >= 0:
        return int(configured)
    return 1 if connection.vendor == "sqlite" else 4


def read_thread_count() -> int:
    """FERRY_DB_READ_THREADS, or by default four; 0 sends reads where run() sends its calls."""
    configured = ferry_settings.get("DB_READ_THREADS")
    if configured >= 0:
        return int(configured)
    return 4


def _get_read_pool() -> ThreadPoolExecutor | None:
    global _read_pool
    if _read_pool is None:
        count = read_thread_count() if thread_count() else 0
        if count == 0:
            return None
        with _pool_lock:
            if _read_pool is None:
                _read_pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="ferry-read")
    return _read_pool


# PostgreSQL sessions made read-only here. With the connection pool (FERRY_DB_POOL_SIZE), one a
# reader closed goes back to the pool: whoever borrows it next makes it accept writes again
# first (_writable_again). Done at the borrow, on the borrower's thread: psycopg_pool's own
# reset would run on its worker after the return, and a pool closed meanwhile drops that task
# and leaves the session open (as a test run's end does, before it drops its database).
_read_only_sessions: "weakref.WeakSet[Any]" = weakref.WeakSet()
_read_only_lock = threading.Lock()
READ_WRITE_SQL = "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE"


def make_read_only() -> None:
    """Make this thread's connection refuse writes, once per connection (it may reconnect)."""
    connection.ensure_connection()
    raw = connection.connection
    postgresql = connection.vendor == "postgresql"
    if postgresql:
        with _read_only_lock:
            if raw in _read_only_sessions:
                return
    elif getattr(_local, "read_only_connection", None) is raw:
        return
    with connection.cursor() as cursor:
        cursor.execute(READ_ONLY_SQL[connection.vendor])
    if postgresql:
        with _read_only_lock:
            _read_only_sessions.add(raw)
    else:
        _local.read_only_connection = raw


def _writable_again(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A borrowed PostgreSQL session a reader left read-only accepts writes again."""
    raw = connection.connection
    with _read_only_lock:
        if raw not in _read_only_sessions:
            return
        _read_only_sessions.discard(raw)
    with raw.cursor() as cursor:
        cursor.execute(READ_WRITE_SQL)


connection_created.connect(_writable_again, dispatch_uid="ferry.dbthreads.writable_again")


def _get_pool() -> ThreadPoolExecutor | None:
    global _pool
    if _pool is None:
        count = thread_count()
        if count == 0:
            return None
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="ferry-db")
    return _pool


def home_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop that submitted the call running on this thread, if any."""
    return getattr(_local, "loop", None)


def _call(loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    _local.loop = loop
    try:
        # A connection PostgreSQL ended is replaced, and the call run again if nothing of it
        # committed (docs/decisions/0014-outages.md).
        return outages.call_with_reconnect(fn, *args, **kwargs)
    except DatabaseError:
        # Drop a broken connection so the next call on this thread reconnects.
        connection.close_if_unusable_or_obsolete()
        raise
    finally:
        _local.loop = None


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a sync core function on a database thread and await its result.

    With FERRY_DB_THREADS=0 (the tests) it falls back to sync_to_async, which runs on the
    caller's thread, so a test's open transaction is visible.
    """
    pool = _get_pool()
    if pool is None:
        return await sync_to_async(outages.call_with_reconnect)(fn, *args, **kwargs)
    loop = asyncio.get_running_loop()
    call = functools.partial(_call, loop, fn, *args, **kwargs)
    return await loop.run_in_executor(pool, _counted, "write", time.perf_counter(), call, fn)


def _read_call(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    def read_only() -> T:
        # Inside the call: a connection replaced by call_with_reconnect is made read-only too.
        make_read_only()
        return fn(*args, **kwargs)

    return _call(loop, read_only)


async def read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a read-only core function on a reader thread and await its result.

    The reader's connection refuses writes: a function that writes fails with a database error
    (tests/core/test_dbthreads.py). It must not open a transaction either: on SQLite every
    transaction begins IMMEDIATE and would take the write lock. With FERRY_DB_THREADS=0 or
    FERRY_DB_READ_THREADS=0 it runs where run() would.
    """
    pool = _get_read_pool()
    if pool is None:
        return await run(fn, *args, **kwargs)
    loop = asyncio.get_running_loop()
    call = functools.partial(_read_call, loop, fn, *args, **kwargs)
    return await loop.run_in_executor(pool, _counted, "read", time.perf_counter(), call, fn)
