"""Reader threads beside the writer: reads run there, writes cannot; each call counted; short
writes on the loop itself (run_here, SQLite) in order, and a locked database left to the writer
(core/dbthreads.py)."""

import asyncio
import functools
import sqlite3
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from broker import models
from broker.core import bulk, dbthreads, errors, topics
from tests.sessions import terminate_own_session


@pytest.fixture
def pools(settings) -> Iterator[None]:
    """Real pools of one writer and one reader thread, as a server has; closed afterwards."""
    settings.FERRY_DB_THREADS = 1
    settings.FERRY_DB_READ_THREADS = 1
    dbthreads._pool = dbthreads._read_pool = None
    yield
    for pool in (dbthreads._pool, dbthreads._read_pool):
        if pool is not None:
            # Each pool has one thread: this closes its connection before the thread ends.
            pool.submit(lambda: connection.close()).result()
            pool.shutdown()
    dbthreads._pool = dbthreads._read_pool = None


def _thread_name() -> str:
    return threading.current_thread().name


@pytest.mark.django_db(transaction=True)
async def test_read__runs_on_a_reader_thread_and_run_on_the_writer(pools):
    assert (await dbthreads.read(_thread_name)).startswith("ferry-read")
    assert (await dbthreads.run(_thread_name)).startswith("ferry-db")


@pytest.mark.django_db(transaction=True)
async def test_call_figures__each_pools_calls_their_time_there_and_their_wait(pools):
    before = dbthreads.call_figures()
    # Two calls at once on the one writer thread: the second waits for the first.
    await asyncio.gather(
        dbthreads.run(time.sleep, 0.05), dbthreads.run(functools.partial(_thread_name))
    )
    await dbthreads.read(_thread_name)
    after = dbthreads.call_figures()

    def grown(key: tuple[str, str]) -> tuple[int, float, float]:
        was, now = before.get(key, dbthreads.CallFigures()), after[key]
        return now.calls - was.calls, now.busy_s - was.busy_s, now.queued_s - was.queued_s

    calls, busy, _ = grown(("write", "sleep"))
    assert calls == 1
    assert busy >= 0.05
    # A partial counts as the function it wraps.
    calls, _, queued = grown(("write", "_thread_name"))
    assert calls == 1
    assert queued >= 0.04
    assert grown(("read", "_thread_name"))[0] == 1


def _create_topic() -> None:
    models.Topic.objects.create(name="sneaky", partition_count=1, max_message_bytes=10)


@pytest.mark.django_db(transaction=True)
async def test_read__refuses_a_write(pools, console):
    # SQLite: "attempt to write a readonly database"; PostgreSQL: "cannot execute INSERT in a
    # read-only transaction". Either way nothing is stored.
    with pytest.raises(DatabaseError):
        await dbthreads.read(_create_topic)
    # The reader reconnects after the error and is read-only again.
    with pytest.raises(DatabaseError):
        await dbthreads.read(_create_topic)
    await dbthreads.run(topics.create_topic, console, "fine")
    assert [t.name for t in await dbthreads.read(topics.list_topics, console)] == ["fine"]


@pytest.mark.django_db(transaction=True)
async def test_read__sees_what_the_writer_committed(pools, console):
    for n in range(5):
        await dbthreads.run(topics.create_topic, console, f"t{n}")
        found = await dbthreads.read(topics.list_topics, console)
        assert len(found) == n + 1


@pytest.mark.django_db(transaction=True)
async def test_read__a_replaced_connection_is_read_only_too(pools, console):
    if connection.vendor != "postgresql":
        pytest.skip("sessions are terminated on PostgreSQL")
    await dbthreads.read(_thread_name)  # the reader's session exists and is read-only

    def terminated_then_write() -> None:
        # The first run meets the ended session; call_with_reconnect runs it again on a new
        # connection, which must refuse the write as the old one did.
        if not getattr(terminated_then_write, "done", False):
            terminated_then_write.done = True  # type: ignore[attr-defined]
            terminate_own_session()
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        _create_topic()

    with pytest.raises(DatabaseError):
        await dbthreads.read(terminated_then_write)
    assert not await dbthreads.run(lambda: models.Topic.objects.filter(name="sneaky").exists())


@pytest.mark.django_db(transaction=True)
def test_pool__a_readers_session_accepts_writes_again_when_lent():
    """A reader's session refuses writes; back in the pool (FERRY_DB_POOL_SIZE), the next
    borrower makes it accept them before using it (the suite's flushes borrow them too)."""
    if connection.vendor != "postgresql" or connection.pool is None:  # type: ignore[attr-defined]
        pytest.skip("PostgreSQL's connection pool")
    dbthreads.make_read_only()
    raw = connection.connection
    connection.close()  # back to the pool, still read-only
    # The pool lends its idle connections in turn: borrow until that one comes back.
    for _ in range(connection.pool.max_size + 1):  # type: ignore[attr-defined]
        connection.ensure_connection()
        if connection.connection is raw:
            break
        connection.close()
    assert connection.connection is raw
    with connection.cursor() as cursor:
        cursor.execute("SHOW default_transaction_read_only")
        assert cursor.fetchone() == ("off",)
    # Made read-only again when a reader borrows it.
    dbthreads.make_read_only()
    with connection.cursor() as cursor:
        cursor.execute("SHOW default_transaction_read_only")
        assert cursor.fetchone() == ("on",)
    connection.close()


@pytest.fixture
def writer_and_loop(pools) -> Iterator[None]:
    """The pools, on SQLite; the loop thread's own connection (which run_here() leaves without
    a busy timeout) closed afterwards, so the next test opens one as configured."""
    if connection.vendor != "sqlite":
        pytest.skip("run_here() runs on the loop's thread on SQLite only")
    yield
    connection.close()


def _create_topic_in_a_transaction(name: str) -> str:
    with transaction.atomic(durable=True):
        models.Topic.objects.create(name=name, partition_count=1, max_message_bytes=10)
    return _thread_name()


@pytest.mark.django_db(transaction=True)
async def test_run_here__on_the_loops_thread_when_nothing_writes(writer_and_loop):
    loop_thread = _thread_name()
    assert await dbthreads.run_here(_create_topic_in_a_transaction, "here") == loop_thread
    # Committed: the writer thread sees it.
    assert await dbthreads.run(lambda: models.Topic.objects.filter(name="here").exists())
    assert dbthreads.call_figures()[("loop", "_create_topic_in_a_transaction")].calls >= 1


def _refused() -> None:
    raise errors.InvalidRequest("refused")


@pytest.mark.django_db(transaction=True)
async def test_run_here__a_call_that_raises_is_counted_as_the_pools_count_theirs(writer_and_loop):
    before = dbthreads.call_figures().get(("loop", "_refused"), dbthreads.CallFigures()).calls
    with pytest.raises(errors.InvalidRequest):
        await dbthreads.run_here(_refused)
    assert dbthreads.call_figures()[("loop", "_refused")].calls == before + 1


@pytest.mark.django_db(transaction=True)
async def test_run_here__waits_for_the_writer_thread_and_goes_before_calls_asked_later(
    writer_and_loop,
):
    order: list[str] = []

    def slow() -> None:
        time.sleep(0.1)
        order.append("writer")

    def later() -> None:
        order.append("later")

    def now() -> str:
        order.append("here")
        return _create_topic_in_a_transaction("after")

    first = asyncio.ensure_future(dbthreads.run(slow))
    await asyncio.sleep(0)  # the slow call is on the writer thread
    started = time.monotonic()
    here = asyncio.ensure_future(dbthreads.run_here(now))
    await asyncio.sleep(0)  # waiting for the writer thread
    then = asyncio.ensure_future(dbthreads.run(later))
    assert await here == _thread_name()
    await asyncio.gather(first, then)
    assert order == ["writer", "here", "later"]
    assert time.monotonic() - started >= 0.05


@pytest.mark.django_db(transaction=True)
async def test_run_here__leaves_a_database_another_writes_to_the_writer_thread(writer_and_loop):
    # Another process's write lock: the loop does not wait for it (its busy timeout would stop
    # the loop), the writer thread does, and the call runs once.
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.2, other.execute, "COMMIT")
    started = time.monotonic()
    ran_on = await dbthreads.run_here(_create_topic_in_a_transaction, "later")
    assert ran_on.startswith("ferry-db")
    assert time.monotonic() - started >= 0.15
    assert await dbthreads.run(lambda: models.Topic.objects.filter(name="later").count()) == 1
    other.close()
    # The next call finds the database free again and runs on the loop.
    assert await dbthreads.run_here(_create_topic_in_a_transaction, "free") == _thread_name()


@pytest.fixture
def pools_on_postgresql(pools) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("run_here() on PostgreSQL")


def _lock_topic(name: str) -> str:
    """A bookkeeping transaction that takes the topic's row lock, as a push takes its group's."""
    with bulk.bookkeeping():
        list(models.Topic.objects.select_for_update().filter(name=name))
    return _thread_name()


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return int(pid)


def _other_session(sql: str, params: list[object], held: threading.Event, release: threading.Event):
    """sql in a transaction of another session, kept open until release is set."""
    with psycopg.connect(**connection.get_connection_params()) as other:
        other.execute(sql, params)
        held.set()
        release.wait(10)
        other.commit()


@pytest.mark.django_db(transaction=True)
async def test_run_here__on_postgresql_on_the_loop_once_a_call_went_well(pools_on_postgresql):
    # Nothing known of the database yet: a thread's call first, then the loop's own.
    assert (await dbthreads.run_here(_create_topic_in_a_transaction, "first")).startswith(
        "ferry-db"
    )
    assert await dbthreads.run_here(_create_topic_in_a_transaction, "then") == _thread_name()
    assert await dbthreads.run_here(_lock_topic, "then") == _thread_name()
    assert await dbthreads.run(lambda: models.Topic.objects.filter(name="then").exists())
    assert dbthreads.call_figures()[("loop", "_lock_topic")].calls >= 1


@pytest.mark.django_db(transaction=True)
async def test_run_here__on_postgresql_a_lock_held_elsewhere_is_waited_for_on_a_thread(
    pools_on_postgresql,
):
    await dbthreads.run_here(_create_topic_in_a_transaction, "locked")
    held, release = threading.Event(), threading.Event()
    sql = "SELECT id FROM broker_topic WHERE name = %s FOR UPDATE"
    holder = threading.Thread(target=_other_session, args=(sql, ["locked"], held, release))
    holder.start()
    assert await asyncio.to_thread(held.wait, 10)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.ensure_future(tick())
    asyncio.get_running_loop().call_later(0.4, release.set)
    started = time.monotonic()
    try:
        ran_on = await dbthreads.run_here(_lock_topic, "locked")
    finally:
        ticker.cancel()
        release.set()
        await asyncio.to_thread(holder.join)
    # The loop gave up after LOOP_LOCK_TIMEOUT_MS and ran on meanwhile; a thread waited.
    assert ran_on.startswith("ferry-db")
    assert time.monotonic() - started >= 0.3
    assert ticks >= 15
    # That call went well: the next runs on the loop again.
    assert await dbthreads.run_here(_lock_topic, "locked") == _thread_name()


@pytest.mark.django_db(transaction=True)
async def test_run_here__on_postgresql_a_lost_session_runs_the_call_again_on_a_thread(
    pools_on_postgresql,
):
    await dbthreads.run_here(_create_topic_in_a_transaction, "a")
    pid = await dbthreads.run_here(_backend_pid)  # the loop's own session
    assert pid != await dbthreads.run(_backend_pid)
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        await asyncio.to_thread(other.execute, "SELECT pg_terminate_backend(%s)", [pid])
    # Nothing of it committed on the loop: done once, on a thread.
    assert (await dbthreads.run_here(_create_topic_in_a_transaction, "b")).startswith("ferry-db")
    assert await dbthreads.run(lambda: models.Topic.objects.filter(name="b").count()) == 1
    # Then on the loop again, on a new session.
    assert await dbthreads.run_here(_backend_pid) not in (pid, await dbthreads.run(_backend_pid))
