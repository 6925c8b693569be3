"""The console, the admin and /metrics under outages: the API's JSON errors, never Django's HTML
500 page (docs/console-ui.md#outages). A database that cannot be reached is 503 `unavailable`,
a full disk 507 `insufficient_storage`, both with Retry-After; a refused action stores nothing.
The same on PostgreSQL with the server stopped: tests/integration/test_faults.py."""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from broker import models

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite's file stands in for the database server"
)


@contextlib.contextmanager
def database_away(tmp_path: Path) -> Iterator[None]:
    """The database file where no directory is: every new connection fails to open it."""
    saved = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = str(tmp_path / "gone" / "db.sqlite3")
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["NAME"] = saved


@pytest.fixture
def unreachable(tmp_path: Path) -> Iterator[None]:
    with database_away(tmp_path):
        yield


def assert_outage(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    assert response["Retry-After"] == "1"
    error = response.json()["error"]
    assert error["code"] == code
    assert error["detail"]["retry_after"] == 1


@pytest.mark.django_db(transaction=True)
def test_console_page__database_unreachable_is_503_json(operator: Client, unreachable: None):
    for path in ("/", "/topics/", "/live/overview/", "/groups/g/live/"):
        assert_outage(operator.get(path), 503, "unavailable")


@pytest.mark.django_db(transaction=True)
def test_admin_and_metrics__database_unreachable_is_503_json(
    admin_client: Client, unreachable: None
):
    assert_outage(admin_client.get("/admin/broker/topic/"), 503, "unavailable")
    assert_outage(Client().get("/metrics"), 503, "unavailable")


@pytest.mark.django_db(transaction=True)
def test_console_page__back_by_itself_after_the_outage(operator: Client, tmp_path: Path):
    with database_away(tmp_path):
        assert operator.get("/topics/").status_code == 503
    assert operator.get("/topics/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_console_action__full_disk_is_507_json_and_stores_nothing(operator: Client):
    with connection.cursor() as cursor:
        cursor.execute("VACUUM")  # no free pages left for the write to take
        cursor.execute("PRAGMA page_count")
        (pages,) = cursor.fetchone()
        cursor.execute(f"PRAGMA max_page_count = {pages}")
    try:
        response = operator.post("/topics/create/", {"name": "full", "partitions": "1024"})
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA max_page_count = 1073741823")

    assert_outage(response, 507, "insufficient_storage")
    assert not models.Topic.objects.filter(name="full").exists()
