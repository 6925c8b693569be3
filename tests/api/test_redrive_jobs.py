"""REST edge tests for redrive jobs: start (and dry run), progress, cancel."""

import pytest

from broker.core import redrives

JSON = "application/json"
pytestmark = pytest.mark.usefixtures("dead")


@pytest.fixture
def dead(api_client, topic_factory):
    """Group "g" with three rejected messages of topic "orders" in its dead-letter queue."""
    topic_factory("orders")
    messages = [{"value": n} for n in range(3)]
    api_client.post("/api/v1/topics/orders/messages", {"messages": messages}, content_type=JSON)
    api_client.post(
        "/api/v1/groups/g/members", {"topic": "orders", "member_id": "m"}, content_type=JSON
    )
    polled = api_client.post(
        "/api/v1/groups/g/poll", {"topic": "orders", "member_id": "m"}, content_type=JSON
    )
    receipts = [m["receipt"] for m in polled.json()["messages"]]
    api_client.post("/api/v1/groups/g/reject", {"receipts": receipts}, content_type=JSON)
    return [letter["id"] for letter in api_client.get("/api/v1/groups/g/dlq").json()["items"]]


def start(client, body, group="g"):
    return client.post(f"/api/v1/groups/{group}/dlq/redrive-jobs", body, content_type=JSON)


def test_start_redrive__dry_run_counts(api_client, dead):
    response = start(api_client, {"all": True, "dry_run": True})
    assert (response.status_code, response.json()) == (200, {"count": 3})
    response = start(api_client, {"ids": dead[:2], "dry_run": True})
    assert response.json() == {"count": 2}


def test_start_redrive__then_progress(api_client):
    response = start(api_client, {"all": True, "topic": "orders", "rate_per_second": 2})
    assert response.status_code == 202
    job = response.json()
    assert job["state"] == "queued"
    assert (job["total"], job["done"], job["progress"], job["topic"]) == (3, 0, 0.0, "orders")
    assert job["rate_per_second"] == 2
    redrives.run_redrive_jobs()
    got = api_client.get(f"/api/v1/redrive-jobs/{job['id']}").json()
    assert (got["state"], got["done"]) == ("running", 2)
    assert got["progress"] == pytest.approx(2 / 3)


def test_cancel_redrive(api_client):
    job = start(api_client, {"all": True}).json()
    response = api_client.delete(f"/api/v1/redrive-jobs/{job['id']}")
    assert (response.status_code, response.json()["state"]) == (200, "cancelled")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({}, 422, "validation_error"),  # neither ids nor all: never widens to the whole queue
        ({"all": True, "rate_per_second": 0}, 422, "validation_error"),
        ({"all": True, "rate_per_second": 10**6}, 400, "invalid_request"),
        ({"ids": [10**12]}, 404, "dead_letter_not_found"),
    ],
)
def test_start_redrive__errors(api_client, body, status, code):
    response = start(api_client, body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


def test_start_redrive__unknown_group_and_permission(api_client, client_factory):
    assert start(api_client, {"all": True}, group="nope").status_code == 404
    other = client_factory("consume:other")
    response = start(other, {"all": True, "topic": "orders"})
    assert response.json()["error"]["code"] == "permission_denied"


def test_get_redrive__unknown_or_not_visible(api_client, client_factory):
    job = start(api_client, {"all": True}).json()
    for client, job_id in ((api_client, 10**9), (client_factory("consume:other"), job["id"])):
        response = client.get(f"/api/v1/redrive-jobs/{job_id}")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "redrive_job_not_found"
        assert client.delete(f"/api/v1/redrive-jobs/{job_id}").status_code == 404
