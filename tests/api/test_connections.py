"""The API's sync views keep one database connection instead of opening one per request."""

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.signals import connection_created

from mqsite.asgi import api_asgi_app


@pytest.mark.django_db(transaction=True)
async def test_sync_api_requests_reuse_one_connection():
    opened = []

    def record(sender, connection, **kwargs):
        opened.append(connection)

    connection_created.connect(record)
    transport = httpx.ASGITransport(app=api_asgi_app)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            for _ in range(20):
                response = await c.get("/api/v1/health")
                assert response.status_code == 200, response.text
    finally:
        connection_created.disconnect(record)
        # The kept connection lives on asgiref's sync thread; close it there, or PostgreSQL
        # refuses to drop the test database.
        await sync_to_async(lambda: connection.close())()
    # Before, each request opened a connection (and a cold page cache) and closed it at its end.
    assert len(opened) <= 1
