"""The hot paths' statements straight through libpq (core/pgwire.py), on PostgreSQL."""

import datetime
import hashlib
import os
from typing import Any

import pytest
from django.db import DataError, IntegrityError, connection, transaction
from psycopg import errors as psycopg_errors
from psycopg import pq as psycopg_pq

from broker import models
from broker.core import bulk, groups, pgwire

HELD = "SELECT count(*) FROM pg_prepared_statements WHERE statement = %s"
SET_TIMEOUT = "UPDATE broker_consumergroup SET session_timeout_ms = %s WHERE name = %s"
TIMEOUT_OF = "SELECT session_timeout_ms FROM broker_consumergroup WHERE name = %s"


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("pgwire is the PostgreSQL driver path")


def _held(sql: str) -> int:
    """How many prepared statements of the session are sql, asked through Django's cursor."""
    with connection.cursor() as cursor:
        cursor.execute(HELD, [pgwire.native(sql).decode()])
        return int(cursor.fetchone()[0])


def _fresh_counts() -> None:
    """Forget what psycopg's record of the session holds, as a rollback has it do: it counts a
    statement's runs per session, and other test files run TIMEOUT_OF's very text on this
    connection (tests/core/test_bulk.py; closing it would only hand it back to the pool), which
    would have it prepared a run early."""
    connection.ensure_connection()
    connection.connection._prepared.clear()


def _threshold() -> int:
    return int(connection.settings_dict["OPTIONS"]["prepare_threshold"])


def _run_till_prepared(sql: str, params: list[Any], rows: list[tuple[Any, ...]]) -> None:
    """Run sql one time more than the threshold (prepared by then), checking its rows."""
    for _ in range(_threshold() + 1):
        assert bulk.run(sql, params) == rows


def test_native__numbers_placeholders_and_unescapes_percent():
    assert pgwire.native("SELECT %s, %s WHERE x LIKE 'a%%'") == b"SELECT $1, $2 WHERE x LIKE 'a%'"
    with pytest.raises(ValueError, match="only %s"):
        pgwire.native("SELECT %(name)s")


@pytest.mark.django_db(transaction=True)
def test_run__dumps_and_loads_as_djangos_cursor_does():
    # Rows come back in binary here, as text through Django's cursor: the same Python values,
    # for every column type the models have (jsonb as its text, as Django reads it, json
    # parsed as psycopg does; timestamps aware, in the session's time zone).
    sql = (
        "SELECT %s::bigint, %s::text, %s::bytea, %s::boolean, %s::text, %s::jsonb, %s::json, "
        "%s::integer, %s::varchar(20), %s::timestamptz, '{\"b\": [1, 2]}'::jsonb"
    )
    params: list[Any] = [
        *(2**40, "zé", b"\x00\xff", True, None, '{"a": 1}', '{"c":  3}', 7, "x"),
        datetime.datetime(2026, 11, 26, 5, 0, 1, 250, tzinfo=datetime.UTC),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        expected = cursor.fetchall()
    assert bulk.run(sql, params) == expected
    assert isinstance(expected[0][5], str)
    assert isinstance(expected[0][10], str)
    group = models.ConsumerGroup.objects.create(name="wire-types", retry_delays_ms=[5, 50])
    (read,) = bulk.select_models(models.ConsumerGroup, "WHERE id = %s", [group.id])
    assert _fields(read) == _fields(models.ConsumerGroup.objects.get(id=group.id))
    assert read.retry_delays_ms == [5, 50]
    assert bulk.run("SELECT 1 WHERE false") == []
    assert bulk.run(SET_TIMEOUT, [1, "nobody"]) == []


def _fields(instance: models.ConsumerGroup) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def _write_then_fail(timeout: int, name: str) -> None:
    with transaction.atomic():
        bulk.run(SET_TIMEOUT, [timeout, name])
        raise RuntimeError


@pytest.mark.django_db(transaction=True)
def test_statements__prepared_once_run_threshold_times_and_again_after_a_rollback(console):
    _fresh_counts()
    groups.configure_group(console, "g-wire")
    for _ in range(_threshold()):
        assert bulk.run(TIMEOUT_OF, ["g-wire"]) == [(45_000,)]
    assert _held(TIMEOUT_OF) == 0
    assert bulk.run(TIMEOUT_OF, ["g-wire"]) == [(45_000,)]
    assert _held(TIMEOUT_OF) == 1
    # A rollback: psycopg deallocates every prepared statement of the session, its own and
    # these (one record for both); the next runs prepare again, with no error.
    with pytest.raises(RuntimeError):
        _write_then_fail(1, "g-wire")
    assert _held(TIMEOUT_OF) == 0
    _run_till_prepared(TIMEOUT_OF, ["g-wire"], [(45_000,)])
    assert _held(TIMEOUT_OF) == 1
    # A savepoint's rollback too.
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            _write_then_fail(2, "g-wire")
        _run_till_prepared(TIMEOUT_OF, ["g-wire"], [(45_000,)])
    assert _held(TIMEOUT_OF) == 1
    # Through psycopg's own cursor: the record is psycopg's, so it knows these are gone.
    connection.connection.execute("DEALLOCATE ALL")
    _run_till_prepared(TIMEOUT_OF, ["g-wire"], [(45_000,)])
    assert _held(TIMEOUT_OF) == 1


@pytest.mark.django_db(transaction=True)
def test_a_prepare_in_an_aborted_pipeline__not_counted_as_prepared(console):
    _fresh_counts()
    groups.configure_group(console, "g-abort")
    for _ in range(_threshold()):
        bulk.run(TIMEOUT_OF, ["g-abort"])

    def fail_then_read() -> None:
        with transaction.atomic():
            bulk.defer("SELECT 1/0")  # fails first: the PREPARE after it never runs
            bulk.run(TIMEOUT_OF, ["g-abort"])

    with pytest.raises(DataError):
        fail_then_read()
    assert _held(TIMEOUT_OF) == 0
    # Not taken for prepared ("prepared statement ... does not exist"): run, then prepared.
    _run_till_prepared(TIMEOUT_OF, ["g-abort"], [(45_000,)])
    assert _held(TIMEOUT_OF) == 1


@pytest.mark.django_db(transaction=True)
def test_an_error_in_a_pipeline__raised_as_djangos_and_nothing_of_it_stays(console):
    groups.configure_group(console, "g-error")
    group_id = models.ConsumerGroup.objects.get(name="g-error").id
    duplicate = "INSERT INTO broker_consumergroup (id, name, session_timeout_ms) VALUES (%s, %s, 1)"

    def defer_then_insert_a_duplicate() -> None:
        with transaction.atomic():
            bulk.defer(SET_TIMEOUT, [5, "g-error"])  # goes first, in the same round trip
            bulk.run(duplicate, [group_id, "g-error-2"])

    with pytest.raises(IntegrityError):
        defer_then_insert_a_duplicate()
    # The transaction rolled back whole, and the connection works on.
    assert bulk.run(TIMEOUT_OF, ["g-error"]) == [(45_000,)]
    with transaction.atomic():
        bulk.defer(SET_TIMEOUT, [6, "g-error"])
    assert bulk.run(TIMEOUT_OF, ["g-error"]) == [(6,)]


@pytest.mark.django_db(transaction=True)
def test_a_value_larger_than_the_sockets_buffers__sent_whole():
    value = bytes(range(256)) * (8 * 1024 * 1024 // 256)
    assert bulk.run("SELECT length(%s::bytea), md5(%s::bytea)", [value, value]) == [
        (len(value), hashlib.md5(value).hexdigest())
    ]


def test_usable__only_with_server_side_binding_and_a_plain_begin():
    class Raw:
        isolation_level = read_only = deferrable = None

    class Db:
        connection = Raw()
        settings_dict = {"OPTIONS": {"server_side_binding": True}}

    assert pgwire.usable(Db())
    Db.settings_dict = {"OPTIONS": {}}  # FERRY_PG_PREPARE_THRESHOLD=0: client-side binding
    assert not pgwire.usable(Db())
    Db.settings_dict = {"OPTIONS": {"server_side_binding": True}}
    Raw.read_only = True
    assert not pgwire.usable(Db())


@pytest.mark.django_db(transaction=True)
def test_a_connection_whose_socket_is_past_1024__works():
    # A server with a thousand WebSocket clients: select() cannot wait on such a socket.
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        for _ in range(50):  # a new session: pooled ones opened before still have low numbers
            connection.ensure_connection()
            if connection.connection.pgconn.socket > 1024:
                break
            connection.connection.close()  # the pool drops a closed one
            connection.close()
        assert connection.connection.pgconn.socket > 1024
        assert bulk.run("SELECT %s::int + 1", [41]) == [(42,)]
        with transaction.atomic():
            bulk.defer("SELECT 1")
            assert bulk.run("SELECT %s::text", ["x" * 1_000_000]) == [("x" * 1_000_000,)]
    finally:
        connection.close()
        for fd in held:
            os.close(fd)


@pytest.mark.django_db(transaction=True)
def test_past_prepared_max__the_oldest_deallocated_as_psycopg_does():
    connection.ensure_connection()
    raw = connection.connection
    kept = raw.prepared_max
    raw.prepared_max = 2
    sqls = [f"SELECT %s::int + {n}" for n in range(4)]
    try:
        for sql in sqls:
            _run_till_prepared(sql, [1], [(1 + sqls.index(sql),)])
        assert [_held(sql) for sql in sqls] == [0, 0, 1, 1]
    finally:
        raw.prepared_max = kept


def test_pipeline_sync__goes_through_the_libpq_psycopg_loaded():
    """The wheel's libpq, found in the process, so the Sync lets go of the GIL (no fallback)."""
    assert psycopg_pq.__impl__ in ("binary", "c")
    assert pgwire._LIBPQ is not None
    with open("/proc/self/maps") as maps:
        loaded = {line.split(maxsplit=5)[5].strip() for line in maps if "/libpq" in line}
    assert loaded == {pgwire._LIBPQ._name}
    assert pgwire._LIBPQ_HELD is not None


@pytest.mark.django_db(transaction=True)
def test_is_busy__as_psycopg_says():
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    assert pgwire._is_busy(pgconn) is False
    pgconn.send_query(b"SELECT pg_sleep(0.2)")
    assert pgwire._is_busy(pgconn) is bool(pgconn.is_busy()) is True
    while pgconn.get_result() is not None:  # blocks until the statement ends
        pass
    assert pgwire._is_busy(pgconn) is False


@pytest.mark.django_db(transaction=True)
def test_pipeline_sync__outside_pipeline_mode_raises_as_psycopg_would():
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with pytest.raises(psycopg_errors.OperationalError, match="sync failed"):
        pgwire._pipeline_sync(pgconn)
    # The connection is unharmed.
    assert bulk.run("SELECT 1") == [(1,)]


@pytest.mark.django_db(transaction=True)
def test_a_list_of_ints__sent_as_bigints_whatever_the_first_list_held():
    # psycopg picks a list's element type from its largest number (smallint for [1, 2]), and
    # its dumper cache then gave every later list of ints that type: an ack's
    # "id = ANY(%s)" failed once the in-flight ids passed 32,767 on a connection whose first
    # ack named smaller ones.
    sql = "SELECT x FROM unnest(%s) AS x ORDER BY x"
    for numbers in ([1, 2], [40_000, 3], [2**40], [7], [-(2**35), 5]):
        assert bulk.run(sql, [numbers]) == [(n,) for n in sorted(numbers)]
    assert bulk.run("SELECT pg_typeof(%s)::text", [[1]]) == [("bigint[]",)]
    assert bulk.run("SELECT x FROM unnest(%s::text[]) AS x", [["a", "b"]]) == [("a",), ("b",)]
