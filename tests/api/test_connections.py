"""The API's sync views keep one database connection instead of opening one per request."""

import asyncio
import threading

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.core import signals
from django.db import connections
from django.db.backends.signals import connection_created

from broker.core import keys, topics
from mqsite.asgi import api_asgi_app


def api_client(secret: str) -> httpx.AsyncClient:
    """A client of the API's own ASGI handler, in this process."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api_asgi_app),  # type: ignore[arg-type]
        base_url="http://testserver",
        headers={"Authorization": f"Bearer {secret}"},
    )


@pytest.mark.django_db(transaction=True)
def test_sync_api_requests_reuse_one_connection():
    _, secret = keys.create_api_key(keys.CONSOLE, "conn", [keys.parse_permission("admin:*")])
    opened = []

    def record(sender, connection, **kwargs):
        opened.append(connection)

    async def list_keys(times: int) -> None:
        async with api_client(secret) as c:
            for _ in range(times):
                response = await c.get("/api/v1/keys")  # a sync view
                assert response.status_code == 200, response.text

    asyncio.run(list_keys(1))  # the sync thread's connection, opened once
    connection_created.connect(record)
    try:
        asyncio.run(list_keys(20))
    finally:
        connection_created.disconnect(record)
    # Before, each request opened a connection (and a cold page cache) and closed it at its end.
    # (tests/conftest.py closes the kept one after the test.)
    assert opened == []


@pytest.mark.django_db(transaction=True)
def test_request_signals_hop_to_the_sync_thread_only_for_sync_views():
    """Django's handler hopped to a sync thread twice per request for its signals; the API's
    sends request_started on the sync view's own thread, in the view's hop, and none for an
    async view (mqsite/api_handler.py)."""
    _, secret = keys.create_api_key(keys.CONSOLE, "sig", [keys.parse_permission("admin:*")])
    topics.create_topic(keys.CONSOLE, "sig.t", partitions=1)
    started: list[str] = []
    finished: list[str] = []

    def on_started(sender, **kwargs):
        started.append(threading.current_thread().name)

    def on_finished(sender, **kwargs):
        finished.append(threading.current_thread().name)

    async def requests() -> None:
        async with api_client(secret) as c:
            body = {"messages": [{"value": "x"}]}
            response = await c.post("/api/v1/topics/sig.t/messages", json=body)
            assert response.status_code == 200, response.text  # an async view
            assert started == []
            response = await c.get("/api/v1/keys")  # a sync view
            assert response.status_code == 200, response.text

    signals.request_started.connect(on_started)
    signals.request_finished.connect(on_finished)
    try:
        asyncio.run(requests())
    finally:
        signals.request_started.disconnect(on_started)
        signals.request_finished.disconnect(on_finished)
    loop_thread = threading.current_thread().name  # asyncio.run's loop runs on this thread
    assert len(started) == 1
    assert started[0] != loop_thread
    assert finished == [loop_thread, loop_thread]


@pytest.mark.django_db(transaction=True)
def test_a_connection_an_error_left_unusable_is_closed_after_the_sync_view():
    _, secret = keys.create_api_key(keys.CONSOLE, "bad", [keys.parse_permission("admin:*")])

    async def list_keys() -> None:
        async with api_client(secret) as c:
            assert (await c.get("/api/v1/keys")).status_code == 200

    asyncio.run(list_keys())

    def break_it() -> object:
        conn = connections["default"]
        conn.errors_occurred = True
        conn.is_usable = lambda: False  # type: ignore[method-assign]
        return conn.connection

    # Under asyncio.run, sync_to_async runs on the thread the API's sync views use.
    broken = asyncio.run(sync_to_async(break_it)())
    asyncio.run(list_keys())

    def current() -> object:
        return connections["default"].connection

    assert asyncio.run(sync_to_async(current)()) is not broken
