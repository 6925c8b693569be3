"""broker/core/outages.py: what a database failure means for the client, and the one retry on
a new connection when PostgreSQL ended the old one before anything committed (issue 17)."""

import sqlite3

import pytest
from django.db import connection
from django.db.utils import DatabaseError, InterfaceError, OperationalError

from broker import models
from broker.core import errors, log, outages
from broker.core.records import NewMessage
from tests.sessions import terminate_own_session

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
