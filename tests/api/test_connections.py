"""The API's sync views keep one database connection instead of opening one per request."""

import asyncio

import httpx
import pytest
from django.db.backends.signals import connection_created

from broker.core import keys
from mqsite.asgi import api_asgi_app


@pytest.mark.django_db(transaction=True)
def test_sync_api_requests_reuse_one_connection():
    _, secret = keys.create_api_key(keys.CONSOLE, "conn", [keys.parse_permission("admin:*")])
    opened = []

    def record(sender, connection, **kwargs):
        opened.append(connection)

    async def list_keys(times: int) -> None:
        transport = httpx.ASGITransport(app=api_asgi_app)  # type: ignore[arg-type]
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", headers=headers
        ) as c:
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
