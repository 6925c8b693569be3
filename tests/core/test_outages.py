"""broker/core/outages.py: what a database failure means for the client, and the one retry on
a new connection when PostgreSQL ended the old one before anything committed (issue 17)."""

import contextlib
import socket
import sqlite3
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from django.db.utils import DatabaseError, InterfaceError, OperationalError

from broker import models
from broker.core import errors, log, outages
from broker.core.records import NewMessage
from tests.integration.conftest import free_port
from tests.sessions import terminate_own_session

# Longer than psycopg_pool's first three retries (1 + 2 + 4 s).
OUTAGE_S = 8

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="only PostgreSQL ends sessions of its own accord"
)


def test_classify__unreachable_database_is_unavailable_with_retry_after():
    found = outages.classify(OperationalError("connection refused"))

    assert isinstance(found, errors.Unavailable)
    assert found.code == "unavailable"
    assert found.detail == {"retry_after": 1, "dependency": "database"}
    assert isinstance(
        outages.classify(InterfaceError("connection already closed")), errors.Unavailable
    )


def test_classify__full_disk_is_insufficient_storage():
    sqlite_full = OperationalError("database or disk is full")
    sqlite_full.__cause__ = sqlite3.OperationalError("database or disk is full")
    postgres_full = DatabaseError('could not extend file "base/1/2": No space left on device')

    for exc in (sqlite_full, postgres_full, sqlite3.OperationalError("database or disk is full")):
        found = outages.classify(exc)
        assert isinstance(found, errors.InsufficientStorage), exc
        assert found.code == "insufficient_storage"


def test_classify__anything_else_is_not_an_outage():
    assert outages.classify(ValueError("bug")) is None
    assert outages.classify(DatabaseError("syntax error")) is None


def test_call_with_reconnect__an_error_of_a_usable_connection_is_not_retried(db):
    calls = []

    def fails():
        calls.append(1)
        raise OperationalError("database or disk is full")

    with pytest.raises(OperationalError):
        outages.call_with_reconnect(fails)
    assert calls == [1]


def test_is_lost_connection__not_a_borrow_that_timed_out():
    """The pool tried to connect for FERRY_DB_POOL_TIMEOUT_SECONDS: no session was lost, and
    running the call again would only make the client wait as long again for its 503. A
    connect that failed on its own (no pool) is lost, and cheap to try once more."""
    pytest.importorskip("psycopg_pool")
    from psycopg_pool import PoolTimeout

    never_connected: Any = SimpleNamespace(connection=None)  # as Django leaves a failed connect
    timed_out = OperationalError("couldn't get a connection after 5.00 sec")
    timed_out.__cause__ = PoolTimeout("couldn't get a connection after 5.00 sec")
    refused = OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    assert not outages.is_lost_connection(timed_out, never_connected)
    assert outages.is_lost_connection(refused, never_connected)
    assert isinstance(outages.classify(timed_out), errors.Unavailable)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_call_with_reconnect__a_read_on_a_terminated_session_runs_again(topic_factory, console):
    topic = topic_factory()
    terminate_own_session()

    described = outages.call_with_reconnect(log.list_offsets, console, topic.name, None)

    assert [o.end_offset for o in described] == [0]


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_call_with_reconnect__a_write_that_never_reached_commit_runs_again(topic_factory, console):
    topic = topic_factory()
    terminate_own_session()

    results = outages.call_with_reconnect(
        log.append_messages, console, topic.name, [NewMessage(b"1", client_id="a")]
    )

    assert [(r.offset, r.duplicate) for r in results] == [(0, False)]
    assert models.Message.objects.filter(partition__topic__name=topic.name).count() == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_call_with_reconnect__not_again_once_a_commit_was_sent(topic_factory, console):
    topic = topic_factory()
    calls = []

    def append_then_lose_the_connection():
        calls.append(1)
        log.append_messages(console, topic.name, [NewMessage(b"1", client_id="b")])
        terminate_own_session()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    with pytest.raises(OperationalError):
        outages.call_with_reconnect(append_then_lose_the_connection)

    assert calls == [1]
    assert models.Message.objects.filter(partition__topic__name=topic.name).count() == 1


class _Forwarder:
    """A loopback port that forwards to the test's PostgreSQL once started: the database as a
    pool sees it, unreachable (connection refused) until then."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.stopping = threading.Event()
        self.sockets: list[socket.socket] = []

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.settimeout(0.1)
        self.sockets.append(listener)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@postgres_only
def test_pool__back_within_a_second_or_so_of_the_database_after_a_long_outage():
    """psycopg_pool retries a failed connect after 1, 2, 4, 8 … s, so a pool whose database was
    away for 8 s came back up to 7 s after it did. With Ferry's settings an attempt gives up
    after RECONNECT_SECONDS and the next borrow starts a new one at once (docs/operations.md)."""
    from psycopg_pool import ConnectionPool, PoolTimeout

    from mqsite import settings as site

    params = connection.get_connection_params()
    database = _Forwarder((params["host"], int(params["port"])))
    pool = ConnectionPool(
        kwargs={**params, "host": "127.0.0.1", "port": database.port, "autocommit": True},
        open=False,
        check=ConnectionPool.check_connection,
        **site.database_config()["OPTIONS"]["pool"],
    )
    try:
        pool.open(wait=False)
        away_until = time.monotonic() + OUTAGE_S
        while time.monotonic() < away_until:  # borrowers meanwhile, as a server has
            with pytest.raises(PoolTimeout):
                pool.getconn(timeout=0.5)
        database.start()
        back = time.monotonic()
        while True:
            try:
                conn = pool.getconn(timeout=0.2)
                break
            except PoolTimeout:
                assert time.monotonic() - back < 10, "the pool never came back"
        back_s = time.monotonic() - back
        assert conn.execute("SELECT 1").fetchone() == (1,)
        pool.putconn(conn)
    finally:
        pool.close()
        database.stop()
    assert back_s < site.RECONNECT_SECONDS, back_s
