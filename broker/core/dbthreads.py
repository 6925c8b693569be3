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
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.signals import connection_created
from django.db.utils import DatabaseError, OperationalError

from broker import settings as ferry_settings
from broker.core import outages, pgwire

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
    queued_s: float = 0.0  # asked for, waiting for the calls before it and a free thread


# (pool, call name) -> its figures: the operator's view of how busy the threads are
# (/metrics, docs/metrics.md). Only calls run on a pool's thread are counted.
_figures: dict[tuple[str, str], CallFigures] = {}
_figures_lock = threading.Lock()


def call_figures() -> dict[tuple[str, str], CallFigures]:
    """A copy of the figures of every (pool, call) run so far: pool "write" (run()), "read"
    (read()) or "loop" (run_here() on the event loop's thread)."""
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
        _count(pool, fn, submitted, started, time.perf_counter())


def _count(
    pool: str, fn: Callable[..., Any], submitted: float, started: float, ended: float
) -> None:
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
    global _pool, _writing
    if _pool is None:
        count = thread_count()
        if count == 0:
            return None
        with _pool_lock:
            if _pool is None:
                # SQLite has one writer thread: its calls and those run_here() runs on the
                # event loop's thread hold this lock (only ever tried on the loop).
                _writing = threading.Lock() if connection.vendor == "sqlite" else None
                _pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="ferry-db")
    return _pool


_writing: "threading.Lock | None" = None


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


def _write_call(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    writing = _writing
    if writing is None:
        return _call(loop, fn, *args, **kwargs)
    with writing:
        return _call(loop, fn, *args, **kwargs)


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a sync core function on a database thread and await its result.

    With FERRY_DB_THREADS=0 (the tests) it falls back to sync_to_async, which runs on the
    caller's thread, so a test's open transaction is visible.
    """
    pool = _get_pool()
    if pool is None:
        return await sync_to_async(outages.call_with_reconnect)(fn, *args, **kwargs)
    loop, asked = asyncio.get_running_loop(), time.perf_counter()
    writes = _writes_of(loop)
    if writes is None:
        return await _on_writer(loop, pool, asked, fn, *args, **kwargs)
    while writes.waiting:  # short calls wait for the writer thread: they go first
        await writes.served.wait()
    writes.pending += 1
    writes.idle.clear()
    try:
        return await _on_writer(loop, pool, asked, fn, *args, **kwargs)
    finally:
        writes.pending -= 1
        if not writes.pending:
            writes.idle.set()


async def _on_writer(
    loop: asyncio.AbstractEventLoop,
    pool: ThreadPoolExecutor,
    asked: float,
    fn: Callable[..., T],
    *args: Any,
    **kwargs: Any,
) -> T:
    """fn on the writer pool; asked: when the caller asked (perf_counter()), for its figures."""
    call = functools.partial(_write_call, loop, fn, *args, **kwargs)
    return await loop.run_in_executor(pool, _counted, "write", asked, call, fn)


@dataclass
class _Writes:
    """SQLite: one loop's calls on the writer thread, and its short calls waiting for it to be
    idle (run_here), which then run before any call sent there after them."""

    pending: int = 0  # on the writer thread (or in its queue)
    waiting: int = 0  # run_here() calls waiting for pending to be 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set when pending is 0
    served: asyncio.Event = field(default_factory=asyncio.Event)  # set when waiting is 0

    def __post_init__(self) -> None:
        self.idle.set()
        self.served.set()


_writes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Writes]" = (
    weakref.WeakKeyDictionary()
)


def _writes_of(loop: asyncio.AbstractEventLoop) -> _Writes | None:
    if _writing is None:
        return None
    writes = _writes.get(loop)
    if writes is None:
        writes = _writes[loop] = _Writes()
    return writes


class _WriterBusy(Exception):
    """Another connection held SQLite's write lock when run_here()'s call began it."""


async def run_here(fn: Callable[..., T], *args: Any) -> T:
    """run(fn, *args), or on the event loop's own thread: on SQLite when nothing else writes to
    it, that is this loop's calls on the writer thread are done (it waits for them, and goes
    before those asked for after it) and no other connection holds the write lock
    (docs/decisions/0021-short-calls-on-the-event-loop.md); on PostgreSQL within the bounds of
    _here_on_postgresql (docs/decisions/0023-short-calls-on-the-loop-on-postgresql.md).

    For short calls that do not wait for the disk (a few messages' push or ack, committed
    without a flush): the loop runs nothing else meanwhile. They then cost no hop to the
    writer thread and back, and no GIL handed to and fro for each statement.
    """
    pool, loop, asked = _get_pool(), asyncio.get_running_loop(), time.perf_counter()
    if pool is None:
        return await run(fn, *args)
    if _writing is None:  # PostgreSQL (_get_pool): no writer lock
        return await _here_on_postgresql(pool, loop, asked, fn, *args)
    writing, writes = _writing, _writes_of(loop)
    if writes is None:
        return await run(fn, *args)
    if writes.pending:
        writes.waiting += 1
        writes.served.clear()
        try:
            while writes.pending:
                await writes.idle.wait()
        finally:
            writes.waiting -= 1
            if not writes.waiting:
                writes.served.set()
    # Free unless another loop of this process is writing (tests).
    if not writing.acquire(blocking=False):
        return await run(fn, *args)
    started = time.perf_counter()
    try:
        try:
            result = _here(loop, fn, *args)
        finally:
            writing.release()
            ended = time.perf_counter()
    except _WriterBusy:
        return await run(fn, *args)  # another process writes: the writer thread waits for it
    except BaseException:
        _count("loop", fn, asked, started, ended)  # a call that raised ran, as pools count it
        raise
    _count("loop", fn, asked, started, ended)
    await asyncio.sleep(0)  # the loop's other work before the caller's next step
    return result


class _FirstBegin:
    """Raises _WriterBusy when the call's first transaction finds the write lock another's: every
    transaction takes it as it begins (transaction_mode IMMEDIATE), so nothing was done yet."""

    def __init__(self) -> None:
        self.begun = 0

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if not sql.startswith("BEGIN"):
            return execute(sql, params, many, context)
        self.begun += 1
        try:
            return execute(sql, params, many, context)
        except OperationalError as exc:
            if self.begun == 1 and "database is locked" in str(exc):
                raise _WriterBusy from exc
            raise


def _here(loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on this thread's own connection; raises _WriterBusy if the write lock was
    another's (nothing was done then)."""
    with _loop_hidden(loop):
        if connection.connection is None:
            connection.ensure_connection()
        raw = connection.connection
        if getattr(_local, "here_connection", None) is not raw:
            # Never wait for another process's write (its busy timeout would stop the loop),
            # and never checkpoint here (that flushes): the writer thread's commits do.
            raw.execute("PRAGMA busy_timeout = 0")
            raw.execute("PRAGMA wal_autocheckpoint = 0")
            _local.here_connection = raw
        with connection.execute_wrapper(_FirstBegin()):
            return _call(loop, fn, *args)


@contextlib.contextmanager
def _loop_hidden(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """The loop's thread as Django sees a thread without a loop, the loop set again after.

    Django refuses its ORM on a thread where an event loop runs, and while one runs it keeps
    connections per task (asgiref's Local): the loop's own calls run with it hidden, and so
    find the thread's one connection.
    """
    asyncio.events._set_running_loop(None)
    try:
        yield
    finally:
        asyncio.events._set_running_loop(loop)


# PostgreSQL: what a call on the event loop's thread waits for at most, in ms: a row lock held
# by another transaction, a statement. Past either it keeps nothing and goes to a database
# thread, which waits as long as it takes.
LOOP_LOCK_TIMEOUT_MS = 50
LOOP_STATEMENT_TIMEOUT_MS = 250


@dataclass
class _LoopCalls:
    """PostgreSQL: one event loop's short calls (run_here) on the database threads."""

    pending: int = 0  # on a database thread, or in its queue
    asking: int = 0  # asked for and not yet begun (run_here's first turn of the loop)
    # The loop's last short call went well: the next may run on the loop. False at first, and
    # after the database failed one on the loop, until one on a thread goes well.
    healthy: bool = False
    opening: bool = False  # its connection being opened on a database thread


_loop_calls: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopCalls]" = (
    weakref.WeakKeyDictionary()
)


class _ToThread(Exception):
    """The database failed a call on the loop before anything of it committed."""


async def _here_on_postgresql(
    pool: ThreadPoolExecutor,
    loop: asyncio.AbstractEventLoop,
    asked: float,
    fn: Callable[..., T],
    *args: Any,
) -> T:
    """run_here() on PostgreSQL (docs/decisions/0023-short-calls-on-the-loop-on-postgresql.md).

    On the loop's thread when it is the loop's only short call (none other asked for in the same
    turn of the loop, none on a database thread) and the last went well; its connection is
    opened on a database thread, never on the loop. A call that meets a lock held longer than
    LOOP_LOCK_TIMEOUT_MS, a statement past LOOP_STATEMENT_TIMEOUT_MS or a database error before
    anything of it committed runs again on a database thread.
    """
    calls = _loop_calls.get(loop)
    if calls is None:
        calls = _loop_calls[loop] = _LoopCalls()
    # One turn of the loop first: calls asked for at once (a commit that wakes many
    # subscribers' pushes) go to the threads, whose waits for the server overlap; the loop
    # would run them one after the other.
    calls.asking += 1
    try:
        await asyncio.sleep(0)
        alone = calls.asking == 1
    finally:
        calls.asking -= 1
    if alone and calls.healthy and not calls.pending and await _loop_connection(pool, loop, calls):
        started = time.perf_counter()
        try:
            try:
                result = _here_postgresql(loop, fn, *args)
            finally:
                ended = time.perf_counter()
        except _ToThread:
            calls.healthy = False
        except BaseException:
            _count("loop", fn, asked, started, ended)
            raise
        else:
            _count("loop", fn, asked, started, ended)
            await asyncio.sleep(0)  # the loop's other work before the caller's next step
            return result
    calls.pending += 1
    try:
        result = await _on_writer(loop, pool, asked, fn, *args)
    except BaseException as exc:
        # Not the database's error (a refusal of the core's, the caller gone): it answered, so
        # the loop may try again.
        calls.healthy = not isinstance(exc, DatabaseError)
        raise
    finally:
        calls.pending -= 1
    calls.healthy = True
    return result


async def _loop_connection(
    pool: ThreadPoolExecutor, loop: asyncio.AbstractEventLoop, calls: _LoopCalls
) -> bool:
    """Whether the loop thread's connection is open, opened on a database thread if it was not
    (a borrow from the pool may wait, and the loop must not). False while another call opens it:
    that one goes to a thread meanwhile."""
    db = _loop_thread_connection(loop)
    if db.connection is not None:
        return True
    if calls.opening:
        return False

    def open_it() -> None:
        db.inc_thread_sharing()
        try:
            db.ensure_connection()
        finally:
            db.dec_thread_sharing()

    calls.opening = True
    try:
        await loop.run_in_executor(pool, open_it)
    except DatabaseError:
        return False
    finally:
        calls.opening = False
    return db.connection is not None


def _loop_thread_connection(loop: asyncio.AbstractEventLoop) -> Any:
    """The loop thread's own connection, as its calls find it (_loop_hidden)."""
    with _loop_hidden(loop):
        return connections[DEFAULT_DB_ALIAS]


def _here_postgresql(loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on this thread's own connection within the loop's limits; _ToThread if the
    database failed it before anything of it committed."""
    with _loop_hidden(loop):
        _local.loop = loop
        mark = outages.commit_mark()
        try:
            with pgwire.bounded_waits(LOOP_LOCK_TIMEOUT_MS, LOOP_STATEMENT_TIMEOUT_MS):
                return fn(*args)
        except outages.ERRORS as exc:
            outages.drop_if_broken()
            if outages.nothing_committed_since(mark):
                raise _ToThread from exc
            raise
        finally:
            _local.loop = None


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
