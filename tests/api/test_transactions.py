"""REST edge tests for transactions: begin, add, commit, rollback, list, and each error mapping."""

import pytest

from broker import models

JSON = "application/json"


def begin(client, producer_id="p", timeout_ms=60_000, **fields):
    return client.post(
        "/api/v1/transactions",
        {"producer_id": producer_id, "timeout_ms": timeout_ms, **fields},
        content_type=JSON,
    )


def add(client, tx, topic, *values):
    return client.post(
        f"/api/v1/transactions/{tx}/messages",
        {"topic": topic, "messages": [{"value": v} for v in values]},
        content_type=JSON,
    )


def fetch(client, topic):
    r = client.get(f"/api/v1/topics/{topic}/partitions/0/messages")
    return [m.get("value") for m in r.json()["messages"]]


def test_transactions__begin_add_commit(api_client, topic_factory):
    a, b = topic_factory().name, topic_factory().name
    r = begin(api_client)
    assert r.status_code == 201
    tx = r.json()
    assert (tx["state"], tx["epoch"], tx["producer_id"]) == ("open", 1, "p")
    r = add(api_client, tx["id"], a, 1, 2)
    assert r.status_code == 200
    assert (r.json()["messages"], r.json()["topics"]) == (2, [a])
    assert add(api_client, tx["id"], b, 3).json()["topics"] == sorted([a, b])
    assert fetch(api_client, a) == []
    r = api_client.post(f"/api/v1/transactions/{tx['id']}/commit")
    assert r.status_code == 200
    body = r.json()
    assert body["state"] == "committed"
    assert body["results"] == [
        {"topic": a, "partition": 0, "offset": 0, "duplicate": False},
        {"topic": a, "partition": 0, "offset": 1, "duplicate": False},
        {"topic": b, "partition": 0, "offset": 0, "duplicate": False},
    ]
    assert fetch(api_client, a) == [1, 2]
    assert fetch(api_client, b) == [3]
    r = api_client.get(f"/api/v1/transactions/{tx['id']}")
    assert (r.status_code, r.json()["state"], r.json()["reason"]) == (200, "committed", "producer")


def test_transactions__rollback_then_commit_is_409(api_client, topic_factory, error_of):
    a = topic_factory().name
    tx = begin(api_client).json()["id"]
    add(api_client, tx, a, 1)
    r = api_client.post(f"/api/v1/transactions/{tx}/rollback")
    assert (r.status_code, r.json()["state"]) == (200, "rolled_back")
    assert error_of(api_client.post(f"/api/v1/transactions/{tx}/commit")) == (
        409,
        "transaction_not_open",
    )
    assert fetch(api_client, a) == []


def test_transactions__fenced_is_409(api_client, topic_factory, error_of):
    a = topic_factory().name
    old = begin(api_client).json()["id"]
    new = begin(api_client).json()
    assert new["epoch"] == 2
    assert error_of(add(api_client, old, a, 1)) == (409, "fenced")
    assert error_of(api_client.post(f"/api/v1/transactions/{old}/commit")) == (409, "fenced")


def test_transactions__bad_input_stores_nothing(api_client, topic_factory, error_of):
    a = topic_factory().name
    assert error_of(begin(api_client, timeout_ms=0)) == (400, "invalid_request")
    assert error_of(begin(api_client, producer_id="a b")) == (400, "invalid_request")
    assert error_of(begin(api_client, timeout_ms="1")) == (422, "validation_error")
    assert not models.Transaction.objects.exists()
    tx = begin(api_client).json()["id"]
    r = api_client.post(
        f"/api/v1/transactions/{tx}/messages",
        {"topic": a, "messages": [{"value": 1}, {"nope": 2}]},
        content_type=JSON,
    )
    assert error_of(r) == (422, "validation_error")
    assert error_of(add(api_client, tx, "missing", 1)) == (404, "topic_not_found")
    assert not models.StagedMessage.objects.exists()


def test_transactions__unknown_is_404(api_client, error_of):
    assert error_of(api_client.get("/api/v1/transactions/999999")) == (
        404,
        "transaction_not_found",
    )
    assert error_of(api_client.post("/api/v1/transactions/999999/commit")) == (
        404,
        "transaction_not_found",
    )


def test_transactions__other_keys_do_not_see_it(client_factory, topic_factory, error_of):
    owner, other = client_factory("produce:*"), client_factory("produce:*")
    tx = begin(owner).json()["id"]
    assert error_of(other.get(f"/api/v1/transactions/{tx}")) == (404, "transaction_not_found")
    assert other.get("/api/v1/transactions").json() == []
    assert [t["id"] for t in owner.get("/api/v1/transactions").json()] == [tx]
    assert error_of(begin(other)) == (403, "permission_denied")


def test_transactions__list_by_state(api_client):
    a = begin(api_client, "a").json()["id"]
    b = begin(api_client, "b").json()["id"]
    api_client.post(f"/api/v1/transactions/{a}/rollback")
    r = api_client.get("/api/v1/transactions", {"state": "open"})
    assert [t["id"] for t in r.json()] == [b]
    assert api_client.get("/api/v1/transactions", {"state": "weird"}).status_code == 400


def test_transactions__offsets_and_acks(api_client, topic_factory, error_of):
    src, out = topic_factory().name, topic_factory().name
    api_client.post(
        f"/api/v1/topics/{src}/messages",
        {"messages": [{"value": 1}, {"value": 2}]},
        content_type=JSON,
    )
    api_client.post("/api/v1/groups/g/members", {"topic": src, "member_id": "m"}, content_type=JSON)
    polled = api_client.post(
        "/api/v1/groups/g/poll", {"topic": src, "member_id": "m"}, content_type=JSON
    ).json()
    tx = begin(api_client).json()["id"]
    add(api_client, tx, out, "x")
    r = api_client.post(
        f"/api/v1/transactions/{tx}/acks",
        {"group": "g", "receipts": [m["receipt"] for m in polled["messages"]]},
        content_type=JSON,
    )
    assert r.json()["acks"] == 2
    r = api_client.post(
        f"/api/v1/transactions/{tx}/offsets",
        {"group": "other", "topic": src, "offsets": [{"partition": 0, "offset": 2}]},
        content_type=JSON,
    )
    assert r.json()["offsets"] == 1
    r = api_client.post(
        f"/api/v1/transactions/{tx}/offsets",
        {"group": "other", "topic": src, "offsets": [{"partition": 5, "offset": 2}]},
        content_type=JSON,
    )
    assert error_of(r) == (404, "partition_not_found")
    assert api_client.post(f"/api/v1/transactions/{tx}/commit").status_code == 200
    assert not models.InFlight.objects.exists()
    group = api_client.get("/api/v1/groups/other").json()
    assert group["topics"][0]["partitions"][0]["committed_offset"] == 2


@pytest.mark.parametrize(
    "path",
    [
        ("post", "/api/v1/transactions/1/commit"),
        ("post", "/api/v1/transactions"),
        ("get", "/api/v1/transactions/1"),
    ],
)
def test_transactions__need_a_key(client, db, path, error_of):
    method, url = path
    assert error_of(getattr(client, method)(url, content_type=JSON))[0] == 401


def test_transactions__begin_with_messages(api_client, topic_factory, error_of):
    a = topic_factory().name
    r = begin(api_client, topic=a, messages=[{"value": 1}, {"value_b64": "AAE="}])
    assert (r.status_code, r.json()["messages"], r.json()["topics"]) == (201, 2, [a])
    assert api_client.post(f"/api/v1/transactions/{r.json()['id']}/commit").status_code == 200
    assert fetch(api_client, a) == [1, None]
    bad = begin(api_client, "q", topic=a, messages=[{"value": 1, "value_b64": "AA=="}])
    assert error_of(bad) == (422, "validation_error")
    assert error_of(begin(api_client, "q", messages=[{"value": 1}])) == (400, "invalid_request")
