"""/metrics through a real Daphne: request latencies by route template, the process table, the
database threads."""

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_metrics__latencies_and_processes_through_daphne(broker_url, key_factory, topic_factory):
    topic_factory("orders")
    _, secret = key_factory("admin:*")
    auth = {"Authorization": f"Bearer {secret}"}
    for _ in range(3):
        assert httpx.get(f"{broker_url}/api/v1/topics/orders", headers=auth).status_code == 200
    assert httpx.get(f"{broker_url}/api/v1/topics/nope", headers=auth).status_code == 404
    body = {"messages": [{"value": 1}]}
    produced = httpx.post(f"{broker_url}/api/v1/topics/orders/messages", json=body, headers=auth)
    assert produced.status_code == 200
    # The server's heartbeat thread lists it within one round (FERRY_PROCESS_HEARTBEAT_SECONDS).
    deadline = time.monotonic() + 15
    while True:
        response = httpx.get(f"{broker_url}/metrics")
        assert response.status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(response.text)}
        alive = {
            s.labels["kind"]: s.value for s in families["ferry_broker_processes_alive"].samples
        }
        if alive["server"] >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert alive["server"] >= 1
    counts = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["ferry_api_request_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    # One series per route template, not per topic.
    assert counts[("/api/v1/topics/<name>", "200")] >= 3
    assert counts[("/api/v1/topics/<name>", "404")] >= 1
    assert not any("orders" in route for route, _ in counts)
    # The produce's group commit ran on the server's database thread, and took some time there.
    write = frozenset({("pool", "write"), ("call", "append_batches")})
    database = {
        (s.name, frozenset(s.labels.items())): s.value
        for name in ("ferry_database_calls", "ferry_database_call_seconds")
        for s in families[name].samples
    }
    assert database[("ferry_database_calls_total", write)] >= 1
    assert database[("ferry_database_call_seconds_total", write)] > 0
