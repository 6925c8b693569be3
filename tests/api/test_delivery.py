"""REST edge tests for acknowledged delivery: member polls with receipts, ack, nack, reject, extend.

The rules themselves (committed offsets, backoff, ordering): tests/core/test_delivery.py.
"""

import pytest

JSON = "application/json"

# Well formed, but naming no delivery: stale, not malformed.
STALE = "0123456789abcdef.1.0"


@pytest.fixture
def orders(api_client, topic_factory):
    """A one-partition topic "orders" holding the values 0 to 2, and member "m" of group "g"."""
    topic_factory("orders")
    messages = [{"value": i} for i in range(3)]
    response = api_client.post(
        "/api/v1/topics/orders/messages", {"messages": messages}, content_type=JSON
    )
    assert response.status_code == 200
    joined = api_client.post(
        "/api/v1/groups/g/members", {"topic": "orders", "member_id": "m"}, content_type=JSON
    )
    assert joined.status_code == 201
    return "orders"


def poll(client, topic, **options):
    body = {"topic": topic, "member_id": "m", **options}
    response = client.post("/api/v1/groups/g/poll", body, content_type=JSON)
    assert response.status_code == 200
    return response.json()["messages"]


def settle(client, verb, receipts, group="g", **fields):
    return client.post(
        f"/api/v1/groups/{group}/{verb}", {"receipts": receipts, **fields}, content_type=JSON
    )


def partition_lag(client):
    [topic] = client.get("/api/v1/groups/g").json()["topics"]
    return topic["partitions"][0]


def test_poll__member_gets_receipts(api_client, orders):
    messages = poll(api_client, orders)

    assert [m["value"] for m in messages] == [0, 1, 2]
    assert all(isinstance(m["receipt"], str) and m["receipt"] for m in messages)
    assert len({m["receipt"] for m in messages}) == 3
    assert [m["attempt"] for m in messages] == [1, 1, 1]
    assert all(m["deadline_ms"] > m["timestamp_ms"] for m in messages)
    assert partition_lag(api_client)["in_flight"] == 3


def test_poll__auto_commit_member_has_no_receipt(api_client, orders):
    messages = poll(api_client, orders, auto_commit=True)

    assert [(m["receipt"], m["deadline_ms"]) for m in messages] == [(None, None)] * 3
    assert (partition_lag(api_client)["committed_offset"], poll(api_client, orders)) == (3, [])


def test_ack__settles_then_nothing_more(api_client, orders):
    receipts = [m["receipt"] for m in poll(api_client, orders)]

    response = settle(api_client, "ack", receipts)

    assert response.status_code == 200
    assert response.json() == {"settled": 3, "stale": [], "dead_lettered": 0}
    assert poll(api_client, orders) == []
    lag = partition_lag(api_client)
    assert (lag["committed_offset"], lag["in_flight"]) == (3, 0)


def test_ack__twice_reports_stale(api_client, orders):
    receipts = [m["receipt"] for m in poll(api_client, orders)]
    settle(api_client, "ack", receipts[:1])

    response = settle(api_client, "ack", [*receipts[:2], STALE])

    assert response.json() == {
        "settled": 1,
        "stale": [receipts[0], STALE],
        "dead_lettered": 0,
    }


def test_ack__unknown_group(api_client, orders, error_of):
    assert error_of(settle(api_client, "ack", [STALE], group="nope")) == (404, "group_not_found")


def test_ack__without_consume(api_client, client_factory, orders, error_of):
    receipts = [m["receipt"] for m in poll(api_client, orders)]
    other_reader = client_factory("consume:payments")

    # Another topic's deliveries are, to this key, no deliveries: stale, not 403 naming the topic.
    response = settle(other_reader, "ack", receipts)
    assert response.json() == {"settled": 0, "stale": receipts, "dead_lettered": 0}
    assert "orders" not in response.content.decode()
    assert partition_lag(api_client)["in_flight"] == 3


@pytest.mark.parametrize(
    "body",
    [{"receipts": []}, {"receipts": ["x"], "receipt": "x"}, {}],
    ids=["empty", "unknown-field", "missing"],
)
def test_ack__bad_body(api_client, orders, error_of, body):
    response = api_client.post("/api/v1/groups/g/ack", body, content_type=JSON)

    assert error_of(response) == (422, "validation_error")


def test_nack__redelivered_with_attempt_2(api_client, orders):
    first = poll(api_client, orders, max_messages=1)

    response = settle(api_client, "nack", [first[0]["receipt"]], error="boom", delay_ms=0)

    assert response.json() == {"settled": 1, "stale": [], "dead_lettered": 0}
    again = poll(api_client, orders, max_messages=1)
    assert [(m["offset"], m["attempt"]) for m in again] == [(0, 2)]
    assert again[0]["receipt"] != first[0]["receipt"]
    assert settle(api_client, "ack", [first[0]["receipt"]]).json()["stale"] == [first[0]["receipt"]]


def test_nack__past_max_attempts_dead_letters(api_client, orders):
    api_client.patch("/api/v1/groups/g", {"max_attempts": 1}, content_type=JSON)
    receipts = [m["receipt"] for m in poll(api_client, orders, max_messages=1)]

    response = settle(api_client, "nack", receipts)

    assert response.json() == {"settled": 1, "stale": [], "dead_lettered": 1}


def test_nack__bad_delay(api_client, orders, error_of):
    receipts = [m["receipt"] for m in poll(api_client, orders)]

    assert error_of(settle(api_client, "nack", receipts, delay_ms=-1)) == (400, "invalid_request")
    assert partition_lag(api_client)["in_flight"] == 3


def test_nack__unknown_field(api_client, orders, error_of):
    response = settle(api_client, "nack", ["x"], delay=0)

    assert error_of(response) == (422, "validation_error")


def test_reject__straight_to_dead_letters(api_client, orders):
    receipts = [m["receipt"] for m in poll(api_client, orders, max_messages=2)]

    response = settle(api_client, "reject", receipts, error="unparseable")

    assert response.json() == {"settled": 2, "stale": [], "dead_lettered": 2}
    body = api_client.get("/api/v1/groups/g").json()
    assert body["dead_letters"] == 2
    assert body["topics"][0]["partitions"][0]["committed_offset"] == 2


def test_reject__unknown_group(api_client, orders, error_of):
    assert error_of(settle(api_client, "reject", [STALE], group="nope")) == (404, "group_not_found")


def test_extend__live_deliveries(api_client, orders):
    receipts = [m["receipt"] for m in poll(api_client, orders)]

    response = settle(api_client, "extend", [*receipts, STALE], extend_ms=60_000)

    assert response.json() == {"settled": 3, "stale": [STALE], "dead_lettered": 0}


def test_extend__out_of_range(api_client, orders, error_of):
    receipts = [m["receipt"] for m in poll(api_client, orders)]

    assert error_of(settle(api_client, "extend", receipts, extend_ms=1)) == (
        400,
        "invalid_request",
    )


def test_extend__missing_extend_ms(api_client, orders, error_of):
    assert error_of(settle(api_client, "extend", ["x"])) == (422, "validation_error")


@pytest.mark.parametrize(
    "receipt",
    ["nonsense", "a.ffffffffffffffffffff.1", "0123456789abcdef.8000000000000000.1", "0x1.2.3"],
)
@pytest.mark.parametrize("action", ["ack", "nack", "reject", "extend"])
def test_settle__malformed_receipt_is_422(api_client, orders, error_of, action, receipt):
    extra = {"extend_ms": 60_000} if action == "extend" else {}
    response = settle(api_client, action, [receipt], **extra)
    assert error_of(response) == (422, "validation_error")


def test_poll__plain_poll_dead_letters_expired(api_client, topic_factory):
    topic_factory("aged", message_ttl_ms=60_000)
    old = {"value": "old", "timestamp_ms": 1_000}
    response = api_client.post(
        "/api/v1/topics/aged/messages", {"messages": [old, {"value": "new"}]}, content_type=JSON
    )
    assert response.status_code == 200
    body = {"topic": "aged", "auto_commit": True}
    answer = api_client.post("/api/v1/groups/plain/poll", body, content_type=JSON).json()
    assert [m["value"] for m in answer["messages"]] == ["new"]
    assert (answer["expired"], answer["next_offsets"]) == (1, [{"partition": 0, "offset": 2}])
    letters = api_client.get("/api/v1/groups/plain/dlq").json()["items"]
    assert [(d["offset"], d["reason"]) for d in letters] == [(0, "expired")]
