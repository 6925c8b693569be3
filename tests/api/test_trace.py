"""REST edge tests for message trace: the recorded lifecycle events of one message."""

import pytest

JSON = "application/json"

EVENT_FIELDS = {"at_ms", "event", "group", "member_id", "attempt", "detail"}


@pytest.fixture
def traced(api_client, topic_factory):
    """Topic "orders" with trace on: a message produced, delivered to "m", nacked, acked."""
    topic_factory("orders", partitions=2, trace=True)
    api_client.post(
        "/api/v1/topics/orders/messages",
        {"messages": [{"value": 1, "partition": 1}]},
        content_type=JSON,
    )
    api_client.post(
        "/api/v1/groups/g/members", {"topic": "orders", "member_id": "m"}, content_type=JSON
    )
    for verb, extra in (("nack", {"delay_ms": 0, "error": "boom"}), ("ack", {})):
        body = {"topic": "orders", "member_id": "m"}
        [message] = api_client.post("/api/v1/groups/g/poll", body, content_type=JSON).json()[
            "messages"
        ]
        api_client.post(
            f"/api/v1/groups/g/{verb}",
            {"receipts": [message["receipt"]], **extra},
            content_type=JSON,
        )
    return "orders"


def trace(client, topic, partition, offset):
    return client.get(f"/api/v1/topics/{topic}/partitions/{partition}/messages/{offset}/trace")


def test_get_trace__events_in_order(api_client, traced):
    response = trace(api_client, traced, 1, 0)

    assert response.status_code == 200
    body = response.json()
    assert (body["topic"], body["partition"], body["offset"]) == ("orders", 1, 0)
    events = body["events"]
    assert all(set(e) == EVENT_FIELDS for e in events)
    assert [e["event"] for e in events] == [
        "produced",
        "delivered",
        "nacked",
        "retry_scheduled",
        "delivered",
        "acked",
    ]
    produced, delivered, nacked = events[:3]
    assert (produced["group"], produced["member_id"], produced["attempt"]) == (None, None, None)
    assert (delivered["group"], delivered["member_id"], delivered["attempt"]) == ("g", "m", 1)
    assert nacked["detail"] == {"error": "boom"}
    assert events[-1]["attempt"] == 2
    assert [e["at_ms"] for e in events] == sorted(e["at_ms"] for e in events)


def test_get_trace__nothing_recorded(api_client, traced):
    assert trace(api_client, traced, 0, 7).json()["events"] == []


def test_get_trace__unknown_topic(api_client, error_of):
    assert error_of(trace(api_client, "nope", 0, 0)) == (404, "topic_not_found")


def test_get_trace__unknown_partition(api_client, traced, error_of):
    assert error_of(trace(api_client, traced, 2, 0)) == (404, "partition_not_found")


def test_get_trace__without_consume(client_factory, traced, error_of):
    producer = client_factory("produce:orders")

    assert error_of(trace(producer, traced, 1, 0)) == (403, "permission_denied")


def test_get_trace__negative_offset(api_client, traced, error_of):
    assert error_of(trace(api_client, traced, 1, -1)) == (422, "validation_error")
