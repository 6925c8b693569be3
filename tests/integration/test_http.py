"""Every kind of endpoint through a real Daphne process: sync views, async views, errors."""

import concurrent.futures
import time

import httpx
import orjson
import pytest

from tests.integration.conftest import start_daphne, stop

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


def test_parsing_budget__a_real_server_answers_503_busy(key_factory, topic_factory):
    """A request holds its body's bytes until answered; one that would go over gets 503 at once.

    Daphne hands the application a body only once it has arrived whole, so a long poll (a small
    body, answered two seconds later) is what holds the budget here.
    """
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    poll = orjson.dumps({"topic": topic, "max_wait_ms": 2000})
    produce = orjson.dumps({"messages": [{"value": "x" * 100}]})
    server, url = start_daphne(FERRY_MAX_PARSING_BYTES=str(len(poll) + len(produce) - 1))
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(
                httpx.post, f"{url}/api/v1/groups/g/poll", content=poll, headers=headers, timeout=10
            )
            time.sleep(0.5)
            busy = httpx.post(
                f"{url}/api/v1/topics/{topic}/messages", content=produce, headers=headers
            )
            polled = waiting.result()
        after = httpx.post(
            f"{url}/api/v1/topics/{topic}/messages", content=produce, headers=headers
        )
    finally:
        stop(server)
    assert busy.status_code == 503
    assert busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "busy"
    assert busy.json()["error"]["detail"]["retry_after"] == 1
    assert polled.status_code == 200
    assert after.status_code == 200
