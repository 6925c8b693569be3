"""Long polling against a real Daphne process: woken by the commit, not by a sleep loop."""

import threading
import time

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def http(broker_url, key_factory, topic_factory):
    _, secret = key_factory("admin:*")
    with httpx.Client(
        base_url=f"{broker_url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    ) as client:
        yield client


def produce_later(http, topic, delay_s):
    def run():
        time.sleep(delay_s)
        response = http.post(f"/topics/{topic}/messages", json={"messages": [{"value": "hi"}]})
        assert response.status_code == 200

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_fetch__long_poll_returns_when_message_arrives(http, topic_factory):
    topic = topic_factory()
    producer = produce_later(http, topic.name, 0.5)
    started = time.monotonic()
    response = http.get(
        f"/topics/{topic.name}/partitions/0/messages", params={"offset": 0, "max_wait_ms": 10_000}
    )
    elapsed = time.monotonic() - started
    producer.join()
    assert response.status_code == 200
    assert [m["value"] for m in response.json()["messages"]] == ["hi"]
    assert 0.4 < elapsed < 5, elapsed


def test_fetch__long_poll_times_out_empty(http, topic_factory):
    topic = topic_factory()
    started = time.monotonic()
    response = http.get(
        f"/topics/{topic.name}/partitions/0/messages", params={"offset": 0, "max_wait_ms": 400}
    )
    elapsed = time.monotonic() - started
    assert response.json()["messages"] == []
    assert 0.35 < elapsed < 5, elapsed


def test_poll__long_poll_wakes_group(http, topic_factory):
    topic = topic_factory(partitions=2)
    producer = produce_later(http, topic.name, 0.5)
    started = time.monotonic()
    response = http.post(
        "/groups/g/poll",
        json={"topic": topic.name, "max_wait_ms": 10_000, "auto_commit": True},
    )
    elapsed = time.monotonic() - started
    producer.join()
    body = response.json()
    assert [m["value"] for m in body["messages"]] == ["hi"]
    assert body["committed"] is True
    assert 0.4 < elapsed < 5, elapsed


def test_fetch__other_long_polls_keep_serving(http, topic_factory):
    """A waiting poll must not block the server: produce and fetch still answer meanwhile."""
    topic = topic_factory()
    results = []
    waiter = threading.Thread(
        target=lambda: results.append(
            http.get(
                f"/topics/{topic.name}/partitions/0/messages",
                params={"offset": 0, "max_wait_ms": 2000},
            )
        )
    )
    waiter.start()
    time.sleep(0.2)
    started = time.monotonic()
    assert http.get("/health").status_code == 200
    assert time.monotonic() - started < 1
    waiter.join()
    assert results[0].status_code == 200
    assert results[0].json()["messages"] == []
