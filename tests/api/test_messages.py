"""REST edge tests for produce, fetch and offsets: happy paths and each error mapping."""

import base64
import time

import pytest

from broker.core import partitioning

JSON = "application/json"


def produce(client, topic, *messages):
    return client.post(
        f"/api/v1/topics/{topic}/messages", {"messages": messages}, content_type=JSON
    )


def fetch(client, topic, partition=0, **params):
    return client.get(f"/api/v1/topics/{topic}/partitions/{partition}/messages", params)


def test_produce__json_value_round_trip(api_client, topic_factory):
    topic_factory("orders", partitions=2)
    value = {"order": 7, "items": ["tea"]}
    message = {"value": value, "key": "k-1", "tag": "paid", "headers": {"src": "web"}}

    response = produce(api_client, "orders", {**message, "partition": 1})

    assert response.status_code == 200
    assert response.json() == {"results": [{"partition": 1, "offset": 0, "duplicate": False}]}
    [stored] = fetch(api_client, "orders", 1).json()["messages"]
    assert stored["value"] == value
    assert "value_b64" not in stored
    assert (stored["key"], stored["tag"], stored["headers"]) == ("k-1", "paid", {"src": "web"})
    assert (stored["partition"], stored["offset"]) == (1, 0)


def test_produce__bytes_round_trip(api_client, topic_factory):
    topic_factory("blobs")
    raw = b"\x00\xffnot json\x80"

    response = produce(api_client, "blobs", {"value_b64": base64.b64encode(raw).decode()})

    assert response.status_code == 200
    [stored] = fetch(api_client, "blobs").json()["messages"]
    assert base64.b64decode(stored["value_b64"]) == raw
    assert "value" not in stored


def test_produce__explicit_partition(api_client, topic_factory, end_offsets):
    topic_factory("orders", partitions=3)

    response = produce(
        api_client, "orders", {"value": 1, "partition": 2}, {"value": 2, "partition": 2}
    )

    assert [(r["partition"], r["offset"]) for r in response.json()["results"]] == [(2, 0), (2, 1)]
    assert end_offsets("orders") == [0, 0, 2]


def test_produce__the_partition_hint_header_is_only_for_the_load_balancer(
    api_client, topic_factory, end_offsets
):
    """docs/api.md: Ferry-Partition-Hint routes at scripts/haproxy; the broker ignores it."""
    topic_factory("orders", partitions=3)
    key = next(f"k{n}" for n in range(100) if partitioning.partition_for_key(f"k{n}", 3) == 1)

    for hint in ("2", "9", "not a number"):
        response = api_client.post(
            "/api/v1/topics/orders/messages",
            {"messages": [{"value": 1, "key": key}]},
            content_type=JSON,
            headers={"Ferry-Partition-Hint": hint},
        )
        assert response.status_code == 200, response.content
        assert response.json()["results"][0]["partition"] == 1

    assert end_offsets("orders") == [0, 3, 0]


def produce_to(client, topic, partition, *messages):
    return client.post(
        f"/api/v1/topics/{topic}/partitions/{partition}/messages",
        {"messages": messages},
        content_type=JSON,
    )


def test_produce_to_partition__every_message_lands_there(api_client, topic_factory, end_offsets):
    topic_factory("orders", partitions=3)

    response = produce_to(
        api_client,
        "orders",
        1,
        {"value": 1, "key": "a"},
        {"value": 2, "key": "b"},
        {"value": 3, "partition": 1},
    )

    assert response.status_code == 200
    assert [(r["partition"], r["offset"]) for r in response.json()["results"]] == [
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    assert end_offsets("orders") == [0, 3, 0]
    assert [m["key"] for m in fetch(api_client, "orders", 1).json()["messages"]] == [
        "a",
        "b",
        None,
    ]


@pytest.mark.parametrize(
    ("partition", "messages", "status", "code"),
    [
        pytest.param(
            1,
            [{"value": 1}, {"value": 2, "partition": 0}],
            400,
            "invalid_message",
            id="message-names-another",
        ),
        pytest.param(3, [{"value": 1}], 404, "partition_not_found", id="past-the-topic"),
        pytest.param(-1, [{"value": 1}], 422, "validation_error", id="negative"),
    ],
)
def test_produce_to_partition__refused_stores_nothing(
    api_client, topic_factory, end_offsets, error_of, partition, messages, status, code
):
    topic_factory("orders", partitions=3)

    response = produce_to(api_client, "orders", partition, *messages)

    assert error_of(response) == (status, code)
    assert end_offsets("orders") == [0, 0, 0]


def test_produce_to_partition__unknown_topic(api_client, error_of):
    assert error_of(produce_to(api_client, "nope", 0, {"value": 1})) == (404, "topic_not_found")


def test_produce__idempotent_id(api_client, topic_factory, end_offsets):
    topic_factory("orders", partitions=3)
    first = produce(api_client, "orders", {"value": "a", "id": "order-1"}).json()["results"][0]
    before = end_offsets("orders")

    response = produce(api_client, "orders", {"value": "a", "id": "order-1"})

    assert response.status_code == 200
    again = response.json()["results"][0]
    assert again["duplicate"] is True
    assert (again["partition"], again["offset"]) == (first["partition"], first["offset"])
    assert end_offsets("orders") == before


@pytest.mark.parametrize(
    ("bad", "status", "code"),
    [
        pytest.param({"value": "x" * 200}, 413, "message_too_large", id="too-large"),
        pytest.param({"value": 1, "partition": 5}, 404, "partition_not_found", id="bad-partition"),
        pytest.param({"key": "k"}, 422, "validation_error", id="no-value"),
        pytest.param({"value_b64": "not base64!"}, 422, "validation_error", id="bad-base64"),
    ],
)
def test_produce__one_bad_message_stores_nothing(
    api_client, topic_factory, end_offsets, error_of, bad, status, code
):
    topic_factory("orders", partitions=2, max_message_bytes=100)
    produce(api_client, "orders", {"value": "seed", "partition": 0})
    before = end_offsets("orders")

    response = produce(api_client, "orders", {"value": "ok", "partition": 0}, bad, {"value": "ok"})

    assert error_of(response) == (status, code)
    assert end_offsets("orders") == before == [1, 0]


def test_produce__message_too_large(api_client, topic_factory, error_of):
    topic_factory("orders", max_message_bytes=100)

    response = produce(api_client, "orders", {"value": "x" * 200})

    assert error_of(response) == (413, "message_too_large")
    assert response.json()["error"]["detail"]["max_message_bytes"] == 100


def test_produce__batch_too_large(api_client, topic_factory, end_offsets, error_of, settings):
    settings.FERRY_MAX_BATCH_MESSAGES = 2
    topic_factory("orders")

    response = produce(api_client, "orders", *({"value": i} for i in range(3)))

    assert error_of(response) == (413, "batch_too_large")
    assert end_offsets("orders") == [0]


def test_produce__capacity_full_rejects(api_client, topic_factory, end_offsets, error_of):
    topic_factory("orders", capacity=2, overflow_policy="reject")
    produce(api_client, "orders", {"value": 1}, {"value": 2})

    response = produce(api_client, "orders", {"value": 3})

    assert error_of(response) == (409, "topic_full")
    assert end_offsets("orders") == [2]


def test_produce__capacity_full_drops_oldest(api_client, topic_factory):
    topic_factory("orders", capacity=2, overflow_policy="drop_oldest")
    produce(api_client, "orders", {"value": 1}, {"value": 2})

    response = produce(api_client, "orders", {"value": 3})

    assert response.status_code == 200
    assert response.json()["results"][0]["offset"] == 2
    page = fetch(api_client, "orders").json()
    assert (page["start_offset"], page["end_offset"]) == (1, 3)
    assert [m["value"] for m in page["messages"]] == [2, 3]


def test_produce__unknown_topic(api_client, error_of):
    response = produce(api_client, "nope", {"value": 1})

    assert error_of(response) == (404, "topic_not_found")


def test_produce__empty_batch(api_client, topic_factory, error_of):
    topic_factory("orders")

    response = produce(api_client, "orders")

    assert error_of(response) == (422, "validation_error")


def test_produce__malformed_json(api_client, topic_factory, end_offsets, error_of):
    topic_factory("orders")

    response = api_client.post("/api/v1/topics/orders/messages", b"{bad", content_type=JSON)

    assert error_of(response) == (400, "malformed_json")
    assert end_offsets("orders") == [0]


def test_fetch__offset_and_limit(api_client, topic_factory):
    topic_factory("orders")
    produce(api_client, "orders", *({"value": i} for i in range(5)))

    response = fetch(api_client, "orders", offset=1, limit=2)

    assert response.status_code == 200
    page = response.json()
    assert [(m["offset"], m["value"]) for m in page["messages"]] == [(1, 1), (2, 2)]
    assert (page["next_offset"], page["start_offset"], page["end_offset"]) == (3, 0, 5)


def test_fetch__at_end_is_empty(api_client, topic_factory):
    topic_factory("orders")
    produce(api_client, "orders", {"value": 1})

    page = fetch(api_client, "orders", offset=1).json()

    assert (page["messages"], page["next_offset"], page["end_offset"]) == ([], 1, 1)


def test_fetch__offset_past_end(api_client, topic_factory, error_of):
    topic_factory("orders")
    produce(api_client, "orders", {"value": 1})

    response = fetch(api_client, "orders", offset=2)

    assert error_of(response) == (409, "offset_out_of_range")


def test_fetch__missing_partition(api_client, topic_factory, error_of):
    topic_factory("orders", partitions=2)

    response = fetch(api_client, "orders", 2)

    assert error_of(response) == (404, "partition_not_found")


def test_fetch__unknown_topic(api_client, error_of):
    response = fetch(api_client, "nope")

    assert error_of(response) == (404, "topic_not_found")


def test_fetch__limit_zero(api_client, topic_factory, error_of):
    topic_factory("orders")

    response = fetch(api_client, "orders", limit=0)

    assert error_of(response) == (400, "invalid_request")


def test_fetch__max_wait_over_maximum(api_client, topic_factory, error_of):
    topic_factory("orders")

    response = fetch(api_client, "orders", max_wait_ms=30_001)

    assert error_of(response) == (400, "invalid_request")


def test_offsets__start_and_end(api_client, topic_factory):
    topic_factory("orders", partitions=2)
    produce(api_client, "orders", {"value": 1, "partition": 1}, {"value": 2, "partition": 1})

    response = api_client.get("/api/v1/topics/orders/offsets")

    assert response.status_code == 200
    assert response.json() == {
        "topic": "orders",
        "partitions": [
            {"partition": 0, "start_offset": 0, "end_offset": 0, "offset_for_timestamp": None},
            {"partition": 1, "start_offset": 0, "end_offset": 2, "offset_for_timestamp": None},
        ],
    }


def test_offsets__for_timestamp(api_client, topic_factory):
    topic_factory("orders")
    produce(api_client, "orders", {"value": "early"})
    time.sleep(0.005)  # the next batch gets a later millisecond timestamp
    produce(api_client, "orders", {"value": "late"})
    late_ms = fetch(api_client, "orders", offset=1).json()["messages"][0]["timestamp_ms"]

    def offset_for(timestamp_ms):
        response = api_client.get("/api/v1/topics/orders/offsets", {"timestamp": timestamp_ms})
        assert response.status_code == 200
        return response.json()["partitions"][0]["offset_for_timestamp"]

    assert offset_for(0) == 0
    assert offset_for(late_ms) == 1
    assert offset_for(late_ms + 60_000) == 2  # none that late: the end offset


def test_offsets__unknown_topic(api_client, error_of):
    response = api_client.get("/api/v1/topics/nope/offsets")

    assert error_of(response) == (404, "topic_not_found")


def test_produce__unknown_message_field_rejected(api_client, topic_factory, end_offsets):
    topic_factory("orders")
    body = {"messages": [{"value": 1, "delay": 5000}]}

    response = api_client.post("/api/v1/topics/orders/messages", body, content_type=JSON)

    assert response.status_code == 422
    assert response.json()["error"]["detail"]["errors"][0]["loc"] == ["messages", 0, "delay"]
    assert end_offsets("orders") == [0]


def test_produce__producer_timestamp_is_kept(api_client, topic_factory, error_of):
    topic_factory("orders")
    before = int(time.time() * 1000)
    response = produce(
        api_client, "orders", {"value": 1, "timestamp_ms": 1_600_000_000_000}, {"value": 2}
    )
    assert response.status_code == 200
    stamped, unstamped = fetch(api_client, "orders").json()["messages"]
    assert stamped["timestamp_ms"] == 1_600_000_000_000
    assert unstamped["timestamp_ms"] >= before


@pytest.mark.parametrize(
    ("message", "status", "code"),
    [
        ({"value": 1, "timestamp_ms": -1}, 400, "invalid_message"),
        ({"value": 1, "timestamp_ms": 1_600_000_000_000, "delay_ms": 1000}, 400, "invalid_message"),
        ({"value": 1, "timestamp_ms": True}, 422, "validation_error"),
        ({"value": 1, "timestamp_ms": "1600000000000"}, 422, "validation_error"),
    ],
)
def test_produce__bad_producer_timestamp(
    api_client, topic_factory, error_of, message, status, code
):
    topic_factory("orders")
    assert error_of(produce(api_client, "orders", message)) == (status, code)
    assert fetch(api_client, "orders").json()["messages"] == []


def test_produce__unknown_topic_is_404_by_default(client_factory):
    from broker import models

    producer = client_factory("produce:*")
    response = produce(producer, "nowhere", {"value": 1})
    assert (response.status_code, response.json()["error"]["code"]) == (404, "topic_not_found")
    assert not models.Topic.objects.filter(name="nowhere").exists()


def test_produce__auto_create_topics(client_factory, settings):
    from broker import models

    settings.FERRY_AUTO_CREATE_TOPICS = True
    settings.FERRY_DEFAULT_PARTITIONS = 3
    producer = client_factory("produce:auto-*", "consume:auto-*")
    response = produce(producer, "auto-1", {"value": 1, "partition": 2})
    assert response.json() == {"results": [{"partition": 2, "offset": 0, "duplicate": False}]}
    assert models.Topic.objects.get(name="auto-1").partition_count == 3
    # The key's produce permission on the name is what it takes, not admin.
    denied = produce(producer, "other", {"value": 1})
    assert (denied.status_code, denied.json()["error"]["code"]) == (403, "permission_denied")
    # A bad batch creates nothing.
    bad = produce(producer, "auto-2", {"value": 1, "partition": 3})
    assert bad.status_code == 404
    assert bad.json()["error"]["code"] == "partition_not_found"
    assert not models.Topic.objects.filter(name__in=["other", "auto-2"]).exists()
    # Consuming does not create.
    polled = producer.post("/api/v1/groups/g/poll", {"topic": "auto-3"}, content_type=JSON)
    assert polled.status_code == 404
