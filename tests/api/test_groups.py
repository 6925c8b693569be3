"""REST edge tests for consumer groups (poll, commit, describe) and the overview."""

import pytest

JSON = "application/json"


@pytest.fixture
def orders(api_client, topic_factory):
    """A one-partition topic "orders" holding the values 0 to 4 at offsets 0 to 4."""
    topic_factory("orders")
    messages = [{"value": i} for i in range(5)]
    response = api_client.post(
        "/api/v1/topics/orders/messages", {"messages": messages}, content_type=JSON
    )
    assert response.status_code == 200
    return "orders"


def poll(client, group, topic, **options):
    return client.post(
        f"/api/v1/groups/{group}/poll", {"topic": topic, **options}, content_type=JSON
    )


def commit(client, group, topic, offsets):
    body = {"topic": topic, "offsets": [{"partition": p, "offset": o} for p, o in offsets.items()]}
    return client.post(f"/api/v1/groups/{group}/commit", body, content_type=JSON)


def values(response):
    assert response.status_code == 200
    return [m["value"] for m in response.json()["messages"]]


def test_poll__without_auto_commit_repeats(api_client, orders):
    first = poll(api_client, "billing", orders, max_messages=2)

    assert values(first) == [0, 1]
    assert first.json()["committed"] is False
    assert first.json()["next_offsets"] == [{"partition": 0, "offset": 2}]
    assert values(poll(api_client, "billing", orders, max_messages=2)) == [0, 1]


def test_poll__auto_commit_moves_on(api_client, orders):
    first = poll(api_client, "billing", orders, max_messages=2, auto_commit=True)

    assert values(first) == [0, 1]
    assert first.json()["committed"] is True
    assert values(poll(api_client, "billing", orders, max_messages=2, auto_commit=True)) == [2, 3]


def test_poll__unknown_topic(api_client, error_of):
    response = poll(api_client, "billing", "nope")

    assert error_of(response) == (404, "topic_not_found")


def test_poll__invalid_group_name(api_client, orders, error_of):
    response = poll(api_client, "bad group!", orders)

    assert error_of(response) == (400, "invalid_request")


def test_commit__then_poll_continues(api_client, orders):
    response = commit(api_client, "billing", orders, {0: 3})

    assert response.status_code == 200
    body = response.json()
    assert (body["group"], body["topic"], body["committed_offset"], body["lag"]) == (
        "billing",
        "orders",
        3,
        2,
    )
    assert values(poll(api_client, "billing", orders)) == [3, 4]


def test_commit__as_member_of_current_generation(api_client, orders):
    member = api_client.post(
        "/api/v1/groups/billing/members", {"topic": orders, "member_id": "a"}, content_type=JSON
    ).json()
    body = {
        "topic": orders,
        "offsets": [{"partition": 0, "offset": 2}],
        "member_id": "a",
        "generation": member["generation"],
    }

    response = api_client.post("/api/v1/groups/billing/commit", body, content_type=JSON)

    assert (response.status_code, response.json()["committed_offset"]) == (200, 2)


def test_commit__stale_generation(api_client, orders, error_of):
    api_client.post(
        "/api/v1/groups/billing/members", {"topic": orders, "member_id": "a"}, content_type=JSON
    )
    body = {
        "topic": orders,
        "offsets": [{"partition": 0, "offset": 2}],
        "member_id": "a",
        "generation": 0,
    }

    response = api_client.post("/api/v1/groups/billing/commit", body, content_type=JSON)

    assert error_of(response) == (409, "stale_generation")
    assert response.json()["error"]["detail"]["current_generation"] == 1
    assert values(poll(api_client, "billing", orders)) == [0, 1, 2, 3, 4]


def test_commit__unknown_member(api_client, orders, error_of):
    body = {"topic": orders, "offsets": [{"partition": 0, "offset": 2}], "member_id": "ghost"}
    api_client.post("/api/v1/groups/billing/members", {"topic": orders}, content_type=JSON)

    response = api_client.post("/api/v1/groups/billing/commit", body, content_type=JSON)

    assert error_of(response) == (404, "member_not_found")


def test_commit__past_end(api_client, orders, error_of):
    response = commit(api_client, "billing", orders, {0: 6})

    assert error_of(response) == (409, "offset_out_of_range")


def test_commit__missing_partition(api_client, orders, error_of):
    response = commit(api_client, "billing", orders, {1: 0})

    assert error_of(response) == (404, "partition_not_found")


def test_list_groups__with_offsets(api_client, orders):
    commit(api_client, "billing", orders, {0: 1})
    commit(api_client, "audit", orders, {0: 4})

    response = api_client.get("/api/v1/groups")

    assert response.status_code == 200
    assert [(g["name"], g["topics"][0]["committed_offset"]) for g in response.json()] == [
        ("audit", 4),
        ("billing", 1),
    ]
    assert {"generation", "strategy", "members"} <= set(response.json()[0])


def test_describe_group__lag(api_client, topic_factory):
    topic_factory("orders", partitions=2)
    messages = [{"value": i, "partition": i % 2} for i in range(5)]  # ends: 3 and 2
    api_client.post("/api/v1/topics/orders/messages", {"messages": messages}, content_type=JSON)
    commit(api_client, "billing", "orders", {0: 1})

    response = api_client.get("/api/v1/groups/billing")

    assert response.status_code == 200
    [topic] = response.json()["topics"]
    assert [
        (p["partition"], p["committed_offset"], p["end_offset"], p["lag"])
        for p in topic["partitions"]
    ] == [
        (0, 1, 3, 2),
        (1, 0, 2, 2),
    ]
    assert (topic["committed_offset"], topic["end_offset"], topic["lag"]) == (1, 5, 4)
    # No member joined: membership is opt-in (tests/api/test_members.py).
    body = response.json()
    assert (body["generation"], body["strategy"], body["members"]) == (0, "sticky", [])
    assert (topic["member"], body["dead_letters"]) == (None, 0)
    assert [(p["in_flight"], p["filtered"]) for p in topic["partitions"]] == [(0, 0), (0, 0)]
    assert body["settings"] == {
        "mode": "clustering",
        "ordered": False,
        "ack_deadline_ms": 30_000,
        "max_attempts": 16,
        "retry_delays_ms": [],
        "session_timeout_ms": 45_000,
    }


def test_describe_group__unknown(api_client, error_of):
    response = api_client.get("/api/v1/groups/nope")

    assert error_of(response) == (404, "group_not_found")


def test_overview__topics_and_groups(api_client, orders):
    commit(api_client, "billing", orders, {0: 2})

    response = api_client.get("/api/v1/overview")

    assert response.status_code == 200
    body = response.json()
    assert [t["name"] for t in body["topics"]] == ["orders"]
    [group] = body["groups"]
    assert (group["group"], group["topic"]) == ("billing", "orders")
    assert (group["max_offset"], group["committed_offset"], group["lag"]) == (4, 2, 3)


def test_reset__to_earliest_then_explicit(api_client, topic_factory):
    topic_factory("orders")
    api_client.post(
        "/api/v1/topics/orders/messages",
        {"messages": [{"value": i} for i in range(3)]},
        content_type=JSON,
    )
    api_client.post(
        "/api/v1/groups/g/poll", {"topic": "orders", "auto_commit": True}, content_type=JSON
    )
    earliest = api_client.post(
        "/api/v1/groups/g/reset", {"topic": "orders", "to": "earliest"}, content_type=JSON
    )
    assert (earliest.status_code, earliest.json()["lag"]) == (200, 3)
    given = api_client.post(
        "/api/v1/groups/g/reset",
        {"topic": "orders", "to": "offsets", "offsets": [{"partition": 0, "offset": 2}]},
        content_type=JSON,
    )
    assert given.json()["partitions"][0]["committed_offset"] == 2


def test_reset__refused_with_members_unless_forced(api_client, topic_factory):
    topic_factory("orders")
    api_client.post("/api/v1/groups/g/members", {"topic": "orders"}, content_type=JSON)
    body = {"topic": "orders", "to": "latest"}
    refused = api_client.post("/api/v1/groups/g/reset", body, content_type=JSON)
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "group_has_members")
    forced = api_client.post("/api/v1/groups/g/reset", {**body, "force": True}, content_type=JSON)
    assert forced.status_code == 200


def test_reset__bad_target(api_client, topic_factory):
    topic_factory("orders")
    bad = api_client.post(
        "/api/v1/groups/g/reset", {"topic": "orders", "to": "middle"}, content_type=JSON
    )
    assert bad.status_code == 422
    missing = api_client.post(
        "/api/v1/groups/g/reset", {"topic": "orders", "to": "timestamp"}, content_type=JSON
    )
    assert (missing.status_code, missing.json()["error"]["code"]) == (400, "invalid_request")


def test_configure_group__delivery_settings(api_client):
    settings = {
        "mode": "broadcast",
        "ordered": True,
        "ack_deadline_ms": 5000,
        "max_attempts": 3,
        "retry_delays_ms": [1000, 5000],
    }

    response = api_client.patch("/api/v1/groups/g", settings, content_type=JSON)

    assert response.status_code == 200
    assert response.json()["settings"] == {**settings, "session_timeout_ms": 45_000}
    # Left out, a setting keeps its value.
    kept = api_client.patch("/api/v1/groups/g", {"max_attempts": 4}, content_type=JSON).json()
    assert kept["settings"] == {**settings, "max_attempts": 4, "session_timeout_ms": 45_000}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"mode": "fanout"}, (422, "validation_error")),
        ({"ack_deadline_ms": 10}, (400, "invalid_request")),
        ({"max_attempts": 0}, (400, "invalid_request")),
        ({"retry_delays_ms": [-1]}, (400, "invalid_request")),
        ({"max_attempt": 3}, (422, "validation_error")),
    ],
    ids=["mode", "deadline", "attempts", "delays", "unknown-field"],
)
def test_configure_group__bad_setting(api_client, error_of, change, expected):
    assert error_of(api_client.patch("/api/v1/groups/g", change, content_type=JSON)) == expected


def test_configure_group__mode_with_members(api_client, orders, error_of):
    api_client.post("/api/v1/groups/g/members", {"topic": orders}, content_type=JSON)

    response = api_client.patch("/api/v1/groups/g", {"mode": "broadcast"}, content_type=JSON)

    assert error_of(response) == (409, "group_has_members")


def test_describe_group__broadcast_member_offsets(api_client, orders):
    api_client.patch("/api/v1/groups/g", {"mode": "broadcast"}, content_type=JSON)
    for member_id in ("a", "b"):
        joined = api_client.post(
            "/api/v1/groups/g/members",
            {"topic": orders, "member_id": member_id},
            content_type=JSON,
        )
        assert joined.json()["mode"] == "broadcast"
    body = {"topic": orders, "member_id": "a", "max_messages": 2}
    api_client.post("/api/v1/groups/g/poll", body, content_type=JSON)

    topics = api_client.get("/api/v1/groups/g").json()["topics"]

    in_flight = {t["member"]: t["partitions"][0]["in_flight"] for t in topics}
    assert in_flight == {"a": 2, "b": 0}


def test_get_group__dead_letters_only_of_visible_topics(api_client, client_factory, topic_factory):
    """Issue 9, item 10: a key does not learn of letters on topics it may not consume."""
    from broker.core import delivery, keys, log, membership
    from broker.core.records import NewMessage

    for name in ("seen", "unseen"):
        topic_factory(name)
        log.append_messages(keys.CONSOLE, name, [NewMessage(b"1")])
        membership.join_group(keys.CONSOLE, "G", name, f"m-{name}")
        (d,) = delivery.deliver_messages(keys.CONSOLE, "G", name, f"m-{name}", 1).deliveries
        delivery.reject_messages(keys.CONSOLE, "G", [d.receipt])
    assert api_client.get("/api/v1/groups/G").json()["dead_letters"] == 2
    assert client_factory("consume:seen").get("/api/v1/groups/G").json()["dead_letters"] == 1
    assert client_factory("produce:*").get("/api/v1/groups/G").json()["dead_letters"] == 0


def test_list_groups__pages_and_permissions(api_client, client_factory, topic_factory, error_of):
    topic_factory("orders")
    topic_factory("billing")
    for name in ("g1", "g2", "g3"):
        commit(api_client, name, "orders", {0: 0})
    commit(api_client, "g4", "billing", {0: 0})

    first = api_client.get("/api/v1/groups", {"limit": 2})
    rest = api_client.get("/api/v1/groups", {"limit": 2, "after": "g2"})

    assert [g["name"] for g in first.json()] == ["g1", "g2"]
    assert [g["name"] for g in rest.json()] == ["g3", "g4"]
    assert [g["name"] for g in api_client.get("/api/v1/groups").json()] == [
        "g1",
        "g2",
        "g3",
        "g4",
    ]
    billing_reader = client_factory("consume:billing")
    assert [g["name"] for g in billing_reader.get("/api/v1/groups").json()] == ["g4"]
    assert client_factory("produce:*").get("/api/v1/groups").json() == []
    assert error_of(api_client.get("/api/v1/groups", {"limit": 1001})) == (400, "invalid_request")


def test_overview__pages(api_client, orders):
    for name in ("g1", "g2"):
        commit(api_client, name, orders, {0: 1})

    first = api_client.get("/api/v1/overview", {"limit": 1}).json()
    second = api_client.get("/api/v1/overview", {"limit": 1, "groups_after": "g1"}).json()

    assert [g["group"] for g in first["groups"]] == ["g1"]
    assert (first["next_topics_after"], first["next_groups_after"]) == ("orders", "g1")
    assert [g["group"] for g in second["groups"]] == ["g2"]
    assert second["next_groups_after"] == "g2"
    whole = api_client.get("/api/v1/overview").json()
    assert (whole["next_topics_after"], whole["next_groups_after"]) == (None, None)
