"""GET /topics/{t}/history and /groups/{g}/history: the sampled figures (core/history.py)."""

from broker.core import groups, history, keys, log
from broker.core.records import NewMessage


def sampled(topic_factory):
    topic = topic_factory("orders", partitions=2)
    log.append_messages(keys.CONSOLE, topic.name, [NewMessage(b"1"), NewMessage(b"2")])
    groups.commit_offsets(keys.CONSOLE, "billing", topic.name, {0: 1})
    history.sample_metrics()
    log.append_messages(keys.CONSOLE, topic.name, [NewMessage(b"3")])
    history.sample_metrics()
    return topic.name


def test_topic_history__points_oldest_first(api_client, topic_factory):
    name = sampled(topic_factory)
    body = api_client.get(f"/api/v1/topics/{name}/history").json()
    assert body["topic"] == name
    assert [p["end_offset_total"] for p in body["points"]] == [2, 3]
    assert body["points"][0]["in_per_s"] is None
    assert set(body["points"][0]) == {
        "at_ms",
        "end_offset_total",
        "message_count",
        "bytes_stored",
        "in_per_s",
        "resolution_s",
    }


def test_group_history__lag_and_consume_delay(api_client, topic_factory):
    name = sampled(topic_factory)
    body = api_client.get("/api/v1/groups/billing/history", {"topic": name}).json()
    assert body["group"] == "billing"
    assert [p["lag"] for p in body["points"]] == [1, 2]
    assert all(p["oldest_age_ms"] is not None for p in body["points"])


def test_history__a_window_in_the_past_is_empty(api_client, topic_factory):
    name = sampled(topic_factory)
    body = api_client.get(f"/api/v1/topics/{name}/history", {"since_ms": 0, "until_ms": 1}).json()
    assert body["points"] == []


def test_history__unknown_names_and_permissions(client_factory, topic_factory, error_of):
    sampled(topic_factory)
    admin = client_factory("admin:*")
    assert error_of(admin.get("/api/v1/topics/nope/history")) == (404, "topic_not_found")
    assert error_of(admin.get("/api/v1/groups/nope/history")) == (404, "group_not_found")
    producer = client_factory("produce:orders")
    assert error_of(producer.get("/api/v1/topics/orders/history"))[0] in (403, 404)
    assert error_of(producer.get("/api/v1/groups/billing/history", {"topic": "orders"}))[0] in (
        403,
        404,
    )
