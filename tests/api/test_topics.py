"""REST edge tests for health and the topic endpoints: happy paths and each error mapping."""

import pytest
from django.db import connection
from django.test import Client

from broker import models
from broker.core import topics

JSON = "application/json"

# api.create_topic and api.delete_topic return (status, body) tuples, which django-ninja 1.7
# deprecates; the DeprecationWarning is raised after the core call has committed, so the client
# gets a 500 for a topic that was in fact created or deleted (an error under filterwarnings).


def names(response):
    return [t["name"] for t in response.json()]


def test_health__without_key(db):
    response = Client().get("/api/v1/health")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": connection.vendor, "redis": "not used"}


def test_list_topics__by_name(api_client, topic_factory):
    topic_factory("payments", partitions=2)
    topic_factory("audit")

    response = api_client.get("/api/v1/topics")

    assert response.status_code == 200
    assert names(response) == ["audit", "payments"]
    assert response.json()[1]["partition_offsets"] == [
        {"partition": 0, "start_offset": 0, "end_offset": 0, "message_count": 0, "bytes_stored": 0},
        {"partition": 1, "start_offset": 0, "end_offset": 0, "message_count": 0, "bytes_stored": 0},
    ]
    assert (response.json()[1]["message_count"], response.json()[1]["bytes_stored"]) == (0, 0)


def test_list_topics__pages_and_permissions(api_client, client_factory, topic_factory, error_of):
    for name in ("a", "b", "c", "orders.eu"):
        topic_factory(name)

    first = api_client.get("/api/v1/topics", {"limit": 2})
    rest = api_client.get("/api/v1/topics", {"limit": 2, "after": "b"})

    assert names(first) == ["a", "b"]
    assert names(rest) == ["c", "orders.eu"]
    assert names(client_factory("produce:orders.*").get("/api/v1/topics")) == ["orders.eu"]
    assert error_of(api_client.get("/api/v1/topics", {"limit": 0})) == (400, "invalid_request")


def test_delete_topic__gone_at_once_rows_deleted_by_the_job(api_client, topic_factory):
    topic_factory("orders")
    api_client.post(
        "/api/v1/topics/orders/messages", {"messages": [{"value": 1}]}, content_type=JSON
    )

    assert api_client.delete("/api/v1/topics/orders").status_code == 204
    assert api_client.get("/api/v1/topics/orders").status_code == 404
    assert names(api_client.get("/api/v1/topics")) == []
    assert (
        api_client.post("/api/v1/topics", {"name": "orders"}, content_type=JSON).status_code == 201
    )
    fetched = api_client.get("/api/v1/topics/orders/partitions/0/messages").json()
    assert fetched["messages"] == []
    topics.run_topic_deletions()
    assert models.Message.objects.count() == 0


def test_create_topic__created(api_client):
    response = api_client.post(
        "/api/v1/topics",
        {"name": "orders", "partitions": 3, "capacity": 10, "overflow_policy": "drop_oldest"},
        content_type=JSON,
    )

    assert response.status_code == 201
    body = response.json()
    assert (body["name"], body["partitions"], body["capacity"], body["overflow_policy"]) == (
        "orders",
        3,
        10,
        "drop_oldest",
    )
    assert [p["partition"] for p in body["partition_offsets"]] == [0, 1, 2]
    assert names(api_client.get("/api/v1/topics")) == ["orders"]


def test_create_topic__duplicate(api_client, topic_factory, error_of):
    topic_factory("orders")

    response = api_client.post("/api/v1/topics", {"name": "orders"}, content_type=JSON)

    assert error_of(response) == (409, "topic_exists")


@pytest.mark.parametrize("name", ["bad name!", "a" * 201])
def test_create_topic__invalid_name(api_client, error_of, name):
    response = api_client.post("/api/v1/topics", {"name": name}, content_type=JSON)

    assert error_of(response) == (400, "invalid_topic_name")
    assert api_client.get("/api/v1/topics").json() == []


def test_create_topic__zero_partitions(api_client, error_of):
    response = api_client.post(
        "/api/v1/topics", {"name": "orders", "partitions": 0}, content_type=JSON
    )

    assert error_of(response) == (400, "invalid_partition_count")
    assert api_client.get("/api/v1/topics").json() == []


def test_create_topic__default_partitions_from_settings(api_client, settings):
    settings.FERRY_DEFAULT_PARTITIONS = 3
    response = api_client.post("/api/v1/topics", {"name": "jobs"}, content_type=JSON)

    assert response.json()["partitions"] == 3


def test_get_topic__visible_to_producer(client_factory, topic_factory):
    topic_factory("orders.eu")
    producer = client_factory("produce:orders.*")

    assert producer.get("/api/v1/topics/orders.eu").status_code == 200
    assert producer.get("/api/v1/topics/billing").status_code == 403


def test_get_topic__found(api_client, topic_factory):
    topic_factory("orders", partitions=2, max_message_bytes=512)

    response = api_client.get("/api/v1/topics/orders")

    assert response.status_code == 200
    body = response.json()
    assert (body["name"], body["partitions"], body["max_message_bytes"]) == ("orders", 2, 512)
    assert len(body["partition_offsets"]) == 2


def test_get_topic__unknown(api_client, error_of):
    response = api_client.get("/api/v1/topics/nope")

    assert error_of(response) == (404, "topic_not_found")


def test_alter_topic__grows_partitions(api_client, topic_factory):
    topic_factory("orders", partitions=2)

    response = api_client.patch("/api/v1/topics/orders", {"partitions": 4}, content_type=JSON)

    assert response.status_code == 200
    assert response.json()["partitions"] == 4
    assert [p["partition"] for p in response.json()["partition_offsets"]] == [0, 1, 2, 3]


def test_alter_topic__shrink(api_client, topic_factory, error_of):
    topic_factory("orders", partitions=3)

    response = api_client.patch("/api/v1/topics/orders", {"partitions": 2}, content_type=JSON)

    assert error_of(response) == (400, "invalid_partition_count")
    assert api_client.get("/api/v1/topics/orders").json()["partitions"] == 3


def test_alter_topic__unknown(api_client, error_of):
    response = api_client.patch("/api/v1/topics/nope", {"partitions": 2}, content_type=JSON)

    assert error_of(response) == (404, "topic_not_found")


def test_delete_topic__then_not_found(api_client, topic_factory, error_of):
    topic_factory("orders")

    response = api_client.delete("/api/v1/topics/orders")

    assert response.status_code == 204
    assert error_of(api_client.get("/api/v1/topics/orders")) == (404, "topic_not_found")


def test_delete_topic__unknown(api_client, error_of):
    response = api_client.delete("/api/v1/topics/nope")

    assert error_of(response) == (404, "topic_not_found")


def test_create_topic__ttl_and_trace(api_client):
    response = api_client.post(
        "/api/v1/topics",
        {"name": "orders", "message_ttl_ms": 60_000, "trace": True},
        content_type=JSON,
    )

    assert response.status_code == 201
    assert (response.json()["message_ttl_ms"], response.json()["trace"]) == (60_000, True)


def test_create_topic__defaults_no_ttl_no_trace(api_client):
    body = api_client.post("/api/v1/topics", {"name": "orders"}, content_type=JSON).json()

    assert (body["message_ttl_ms"], body["trace"]) == (None, False)


def test_create_topic__bad_ttl(api_client, error_of):
    response = api_client.post(
        "/api/v1/topics", {"name": "orders", "message_ttl_ms": 0}, content_type=JSON
    )

    assert error_of(response) == (400, "invalid_request")


def test_alter_topic__ttl_and_trace(api_client, topic_factory):
    topic_factory("orders", message_ttl_ms=60_000)

    set_ = api_client.patch("/api/v1/topics/orders", {"trace": True}, content_type=JSON).json()
    cleared = api_client.patch(
        "/api/v1/topics/orders", {"message_ttl_ms": None}, content_type=JSON
    ).json()

    assert (set_["message_ttl_ms"], set_["trace"]) == (60_000, True)
    assert (cleared["message_ttl_ms"], cleared["trace"]) == (None, True)


@pytest.mark.parametrize("name", [".", "..", "..."])
def test_create_topic__dots_alone_are_refused(api_client, error_of, name):
    response = api_client.post("/api/v1/topics", {"name": name}, content_type="application/json")
    assert error_of(response) == (400, "invalid_topic_name")
