"""Every kind of endpoint through a real Daphne process: sync views, async views, errors."""

import concurrent.futures

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def http(broker_url, key_factory):
    _, secret = key_factory("admin:*")
    with httpx.Client(
        base_url=f"{broker_url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    ) as client:
        yield client


def test_topics__sync_views_through_daphne(http):
    created = http.post("/topics", json={"name": "live", "partitions": 2})
    assert created.status_code == 201
    assert [t["name"] for t in http.get("/topics").json()] == ["live"]
    assert http.patch("/topics/live", json={"partitions": 3}).json()["partitions"] == 3
    assert http.get("/overview").status_code == 200
    assert http.delete("/topics/live").status_code == 204
    assert http.get("/topics/live").json()["error"]["code"] == "topic_not_found"


def test_api__json_errors_through_daphne(http):
    assert http.get("/nope").json()["error"]["code"] == "not_found"
    assert http.put("/topics").json()["error"]["code"] == "method_not_allowed"
    bad = http.post("/topics", content=b"{bad", headers={"Content-Type": "application/json"})
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "malformed_json")
    anonymous = httpx.get(f"{http.base_url}topics")
    assert anonymous.json()["error"]["code"] == "unauthenticated"


def test_produce__concurrent_clients_get_distinct_offsets(http, topic_factory):
    topic = topic_factory(partitions=1)

    def produce(n):
        response = http.post(
            f"/topics/{topic.name}/messages",
            json={"messages": [{"value": [n, i]} for i in range(20)]},
        )
        assert response.status_code == 200
        return [r["offset"] for r in response.json()["results"]]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        offsets = [o for batch in pool.map(produce, range(16)) for o in batch]
    assert sorted(offsets) == list(range(16 * 20))
