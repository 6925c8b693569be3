"""REST edge tests for a group's dead-letter queue: browse, redrive, purge."""

import pytest

JSON = "application/json"

LETTER_FIELDS = {
    "id",
    "group",
    "topic",
    "member",
    "partition",
    "offset",
    "reason",
    "attempts",
    "last_error",
    "dead_ms",
    "message",
}


def poll(client, topic, **options):
    body = {"topic": topic, "member_id": "m", **options}
    response = client.post("/api/v1/groups/g/poll", body, content_type=JSON)
    assert response.status_code == 200
    return response.json()["messages"]


@pytest.fixture
def dead(api_client, topic_factory):
    """Group "g" with three rejected messages of topic "orders" in its dead-letter queue."""
    topic_factory("orders")
    messages = [
        {"value": {"n": 0}, "key": "k", "tag": "t", "headers": {"h": "1"}, "id": "c-0"},
        {"value_b64": "AAE="},
        {"value": 2},
    ]
    api_client.post("/api/v1/topics/orders/messages", {"messages": messages}, content_type=JSON)
    api_client.post(
        "/api/v1/groups/g/members", {"topic": "orders", "member_id": "m"}, content_type=JSON
    )
    receipts = [m["receipt"] for m in poll(api_client, "orders")]
    response = api_client.post(
        "/api/v1/groups/g/reject", {"receipts": receipts, "error": "bad"}, content_type=JSON
    )
    assert response.json()["dead_lettered"] == 3
    return [letter["id"] for letter in api_client.get("/api/v1/groups/g/dlq").json()["items"]]


def dlq(client, group="g", **query):
    return client.get(f"/api/v1/groups/{group}/dlq", query)


def redrive(client, body, group="g"):
    return client.post(f"/api/v1/groups/{group}/dlq/redrive", body, content_type=JSON)


def purge(client, body, group="g"):
    return client.post(f"/api/v1/groups/{group}/dlq/purge", body, content_type=JSON)


def test_list_dead_letters__items(api_client, dead):
    response = dlq(api_client)

    assert response.status_code == 200
    body = response.json()
    assert (body["total"], body["next_after_id"]) == (3, None)
    first, second, _ = body["items"]
    assert set(first) == LETTER_FIELDS
    assert (first["group"], first["topic"], first["member"]) == ("g", "orders", None)
    assert (first["partition"], first["offset"], first["reason"]) == (0, 0, "rejected")
    assert (first["attempts"], first["last_error"]) == (1, "bad")
    assert first["dead_ms"] >= first["message"]["timestamp_ms"]
    message = first["message"]
    assert (message["value"], message["key"], message["tag"]) == ({"n": 0}, "k", "t")
    assert (message["headers"], message["id"]) == ({"h": "1"}, "c-0")
    assert second["message"]["value_b64"] == "AAE="
    assert "value" not in second["message"]


def test_list_dead_letters__pages(api_client, dead):
    first = dlq(api_client, limit=2).json()

    assert ([i["id"] for i in first["items"]], first["total"]) == (dead[:2], 3)
    assert first["next_after_id"] == dead[1]
    rest = dlq(api_client, limit=2, after_id=first["next_after_id"]).json()
    assert ([i["id"] for i in rest["items"]], rest["next_after_id"]) == (dead[2:], None)


def test_list_dead_letters__filters(api_client, dead):
    assert dlq(api_client, reason="max_attempts").json() == {
        "items": [],
        "total": 0,
        "next_after_id": None,
    }
    assert dlq(api_client, topic="orders", reason="rejected").json()["total"] == 3


def test_list_dead_letters__unknown_group(api_client, error_of):
    assert error_of(dlq(api_client, group="nope")) == (404, "group_not_found")


def test_list_dead_letters__without_consume(client_factory, dead, error_of):
    other_reader = client_factory("consume:payments")

    assert error_of(dlq(other_reader, topic="orders")) == (403, "permission_denied")
    # Without a topic the letters of topics the key may not consume are left out.
    assert dlq(other_reader).json()["total"] == 0


def test_list_dead_letters__bad_query(api_client, dead, error_of):
    assert error_of(dlq(api_client, reason="tired")) == (422, "validation_error")
    assert error_of(dlq(api_client, limit=0)) == (400, "invalid_request")


def test_redrive_dead_letters__ids(api_client, dead):
    response = redrive(api_client, {"ids": dead[:1]})

    assert response.status_code == 200
    assert response.json() == {"redriven": 1, "missing": []}
    assert dlq(api_client).json()["total"] == 2
    again = poll(api_client, "orders")
    assert [(m["offset"], m["attempt"]) for m in again] == [(0, 1)]


def test_redrive_dead_letters__all_matching(api_client, dead):
    response = redrive(api_client, {"all": True, "topic": "orders", "reason": "rejected"})

    assert response.json() == {"redriven": 3, "missing": []}
    assert [m["offset"] for m in poll(api_client, "orders")] == [0, 1, 2]


def test_redrive_dead_letters__unknown_id(api_client, dead, error_of):
    response = redrive(api_client, {"ids": [dead[0], max(dead) + 1]})

    assert error_of(response) == (404, "dead_letter_not_found")
    assert dlq(api_client).json()["total"] == 3


def test_redrive_dead_letters__unknown_group(api_client, error_of):
    assert error_of(redrive(api_client, {"all": True}, group="nope")) == (404, "group_not_found")


@pytest.mark.parametrize(
    "body",
    [{}, {"all": False}, {"ids": [1], "all": True}, {"ids": []}, {"all": True, "topics": "x"}],
    ids=["nothing", "all-false", "both", "no-ids", "unknown-field"],
)
def test_redrive_dead_letters__bad_selection(api_client, dead, error_of, body):
    assert error_of(redrive(api_client, body)) == (422, "validation_error")
    assert dlq(api_client).json()["total"] == 3


def test_purge_dead_letters__ids(api_client, dead):
    response = purge(api_client, {"ids": dead[1:]})

    assert (response.status_code, response.json()) == (200, {"purged": 2})
    assert [i["id"] for i in dlq(api_client).json()["items"]] == dead[:1]


def test_purge_dead_letters__all(api_client, dead):
    assert purge(api_client, {"all": True, "reason": "max_attempts"}).json() == {"purged": 0}
    assert purge(api_client, {"all": True}).json() == {"purged": 3}
    assert api_client.get("/api/v1/groups/g").json()["dead_letters"] == 0


def test_purge_dead_letters__unknown_id(api_client, dead, error_of):
    assert error_of(purge(api_client, {"ids": [max(dead) + 1]})) == (404, "dead_letter_not_found")


def test_purge_dead_letters__bad_selection(api_client, dead, error_of):
    assert error_of(purge(api_client, {"ids": [dead[0]], "all": True})) == (
        422,
        "validation_error",
    )


def test_redrive_dead_letters__without_consume(client_factory, api_client, dead, error_of):
    other_reader = client_factory("consume:payments")

    assert error_of(redrive(other_reader, {"all": True, "topic": "orders"})) == (
        403,
        "permission_denied",
    )
    assert dlq(api_client).json()["total"] == 3
