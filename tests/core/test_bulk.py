"""bulk.run, bulk.run_many, bulk.select_models and bulk.update_rows behave as Django's cursor
and the ORM's own reads and saves."""

import threading
from collections.abc import Sequence

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from broker import models
from broker.core import bulk, groups, pgwire
from broker.core.log.append import MESSAGE_COLUMNS


def test_select_models__matches_the_orm(db, console):
    groups.configure_group(console, "g-bulk", retry_delays_ms=[100, 200], ordered=True)
    via_orm = models.ConsumerGroup.objects.get(name="g-bulk")
    (via_bulk,) = bulk.select_models(models.ConsumerGroup, "WHERE name = %s", ["g-bulk"])
    for field in models.ConsumerGroup._meta.concrete_fields:
        assert getattr(via_bulk, field.attname) == getattr(via_orm, field.attname), field.name
    assert via_bulk.retry_delays_ms == [100, 200]  # JSON decoded
    assert via_bulk.ordered is True  # a bool, not SQLite's 1
    assert via_bulk.created_at.tzinfo is not None  # an aware datetime, not a string
    assert not via_bulk._state.adding  # saved rows, as from_db marks them


def test_update_rows__saves_the_fields_and_auto_now(console, topic_factory):
    topic = topic_factory(partitions=2)
    group = models.ConsumerGroup.objects.create(name="g-rows")
    rows = [
        models.GroupOffset.objects.create(group=group, partition=p, committed_offset=0)
        for p in models.Partition.objects.filter(topic__name=topic.name).order_by("number")
    ]
    before = [r.updated_at for r in rows]
    rows[0].committed_offset, rows[1].committed_offset = 5, 7
    rows[0].delivered_offset = 9  # not among the fields: not saved
    bulk.update_rows(rows, ["committed_offset", "updated_at"])
    stored = {r.id: r for r in models.GroupOffset.objects.filter(group=group)}
    assert [stored[r.id].committed_offset for r in rows] == [5, 7]
    assert stored[rows[0].id].delivered_offset == 0
    assert all(stored[r.id].updated_at > b for r, b in zip(rows, before, strict=True))


def test_run__rows_placeholders_errors_and_the_query_log(db, console, topic_factory):
    """Straight through the driver, as a Django cursor would run it: "%s" placeholders and
    "%%" on both databases, Django's exceptions, and the statement in connection.queries."""
    topic = topic_factory(partitions=2)
    with CaptureQueriesContext(connection) as seen:
        rows = bulk.run(
            "SELECT number FROM broker_partition WHERE topic_id = %s AND 'a%%' = %s "
            "ORDER BY number",
            [topic.id, "a%"],
        )
    assert rows == [(0,), (1,)]
    assert len(seen.captured_queries) == 1
    with transaction.atomic():
        assert bulk.run("UPDATE broker_partition SET bytes_stored = 1 WHERE id < 0") == []
    partition = models.Partition.objects.filter(topic_id=topic.id).first()
    assert partition is not None
    # A duplicate (topic, number): the unique constraint, raised as Django's IntegrityError,
    # and the transaction around it can still roll back.
    with pytest.raises(IntegrityError), transaction.atomic():
        bulk.run(
            "INSERT INTO broker_partition (topic_id, number, next_offset, start_offset, "
            "bytes_stored) VALUES (%s, %s, 0, 0, 0)",
            [topic.id, partition.number],
        )
    assert models.Partition.objects.filter(topic_id=topic.id).count() == 2


def test_run_many__each_row_errors_and_one_logged_query(db, console, topic_factory):
    """One statement once per row, as Django's executemany runs it: "%s" and "%%", Django's
    exceptions (a failed row leaves the transaction to roll back whole), one logged query."""
    topic = topic_factory(partitions=3)
    ids = list(
        models.Partition.objects.filter(topic_id=topic.id)
        .order_by("number")
        .values_list("id", flat=True)
    )
    with CaptureQueriesContext(connection) as seen, transaction.atomic():
        bulk.run_many(
            "UPDATE broker_partition SET bytes_stored = %s WHERE id = %s AND 'a%%' = 'a%%'",
            [(7, ids[0]), (9, ids[2])],
        )
    stored = dict(
        models.Partition.objects.filter(topic_id=topic.id).values_list("id", "bytes_stored")
    )
    assert stored == {ids[0]: 7, ids[1]: 0, ids[2]: 9}
    updates = [q for q in seen.captured_queries if "UPDATE" in q["sql"]]
    assert len(updates) == (1 if connection.vendor == "sqlite" else 2)
    with pytest.raises(IntegrityError), transaction.atomic():
        bulk.run_many(
            "UPDATE broker_partition SET number = %s WHERE id = %s",
            [(5, ids[0]), (1, ids[2])],  # the second takes a number partition 1 has
        )
    numbers = models.Partition.objects.filter(topic_id=topic.id).order_by("id")
    assert list(numbers.values_list("number", flat=True)) == [0, 1, 2]


def test_insert_rows__an_insert_or_a_copy_stores_the_same_rows(db, console, topic_factory):
    """Below PG_COPY_MIN_ROWS a deferred multi-row INSERT, from it on a COPY (PostgreSQL; SQLite
    always INSERTs): the same rows either way, bytes, NULLs and JSON text included, seen by the
    transaction's next read; a row that breaks a constraint fails the transaction whole."""
    topic = topic_factory(partitions=1)
    pid = models.Partition.objects.get(topic_id=topic.id).id
    offset = 0
    for count in (1, bulk.PG_COPY_MIN_ROWS - 1, bulk.PG_COPY_MIN_ROWS):
        rows = [
            (
                pid,
                offset + i,
                1_000 + i,
                f"k{i}" if i % 2 else None,
                None,
                '{"h": "v"}',
                bytes([i % 256, 0, 255]),
                False,
                3,
                None,
            )
            for i in range(count)
        ]
        with transaction.atomic():
            bulk.insert_rows("broker_message", MESSAGE_COLUMNS, rows)
            (seen,) = bulk.run(
                'SELECT count(*) FROM broker_message WHERE partition_id = %s AND "offset" >= %s',
                [pid, offset],
            )
            assert seen == (count,)
        stored = models.Message.objects.filter(partition_id=pid, offset__gte=offset)
        assert [
            (m.offset, m.timestamp_ms, m.key, m.tag, m.headers, bytes(m.value), m.size_bytes)
            for m in stored.order_by("offset")
        ] == [(r[1], r[2], r[3], None, {"h": "v"}, r[6], 3) for r in rows], count
        offset += count
    for count in (2, bulk.PG_COPY_MIN_ROWS):
        # Each batch repeats an offset already stored: the unique (partition, offset) refuses it.
        rows = [
            (pid, offset + i - 1, 1, None, None, "{}", b"x", False, 1, None) for i in range(count)
        ]
        with pytest.raises(IntegrityError):
            _insert_then_read(rows)
        assert models.Message.objects.filter(partition_id=pid).count() == offset


def _insert_then_read(rows: Sequence[tuple[object, ...]]) -> None:
    with transaction.atomic():
        bulk.insert_rows("broker_message", MESSAGE_COLUMNS, rows)
        bulk.run("SELECT 1")  # a deferred INSERT's error comes with the next statement


def test_run__rows_only_of_statements_that_return_them(db, console, topic_factory):
    """An empty SELECT and a write return [], a write's RETURNING its rows: alone, and sent
    with a deferred write in one pipeline (PostgreSQL)."""
    topic = topic_factory(partitions=1)
    (pid,) = bulk.run("SELECT id FROM broker_partition WHERE topic_id = %s", [topic.id])[0]
    with transaction.atomic():
        for deferred in (False, True):
            if deferred:
                bulk.defer("UPDATE broker_partition SET bytes_stored = 2 WHERE id = %s", [pid])
            assert bulk.run("SELECT id FROM broker_partition WHERE id < 0") == []
            assert bulk.run("UPDATE broker_partition SET bytes_stored = 3 WHERE id < 0") == []
            assert bulk.run(
                "UPDATE broker_partition SET bytes_stored = bytes_stored + 1 WHERE id = %s "
                "RETURNING bytes_stored",
                [pid],
            ) == [(1 if not deferred else 3,)]


READ_TIMEOUT = "SELECT session_timeout_ms FROM broker_consumergroup WHERE name = %s"


def _timeout_of(name):
    return bulk.run(READ_TIMEOUT, [name])


SET_TIMEOUT = "UPDATE broker_consumergroup SET session_timeout_ms = %s WHERE name = %s"


def test_defer__before_the_next_statement_of_any_kind(db, console, pipelines):
    groups.configure_group(console, "g-defer")
    pipelines.clear()  # the set-up's
    with transaction.atomic():
        bulk.defer(SET_TIMEOUT, [1001, "g-defer"])
        assert _timeout_of("g-defer") == [(1001,)]
        bulk.defer(SET_TIMEOUT, [1002, "g-defer"])
        assert models.ConsumerGroup.objects.get(name="g-defer").session_timeout_ms == 1002
        bulk.defer(SET_TIMEOUT, [1003, "g-defer"])
        bulk.defer(SET_TIMEOUT, [1004, "g-defer"])
        assert _timeout_of("g-defer") == [(1004,)]
    # On PostgreSQL deferred writes share the next round trip: a read of bulk.run's (twice), or
    # a pipeline of their own right before a statement of Django's cursor.
    assert [len(p) for p in pipelines] == ([2, 1, 3] if connection.vendor == "postgresql" else [])


def _defer_then_fail(timeout, name):
    with transaction.atomic():
        bulk.defer(SET_TIMEOUT, [timeout, name])
        raise RuntimeError


@pytest.mark.django_db(transaction=True)
def test_defer__sent_with_the_commit_dropped_by_a_rollback(console, monkeypatch):
    groups.configure_group(console, "g-commit")
    committing = []
    real = bulk._pipeline

    def noted(db, statements, then=None):
        committing.append(then is not None)
        return real(db, statements, then)

    monkeypatch.setattr(bulk, "_pipeline", noted)
    with transaction.atomic():
        bulk.defer(SET_TIMEOUT, [2001, "g-commit"])  # no statement after it: the COMMIT
    assert _timeout_of("g-commit") == [(2001,)]
    # On PostgreSQL the write and the COMMIT went in one pipeline.
    assert committing == ([True] if connection.vendor == "postgresql" else [])
    with pytest.raises(RuntimeError):
        _defer_then_fail(2002, "g-commit")
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            _defer_then_fail(2003, "g-commit")  # in a savepoint
        assert _timeout_of("g-commit") == [(2001,)]
    assert _timeout_of("g-commit") == [(2001,)]  # the dropped write did not come back
    with transaction.atomic():
        bulk.defer(SET_TIMEOUT, [2004, "g-commit"])
        connection.close()  # lost with its connection
    assert _timeout_of("g-commit") == [(2001,)]


def test_defer__its_error_raised_by_the_next_statement(db, console):
    groups.configure_group(console, "g-a")
    groups.configure_group(console, "g-b")
    with pytest.raises(IntegrityError):
        _defer_rename_then_read("g-b", "g-a")


def _defer_rename_then_read(name, to):
    with transaction.atomic():
        bulk.defer("UPDATE broker_consumergroup SET name = %s WHERE name = %s", [to, name])
        _timeout_of(to)


def _read_once(name):
    """_timeout_of(name), and how many statements it ran (0: answered by a read ahead)."""
    with CaptureQueriesContext(connection) as ran:
        found = _timeout_of(name)
    return found, len(ran.captured_queries)


def test_read_ahead__answered_from_the_next_statements_round_trip(db, console, pipelines):
    groups.configure_group(console, "g-ahead")
    pipelines.clear()  # the set-up's
    postgresql = connection.vendor == "postgresql"
    with transaction.atomic():
        bulk.read_ahead(READ_TIMEOUT, ["g-ahead"])
        assert bulk.run("SELECT 1") == [(1,)]
        # On PostgreSQL the read went in that statement's pipeline, after it.
        assert _read_once("g-ahead") == ([(45_000,)], 0 if postgresql else 1)
        assert [len(p) for p in pipelines] == ([2] if postgresql else [])
        # Its rows answer once: the same read again runs.
        assert _read_once("g-ahead") == ([(45_000,)], 1)
        # A write between them, deferred or not, or another read, and the read runs itself.
        for between, expected in (
            (lambda: bulk.defer(SET_TIMEOUT, [3001, "g-ahead"]), 3001),
            (lambda: bulk.run(SET_TIMEOUT, [3002, "g-ahead"]), 3002),
            (lambda: bulk.run("SELECT 2"), 3002),
            (
                lambda: models.ConsumerGroup.objects.filter(name="g-ahead").update(
                    session_timeout_ms=3003
                ),
                3003,
            ),
        ):
            bulk.read_ahead(READ_TIMEOUT, ["g-ahead"])
            bulk.run("SELECT 1")
            between()
            found, ran = _read_once("g-ahead")
            assert found == [(expected,)]
            assert ran >= 1
        # Another statement, or other parameters, are not answered by it.
        bulk.read_ahead(READ_TIMEOUT, ["g-ahead"])
        bulk.run("SELECT 1")
        assert _read_once("g-other") == ([], 1)


def test_read_ahead__reads_announced_together_are_taken_in_any_order(db, console):
    groups.configure_group(console, "g-one", session_timeout_ms=31_000)
    groups.configure_group(console, "g-two", session_timeout_ms=32_000)
    postgresql = connection.vendor == "postgresql"
    with transaction.atomic():
        bulk.read_ahead(READ_TIMEOUT, ["g-one"])
        bulk.read_ahead(READ_TIMEOUT, ["g-two"])
        bulk.run("SELECT 1")
        assert _read_once("g-two") == ([(32_000,)], 0 if postgresql else 1)
        assert _read_once("g-one") == ([(31_000,)], 0 if postgresql else 1)


def test_read_ahead__kept_past_a_write_deferred_to_another_table(db, console):
    """A deferred write that names its table drops only the reads ahead of that table: an
    ack's DELETE of in-flight runs leaves the messages read with the offsets' lock."""
    groups.configure_group(console, "g-apart")
    postgresql = connection.vendor == "postgresql"
    with transaction.atomic():
        bulk.read_ahead(READ_TIMEOUT, ["g-apart"])
        bulk.run("SELECT 1")
        bulk.defer(
            "UPDATE broker_partition SET bytes_stored = 1 WHERE id < 0", table="broker_partition"
        )
        assert _read_once("g-apart") == ([(45_000,)], 0 if postgresql else 1)
        # A write to the table read: the read runs after it, and sees it.
        bulk.read_ahead(READ_TIMEOUT, ["g-apart"])
        bulk.run("SELECT 1")
        bulk.defer(SET_TIMEOUT, [3011, "g-apart"], table="broker_consumergroup")
        found, ran = _read_once("g-apart")
        assert found == [(3011,)]
        assert ran >= 1


def test_read_ahead__kept_past_a_copy_into_another_table(db, console, topic_factory):
    """A COPY (PostgreSQL, from PG_COPY_MIN_ROWS rows) drops only the reads ahead of the table it
    fills: a group commit's topic, read with its partitions' lock, stays read past its rows."""
    groups.configure_group(console, "g-copy")
    pid = models.Partition.objects.get(topic_id=topic_factory(partitions=1).id).id
    count_sql = "SELECT count(*) FROM broker_message WHERE partition_id = %s"
    postgresql = connection.vendor == "postgresql"

    def rows(start):
        return [
            (pid, start + i, 1, None, None, "{}", b"x", False, 1, None)
            for i in range(bulk.PG_COPY_MIN_ROWS)
        ]

    with transaction.atomic():
        bulk.read_ahead(READ_TIMEOUT, ["g-copy"])
        bulk.read_ahead(count_sql, [pid])
        bulk.run("SELECT 1")
        bulk.insert_rows("broker_message", MESSAGE_COLUMNS, rows(0))
        assert _read_once("g-copy") == ([(45_000,)], 0 if postgresql else 1)
        # The read of the table the COPY filled runs again, and sees its rows.
        with CaptureQueriesContext(connection) as ran:
            assert bulk.run(count_sql, [pid]) == [(bulk.PG_COPY_MIN_ROWS,)]
        assert len(ran.captured_queries) == 1
        # A write deferred before the COPY goes first, and still drops the reads of its table.
        bulk.read_ahead(READ_TIMEOUT, ["g-copy"])
        bulk.run("SELECT 1")
        bulk.defer(SET_TIMEOUT, [3021, "g-copy"], table="broker_consumergroup")
        bulk.insert_rows("broker_message", MESSAGE_COLUMNS, rows(bulk.PG_COPY_MIN_ROWS))
        assert _read_once("g-copy") == ([(3021,)], 1)


@pytest.mark.django_db(transaction=True)
def test_read_ahead__sees_what_committed_while_the_statement_before_it_waited(console):
    """The member read with its group's lock: a read ahead runs once the lock is granted, so it
    sees what the holder of the lock committed."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serializes writers at BEGIN: no statement waits for a row lock")
    groups.configure_group(console, "g-wait")
    lock = "SELECT id FROM broker_consumergroup WHERE name = %s FOR {}"
    holding, release = threading.Event(), threading.Event()

    def holder():
        try:
            with transaction.atomic():
                bulk.run(lock.format("NO KEY UPDATE"), ["g-wait"])
                bulk.run(SET_TIMEOUT, [4001, "g-wait"])
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert holding.wait(10)
        threading.Timer(0.3, release.set).start()
        with transaction.atomic():
            bulk.read_ahead(READ_TIMEOUT, ["g-wait"])
            bulk.run(lock.format("SHARE"), ["g-wait"])  # waits for the holder's commit
            assert _read_once("g-wait") == ([(4001,)], 0)
    finally:
        release.set()
        thread.join(10)


def test_run_together__each_statements_rows_in_order_in_one_round_trip(db, console, pipelines):
    """run_together: each statement's rows, in order, the deferred writes before them and the
    reads announced after them; on PostgreSQL all in one pipeline."""
    groups.configure_group(console, "g-together")
    pipelines.clear()  # the set-up's
    postgresql = connection.vendor == "postgresql"
    assert bulk.run_together([]) == []
    assert bulk.run_together([("SELECT 1", ()), (READ_TIMEOUT, ["g-together"])]) == [
        [(1,)],
        [(45_000,)],
    ]
    assert pipelines == ([["SELECT 1", READ_TIMEOUT]] if postgresql else [])
    pipelines.clear()
    with transaction.atomic():
        bulk.defer(SET_TIMEOUT, [4001, "g-together"])
        bulk.read_ahead(READ_TIMEOUT, ["g-together"])
        found = bulk.run_together([(READ_TIMEOUT, ["g-together"]), ("SELECT 2", ())])
        assert found == [[(4001,)], [(2,)]]
        if postgresql:
            assert pipelines == [[SET_TIMEOUT, READ_TIMEOUT, "SELECT 2", READ_TIMEOUT]]
            # The read announced went after them, and answers once.
            assert _read_once("g-together") == ([(4001,)], 0)
        assert _read_once("g-together") == ([(4001,)], 1)


def _settings() -> tuple[str, str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('synchronous_commit'), current_setting('lock_timeout'), "
            "current_setting('statement_timeout')"
        )
        return cursor.fetchone()


@pytest.mark.django_db(transaction=True)
def test_bookkeeping__commits_without_the_flush_and_with_the_calls_bounded_waits(pipelines):
    """On PostgreSQL a bookkeeping transaction's settings go with its first statement: no wait
    for the WAL's flush at its commit and, in a call on the event loop (pgwire.bounded_waits),
    the lock and statement timeouts; all for that transaction only."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's settings")
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = on")  # the test server's default is off
    try:
        _check_bookkeeping_settings(pipelines)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")  # the session goes back to the pool


def _check_bookkeeping_settings(pipelines: list[list[str]]) -> None:
    before = _settings()
    assert before[0] == "on"
    pipelines.clear()
    with bulk.bookkeeping():
        assert _settings() == ("off", before[1], before[2])
    # Sent in the round trip of the transaction's first statement (bulk.defer).
    assert pipelines[0] == ["SET LOCAL synchronous_commit = off"]
    assert _settings() == before
    pipelines.clear()
    with pgwire.bounded_waits(50, 250):
        limits = pgwire.wait_limits()
        with bulk.bookkeeping():
            assert _settings() == ("off", "50ms", "250ms")
    assert pipelines[0] == ["SET LOCAL synchronous_commit = off", limits]
    assert _settings() == before
