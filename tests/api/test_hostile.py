"""Hostile or careless bodies: bounded integers, strict types, deep nesting, unexpected errors.

Each answers the documented JSON error body (docs/api.md#errors), never an HTML 500.
"""

import json

import pytest
from django.test import Client

from broker.core import topics

TOPICS = "/api/v1/topics"
HUGE = 2**63
JSON = "application/json"


def call(client: Client, method: str, path: str, body):
    # json, not orjson: orjson refuses integers past 64 bits, which is what is sent here.
    return getattr(client, method)(path, json.dumps(body), content_type=JSON)


@pytest.fixture
def orders(topic_factory):
    return topic_factory("orders").name


@pytest.mark.parametrize(
    "field", ["retention_ms", "capacity", "max_message_bytes", "retention_bytes", "message_ttl_ms"]
)
@pytest.mark.parametrize("value", [HUGE, -HUGE - 1, 2**64, 10**30])
def test_topic_limits__past_64_bits_are_422(api_client, orders, error_of, field, value):
    created = call(api_client, "post", TOPICS, {"name": "new", field: value})
    assert error_of(created) == (422, "validation_error")
    patched = call(api_client, "patch", f"{TOPICS}/{orders}", {field: value})
    assert error_of(patched) == (422, "validation_error")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/groups/g/commit", {"topic": "orders", "offsets": [{"partition": 0, "offset": HUGE}]}),
        ("/groups/g/commit", {"topic": "orders", "offsets": [{"partition": 2**31, "offset": 0}]}),
        ("/groups/g/poll", {"topic": "orders", "max_messages": HUGE}),
        ("/groups/g/nack", {"receipts": ["0123456789abcdef.1.0"], "delay_ms": HUGE}),
        ("/groups/g/extend", {"receipts": ["0123456789abcdef.1.0"], "extend_ms": HUGE}),
        ("/topics/orders/messages", {"messages": [{"value": 1, "delay_ms": HUGE}]}),
        ("/topics/orders/messages", {"messages": [{"value": 1, "partition": HUGE}]}),
        ("/groups/g/reset", {"topic": "orders", "to": "shift", "shift_by": HUGE}),
    ],
)
def test_integers_past_their_column__are_422(api_client, orders, error_of, path, body):
    assert error_of(call(api_client, "post", f"/api/v1{path}", body)) == (422, "validation_error")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/groups/g/poll", {"topic": "orders", "max_messages": True}),
        ("post", TOPICS.removeprefix("/api/v1") + "", {"name": "t", "trace": 0}),
        ("post", TOPICS.removeprefix("/api/v1"), {"name": "t", "partitions": True}),
        ("patch", "/groups/g", {"retry_delays_ms": [False]}),
        ("patch", "/groups/g", {"ordered": 1}),
        ("post", "/topics/orders/messages", {"messages": [{"value": 1, "partition": False}]}),
        ("post", "/groups/g/poll", {"topic": "orders", "auto_commit": "yes"}),
        ("post", "/groups/g/poll", {"topic": "orders", "max_messages": 1.0}),
    ],
)
def test_booleans_are_not_integers__nor_integers_booleans(
    api_client, orders, error_of, method, path, body
):
    response = call(api_client, method, f"/api/v1{path}", body)
    assert error_of(response) == (422, "validation_error")


def test_poll__max_messages_true_delivers_nothing(api_client, orders, error_of):
    call(api_client, "post", f"{TOPICS}/orders/messages", {"messages": [{"value": 1}]})
    response = call(
        api_client, "post", "/api/v1/groups/g/poll", {"topic": "orders", "max_messages": True}
    )
    assert error_of(response) == (422, "validation_error")
    polled = call(api_client, "post", "/api/v1/groups/g/poll", {"topic": "orders"})
    assert [m["value"] for m in polled.json()["messages"]] == [1]


def nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


@pytest.mark.parametrize("depth", [255, 600, 1000])
def test_produce__value_nested_deeper_than_storable_is_422(api_client, orders, error_of, depth):
    body = b'{"messages": [{"value": ' + nested(depth) + b"}]}"
    response = api_client.post(f"{TOPICS}/orders/messages", body, content_type=JSON)
    assert error_of(response) == (422, "validation_error")


def test_body_nested_past_the_parser__is_400(api_client, orders, error_of):
    body = b'{"messages": [{"value": ' + nested(5000) + b"}]}"
    response = api_client.post(f"{TOPICS}/orders/messages", body, content_type=JSON)
    assert error_of(response) == (400, "malformed_json")


def test_unexpected_error__is_the_json_error_body(api_client, orders, error_of, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(topics, "describe_topic", broken)
    response = api_client.get(f"{TOPICS}/orders")
    assert error_of(response) == (500, "internal_error")
    assert "a bug" not in response.json()["error"]["message"]
