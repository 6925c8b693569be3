"""Shared fixtures: factories for keys and topics, an authenticated API client, live servers."""

import gc
import itertools
import signal
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from django.db import connection, connections
from django.test import Client

from broker.core import bulk, keys, topics
from broker.core.log import append
from broker.core.records import Principal, TopicInfo
from tests.sessions import LingeringSession, end_lingering_sessions

_names = itertools.count()

# A suite started as a background job of a script (a non-interactive shell's `&`) inherits
# SIGINT ignored, and so would every server it starts: Twisted leaves an ignored SIGINT alone,
# and test_shutdown's Ctrl-C would then do nothing. The suite's servers get the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, which no session may outlive (PostgreSQL).

    PostgreSQL refuses to drop a database while any session is open on it. One left open (as a
    pooled connection was, returned just before its pool closed: docs/benchmarks.md) is ended
    here and named in a warning (the process holding it), instead of failing the run's last
    test.
    """
    yield
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock():
        connections.close_all()
        # This process's own pool (as pytest-django would close it, only later).
        connection.close_pool()  # type: ignore[attr-defined]
        gc.collect()
        left = end_lingering_sessions()
    if left:
        message = f"sessions ended at the end of the run: {left}"
        warnings.warn(message, LingeringSession, stacklevel=1)


@pytest.fixture(autouse=True)
def _ids_unseen_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's first batch stores its client ids without a lookup first, as a process's does.

    A duplicate id makes the process look ids up for a while (log.met_stored_id); without this,
    whether a test takes the lookup or not would depend on the tests before it.
    """
    monkeypatch.setattr(append, "_look_up_ids_until", 0.0)


@pytest.fixture(autouse=True)
def _close_api_thread_connection() -> Iterator[None]:
    """Close the connection of asgiref's one sync thread after each test.

    The API's sync views keep it across requests (mqsite/asgi.py); one a test opened, left
    open, makes PostgreSQL refuse to drop the test database at the end of the run.
    """
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


@pytest.fixture
def console() -> Principal:
    return keys.CONSOLE


@pytest.fixture
def key_factory(db: None) -> Callable[..., tuple[Principal, str]]:
    """Create an API key; returns its principal and its secret."""

    def make(*permissions: str, name: str | None = None) -> tuple[Principal, str]:
        perms = [keys.parse_permission(p) for p in permissions or ("admin:*",)]
        _, secret = keys.create_api_key(keys.CONSOLE, name or f"key-{next(_names)}", perms)
        return keys.authenticate(secret), secret

    return make


@pytest.fixture
def topic_factory(db: None) -> Callable[..., TopicInfo]:
    def make(name: str | None = None, partitions: int = 1, **options: Any) -> TopicInfo:
        return topics.create_topic(
            keys.CONSOLE, name or f"topic-{next(_names)}", partitions, **options
        )

    return make


@pytest.fixture
def client_factory(key_factory: Callable[..., tuple[Principal, str]]) -> Callable[..., Client]:
    """A Django test client authenticated with a new key holding these permissions."""

    def make(*permissions: str) -> Client:
        _, secret = key_factory(*permissions)
        return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")

    return make


@pytest.fixture
def pipelines(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The statements (their SQL) of each round trip bulk sends as a pipeline, as they go: on
    PostgreSQL the deferred writes and announced reads sent with a statement (bulk._pipeline)."""
    sent: list[list[str]] = []
    real = bulk._pipeline

    def recorded(db: Any, statements: Any, then: Any = None) -> Any:
        sent.append([sql for sql, _ in statements])
        return real(db, statements, then)

    monkeypatch.setattr(bulk, "_pipeline", recorded)
    return sent


@pytest.fixture
def api_client(client_factory: Callable[..., Client]) -> Client:
    """A client whose key holds admin:* (every permission)."""
    return client_factory("admin:*")
