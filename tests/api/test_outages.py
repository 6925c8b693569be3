"""REST under outages (issue 17): a full disk is 507 insufficient_storage and stores nothing;
a sync view whose PostgreSQL session was ended runs once more instead of failing."""

import pytest
from django.db import connection

from broker import models
from tests.sessions import terminate_own_session

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="only PostgreSQL ends sessions of its own accord"
)
sqlite_only = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite's page limit stands in for a full disk"
)


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_produce__full_disk_is_507_and_a_retry_with_the_same_ids_is_safe(api_client, topic_factory):
    topic = topic_factory()
    path = f"/api/v1/topics/{topic.name}/messages"
    body = {"messages": [{"id": f"m{i}", "value": "x" * 4000} for i in range(20)]}
    with connection.cursor() as cursor:
        # Free pages that earlier tests' deletes left would take the batch without growing the
        # file (the test failed so when run after tests/core): none are left after a VACUUM.
        cursor.execute("VACUUM")
        cursor.execute("PRAGMA page_count")
        (pages,) = cursor.fetchone()
        # The database may not grow on this connection (the tests' own): a full disk.
        cursor.execute(f"PRAGMA max_page_count = {pages}")
    try:
        refused = api_client.post(path, body, content_type="application/json")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA max_page_count = 1073741823")

    assert refused.status_code == 507, refused.content
    error = refused.json()["error"]
    assert error["code"] == "insufficient_storage"
    assert error["detail"] == {"retry_after": 1}
    assert not models.Message.objects.filter(partition__topic__name=topic.name).exists()

    stored = api_client.post(path, body, content_type="application/json")
    assert stored.status_code == 200
    assert [r["offset"] for r in stored.json()["results"]] == list(range(20))


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_sync_view__a_terminated_session_runs_again_on_a_new_one(
    api_client, topic_factory, settings
):
    topic = topic_factory()
    path = f"/api/v1/topics/{topic.name}/offsets"
    # The key is remembered, so the view's own query is the first to meet the ended session.
    settings.FERRY_AUTH_CACHE_SECONDS = 60
    assert api_client.get(path).status_code == 200
    # The connection lives on across requests (as the API's sync thread's does): the topic's
    # creation committed on it, yet this request committed nothing, so it may run again.
    terminate_own_session()

    response = api_client.get(path)

    assert response.status_code == 200, response.content
    assert response.json()["partitions"][0]["end_offset"] == 0
