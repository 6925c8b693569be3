"""REST edge tests for delayed messages: produce with a delay, list and cancel scheduled ones."""

import base64
import time

import pytest

from broker import models
from broker.core import scheduling

JSON = "application/json"
MINUTE_MS = 60_000


def produce(client, topic, *messages):
    return client.post(
        f"/api/v1/topics/{topic}/messages", {"messages": messages}, content_type=JSON
    )


def fetch(client, topic, partition=0, **params):
    return client.get(f"/api/v1/topics/{topic}/partitions/{partition}/messages", params)


def list_scheduled(client, topic, **params):
    return client.get(f"/api/v1/topics/{topic}/scheduled", params)


def cancel(client, scheduled_id):
    return client.delete(f"/api/v1/scheduled/{scheduled_id}")


def release_all():
    """Make every scheduled message due and run the scheduler once, as its periodic job does."""
    models.ScheduledMessage.objects.update(due_ms=0)
    return scheduling.release_due()


def now_ms():
    return time.time_ns() // 1_000_000


def test_produce__delay_ms_is_scheduled(api_client, topic_factory, end_offsets):
    topic_factory("orders")
    before = now_ms()

    response = produce(api_client, "orders", {"value": {"n": 1}, "delay_ms": MINUTE_MS})

    assert response.status_code == 200
    [result] = response.json()["results"]
    assert set(result) == {"scheduled_id", "deliver_at_ms", "duplicate"}
    assert result["duplicate"] is False
    assert before + MINUTE_MS <= result["deliver_at_ms"] <= now_ms() + MINUTE_MS
    assert end_offsets("orders") == [0]


def test_produce__level_is_scheduled(api_client, topic_factory):
    topic_factory("orders")
    before = now_ms()

    [result] = produce(api_client, "orders", {"value": 1, "level": 3}).json()["results"]

    # Level 3 is RocketMQ's 10 s.
    assert before + 10_000 <= result["deliver_at_ms"] <= now_ms() + 10_000


def test_produce__deliver_at_ms_is_scheduled(api_client, topic_factory):
    topic_factory("orders")
    at = now_ms() + MINUTE_MS

    [result] = produce(api_client, "orders", {"value": 1, "deliver_at_ms": at}).json()["results"]

    assert result["deliver_at_ms"] == at


def test_produce__null_delay_fields_are_immediate(api_client, topic_factory):
    topic_factory("orders")

    response = produce(
        api_client, "orders", {"value": 1, "delay_ms": None, "deliver_at_ms": None, "level": None}
    )

    assert response.json() == {"results": [{"partition": 0, "offset": 0, "duplicate": False}]}


def test_produce__delayed_and_immediate_in_one_batch(api_client, topic_factory, end_offsets):
    topic_factory("orders")

    response = produce(
        api_client,
        "orders",
        {"value": "now"},
        {"value": "later", "delay_ms": MINUTE_MS},
        {"value": "now too"},
    )

    assert response.status_code == 200
    first, delayed, last = response.json()["results"]
    assert first == {"partition": 0, "offset": 0, "duplicate": False}
    assert set(delayed) == {"scheduled_id", "deliver_at_ms", "duplicate"}
    assert last == {"partition": 0, "offset": 1, "duplicate": False}
    assert [m["value"] for m in fetch(api_client, "orders").json()["messages"]] == [
        "now",
        "now too",
    ]

    assert release_all() == 1

    [released] = fetch(api_client, "orders", offset=2).json()["messages"]
    assert (released["offset"], released["value"]) == (2, "later")
    assert end_offsets("orders") == [3]


def test_produce__released_message_keeps_its_fields(api_client, topic_factory):
    topic_factory("orders", partitions=3)
    raw = b"\x00\xffbytes"
    produce(
        api_client,
        "orders",
        {
            "value_b64": base64.b64encode(raw).decode(),
            "key": "k",
            "tag": "t",
            "headers": {"h": "v"},
            "partition": 2,
            "id": "order-1",
            "delay_ms": MINUTE_MS,
        },
    )

    release_all()

    [stored] = fetch(api_client, "orders", 2).json()["messages"]
    assert base64.b64decode(stored["value_b64"]) == raw
    assert (stored["key"], stored["tag"], stored["headers"], stored["id"]) == (
        "k",
        "t",
        {"h": "v"},
        "order-1",
    )


def test_produce__delayed_id_is_idempotent_while_scheduled(api_client, topic_factory):
    topic_factory("orders")
    message = {"value": 1, "id": "order-1", "delay_ms": MINUTE_MS}
    [first] = produce(api_client, "orders", message).json()["results"]

    [again] = produce(api_client, "orders", message).json()["results"]

    assert again == {**first, "duplicate": True}
    assert len(list_scheduled(api_client, "orders").json()["scheduled"]) == 1


def test_produce__delayed_id_after_release_answers_partition_and_offset(api_client, topic_factory):
    topic_factory("orders")
    message = {"value": 1, "id": "order-1", "delay_ms": MINUTE_MS}
    produce(api_client, "orders", message)
    release_all()

    response = produce(api_client, "orders", message)

    assert response.json() == {"results": [{"partition": 0, "offset": 0, "duplicate": True}]}
    assert list_scheduled(api_client, "orders").json()["scheduled"] == []


@pytest.mark.parametrize(
    "delay",
    [
        pytest.param({"level": 0}, id="level-0"),
        pytest.param({"level": 19}, id="level-19"),
        pytest.param({"delay_ms": -1}, id="negative-delay"),
        pytest.param({"delay_ms": 31 * 24 * 3600 * 1000}, id="over-max-delay"),
        pytest.param({"delay_ms": 1000, "level": 1}, id="two-fields"),
        pytest.param({"delay_ms": 1000, "deliver_at_ms": 1}, id="delay-and-at"),
    ],
)
def test_produce__bad_delay_stores_nothing(api_client, topic_factory, end_offsets, error_of, delay):
    topic_factory("orders")

    response = produce(api_client, "orders", {"value": "ok"}, {"value": "bad", **delay})

    assert error_of(response) == (400, "invalid_message")
    assert response.json()["error"]["detail"]["index"] == 1
    assert end_offsets("orders") == [0]
    assert not models.ScheduledMessage.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("delay_ms", "soon", id="delay-string"),
        pytest.param("level", 1.5, id="level-float"),
        pytest.param("deliver_at_ms", [1], id="at-list"),
        pytest.param("deliver_at_ms", -(2**63) - 1, id="at-below-64-bit"),
    ],
)
def test_produce__delay_wrong_type(api_client, topic_factory, end_offsets, error_of, field, value):
    topic_factory("orders")

    response = produce(api_client, "orders", {"value": 1, field: value})

    assert error_of(response) == (422, "validation_error")
    assert response.json()["error"]["detail"]["errors"][0]["loc"][:3] == ["messages", 0, field]
    assert end_offsets("orders") == [0]


def test_list_scheduled__soonest_first(api_client, topic_factory):
    topic_factory("orders", partitions=2)
    at = now_ms() + MINUTE_MS
    produce(
        api_client,
        "orders",
        {"value": {"n": 2}, "deliver_at_ms": at + 1000, "key": "k", "tag": "t", "id": "m-2"},
        {"value_b64": "AAE=", "deliver_at_ms": at, "partition": 1, "headers": {"h": "v"}},
    )

    response = list_scheduled(api_client, "orders")

    assert response.status_code == 200
    page = response.json()
    first, second = page["scheduled"]
    assert first == {
        "id": first["id"],
        "topic": "orders",
        "deliver_at_ms": at,
        "partition": 1,
        "key": None,
        "tag": None,
        "headers": {"h": "v"},
        "message_id": None,
        "value_b64": "AAE=",
    }
    assert second == {
        "id": second["id"],
        "topic": "orders",
        "deliver_at_ms": at + 1000,
        "partition": None,
        "key": "k",
        "tag": "t",
        "headers": {},
        "message_id": "m-2",
        "value": {"n": 2},
    }
    assert page["next_after"] == second["id"]


def test_list_scheduled__pages_with_after(api_client, topic_factory):
    topic_factory("orders")
    at = now_ms() + MINUTE_MS
    produce(api_client, "orders", *({"value": n, "deliver_at_ms": at + n} for n in range(5)))

    seen = []
    after = None
    while True:
        params = {"limit": 2} if after is None else {"limit": 2, "after": after}
        page = list_scheduled(api_client, "orders", **params).json()
        if not page["scheduled"]:
            assert page["next_after"] is None
            break
        seen += [s["value"] for s in page["scheduled"]]
        after = page["next_after"]

    assert seen == [0, 1, 2, 3, 4]


def test_list_scheduled__empty(api_client, topic_factory):
    topic_factory("orders")

    response = list_scheduled(api_client, "orders")

    assert response.json() == {"scheduled": [], "next_after": None}


def test_list_scheduled__bad_limit(api_client, topic_factory, error_of):
    topic_factory("orders")

    response = list_scheduled(api_client, "orders", limit=0)

    assert error_of(response) == (400, "invalid_request")


def test_list_scheduled__without_consume(client_factory, topic_factory, error_of):
    topic_factory("orders")
    producer = client_factory("produce:orders")

    response = list_scheduled(producer, "orders")

    assert error_of(response) == (403, "permission_denied")


def test_list_scheduled__unknown_topic(api_client, error_of):
    response = list_scheduled(api_client, "nope")

    assert error_of(response) == (404, "topic_not_found")


def test_cancel_scheduled__returns_the_message_and_it_never_arrives(
    api_client, topic_factory, end_offsets
):
    topic_factory("orders")
    [result] = produce(
        api_client, "orders", {"value": "later", "id": "m-1", "delay_ms": MINUTE_MS}
    ).json()["results"]

    response = cancel(api_client, result["scheduled_id"])

    assert response.status_code == 200
    assert response.json() == {
        "id": result["scheduled_id"],
        "topic": "orders",
        "deliver_at_ms": result["deliver_at_ms"],
        "partition": None,
        "key": None,
        "tag": None,
        "headers": {},
        "message_id": "m-1",
        "value": "later",
    }
    assert list_scheduled(api_client, "orders").json()["scheduled"] == []
    assert release_all() == 0
    assert end_offsets("orders") == [0]


def test_cancel_scheduled__twice(api_client, topic_factory, error_of):
    topic_factory("orders")
    [result] = produce(api_client, "orders", {"value": 1, "delay_ms": MINUTE_MS}).json()["results"]
    cancel(api_client, result["scheduled_id"])

    response = cancel(api_client, result["scheduled_id"])

    assert error_of(response) == (404, "scheduled_not_found")
    assert response.json()["error"]["detail"] == {"id": result["scheduled_id"]}


def test_cancel_scheduled__after_release(api_client, topic_factory, error_of):
    topic_factory("orders")
    [result] = produce(api_client, "orders", {"value": 1, "delay_ms": MINUTE_MS}).json()["results"]
    release_all()

    response = cancel(api_client, result["scheduled_id"])

    assert error_of(response) == (404, "scheduled_not_found")


def test_cancel_scheduled__unknown_id(api_client, error_of):
    response = cancel(api_client, 424242)

    assert error_of(response) == (404, "scheduled_not_found")


def test_cancel_scheduled__without_produce(client_factory, topic_factory, error_of):
    topic_factory("orders")
    producer = client_factory("produce:orders")
    [result] = produce(producer, "orders", {"value": 1, "delay_ms": MINUTE_MS}).json()["results"]
    reader = client_factory("consume:orders", "produce:other")

    response = cancel(reader, result["scheduled_id"])

    # As if it did not exist: a 403 would tell which ids exist, and name the topic.
    assert error_of(response) == (404, "scheduled_not_found")
    assert "orders" not in response.content.decode()
    assert len(list_scheduled(client_factory("consume:orders"), "orders").json()["scheduled"]) == 1


def test_cancel_scheduled__id_out_of_range(api_client, error_of):
    response = cancel(api_client, 2**64)

    assert error_of(response) == (422, "validation_error")
