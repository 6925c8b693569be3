"""REST edge tests for group membership: join, heartbeat, leave, member polls, describe."""

import pytest

JSON = "application/json"

MEMBER_FIELDS = {
    "group",
    "member_id",
    "topic",
    "generation",
    "partitions",
    "session_timeout_ms",
    "heartbeat_interval_ms",
    "mode",
    "filter",
}


@pytest.fixture
def orders(api_client, topic_factory):
    """A four-partition topic "orders" holding three messages per partition."""
    topic_factory("orders", partitions=4)
    messages = [{"value": [p, i], "partition": p} for p in range(4) for i in range(3)]
    response = api_client.post(
        "/api/v1/topics/orders/messages", {"messages": messages}, content_type=JSON
    )
    assert response.status_code == 200
    return "orders"


def join(client, group, topic, **fields):
    return client.post(
        f"/api/v1/groups/{group}/members", {"topic": topic, **fields}, content_type=JSON
    )


def heartbeat(client, group, member_id):
    return client.post(f"/api/v1/groups/{group}/members/{member_id}/heartbeat")


def leave(client, group, member_id):
    return client.delete(f"/api/v1/groups/{group}/members/{member_id}")


def poll(client, group, topic, **options):
    return client.post(
        f"/api/v1/groups/{group}/poll", {"topic": topic, **options}, content_type=JSON
    )


def test_join__first_member_holds_every_partition(api_client, orders):
    response = join(api_client, "billing", orders, member_id="a")

    assert response.status_code == 201
    body = response.json()
    assert set(body) == MEMBER_FIELDS
    assert (body["group"], body["member_id"], body["topic"]) == ("billing", "a", "orders")
    assert (body["generation"], body["partitions"]) == (1, [0, 1, 2, 3])
    assert (body["session_timeout_ms"], body["heartbeat_interval_ms"]) == (45_000, 3000)
    assert (body["mode"], body["filter"]) == ("clustering", None)


def test_join__member_id_made_up_when_left_out(api_client, orders):
    response = join(api_client, "billing", orders)

    assert response.status_code == 201
    assert len(response.json()["member_id"]) == 32


def test_join__unknown_topic(api_client, error_of):
    assert error_of(join(api_client, "billing", "nope")) == (404, "topic_not_found")


def test_join__without_consume(client_factory, orders, error_of):
    producer = client_factory("produce:*")

    assert error_of(join(producer, "billing", orders)) == (403, "permission_denied")


def test_join__bad_member_id(api_client, orders, error_of):
    assert error_of(join(api_client, "billing", orders, member_id="no spaces")) == (
        400,
        "invalid_request",
    )


def test_join__bad_group_name(api_client, orders, error_of):
    assert error_of(join(api_client, "bad group!", orders)) == (400, "invalid_request")


def test_join__unknown_field(api_client, orders, error_of):
    assert error_of(join(api_client, "billing", orders, membr_id="a")) == (
        422,
        "validation_error",
    )


def test_join__with_filter(api_client, orders):
    spec = {"tags": "created || paid", "headers": [{"name": "region", "in": ["eu", "uk"]}]}

    response = join(api_client, "billing", orders, member_id="a", filter=spec)

    assert response.status_code == 201
    assert response.json()["filter"] == spec
    [member] = api_client.get("/api/v1/groups/billing").json()["members"]
    assert member["filter"] == spec


def test_join__filter_skips_messages(api_client, topic_factory):
    topic_factory("events")
    messages = [{"value": 0, "tag": "created"}, {"value": 1, "tag": "other"}]
    api_client.post("/api/v1/topics/events/messages", {"messages": messages}, content_type=JSON)
    join(api_client, "billing", "events", member_id="a", filter={"tags": "created"})

    body = poll(api_client, "billing", "events", member_id="a").json()

    assert ([m["value"] for m in body["messages"]], body["filtered"]) == ([0], 1)
    [topic] = api_client.get("/api/v1/groups/billing").json()["topics"]
    assert topic["partitions"][0]["filtered"] == 1


def test_join__invalid_filter(api_client, orders, error_of):
    bad = {"headers": [{"name": "region", "eq": "eu", "exists": True}]}

    assert error_of(join(api_client, "billing", orders, filter=bad)) == (400, "invalid_filter")


@pytest.mark.parametrize(
    "spec", [{"tag": "a"}, {"headers": [{"name": "region", "equals": "eu"}]}], ids=["top", "header"]
)
def test_join__unknown_filter_field(api_client, orders, error_of, spec):
    assert error_of(join(api_client, "billing", orders, filter=spec)) == (422, "validation_error")


def test_heartbeat__current_assignment(api_client, orders):
    join(api_client, "billing", orders, member_id="a")
    join(api_client, "billing", orders, member_id="b")

    response = heartbeat(api_client, "billing", "a")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == MEMBER_FIELDS
    assert (body["member_id"], body["generation"], len(body["partitions"])) == ("a", 2, 2)


def test_heartbeat__unknown_member(api_client, orders, error_of):
    join(api_client, "billing", orders, member_id="a")

    assert error_of(heartbeat(api_client, "billing", "nobody")) == (404, "member_not_found")


def test_leave__partitions_go_to_the_others(api_client, orders):
    join(api_client, "billing", orders, member_id="a")
    join(api_client, "billing", orders, member_id="b")

    response = leave(api_client, "billing", "b")

    assert response.status_code == 204
    assert response.content == b""
    body = heartbeat(api_client, "billing", "a").json()
    assert (body["generation"], body["partitions"]) == (3, [0, 1, 2, 3])


def test_leave__unknown_member(api_client, orders, error_of):
    join(api_client, "billing", orders, member_id="a")
    leave(api_client, "billing", "a")

    assert error_of(leave(api_client, "billing", "a")) == (404, "member_not_found")


def test_poll__unknown_member(api_client, orders, error_of):
    join(api_client, "billing", orders, member_id="a")

    assert error_of(poll(api_client, "billing", orders, member_id="nobody")) == (
        404,
        "member_not_found",
    )


def test_poll__member_of_another_topic(api_client, orders, topic_factory, error_of):
    topic_factory("payments")
    join(api_client, "billing", "payments", member_id="a")

    assert error_of(poll(api_client, "billing", orders, member_id="a")) == (
        400,
        "invalid_request",
    )


def test_poll__two_members_split_the_partitions(api_client, orders):
    a = join(api_client, "billing", orders, member_id="a").json()
    b = join(api_client, "billing", orders, member_id="b").json()
    # a's view is from before b joined; its heartbeat brings the current assignment.
    a = heartbeat(api_client, "billing", "a").json()
    assert sorted(a["partitions"] + b["partitions"]) == [0, 1, 2, 3]

    got = {}
    for member in (a, b):
        response = poll(
            api_client, "billing", orders, member_id=member["member_id"], auto_commit=True
        )
        assert response.status_code == 200
        got[member["member_id"]] = response.json()["messages"]

    assert {m["partition"] for m in got["a"]} == set(a["partitions"])
    assert {m["partition"] for m in got["b"]} == set(b["partitions"])
    assert sorted(m["value"] for m in got["a"] + got["b"]) == [
        [p, i] for p in range(4) for i in range(3)
    ]


def test_poll__without_member_reads_every_partition(api_client, orders):
    join(api_client, "billing", orders, member_id="a")
    join(api_client, "billing", orders, member_id="b")

    response = poll(api_client, "billing", orders)

    assert {m["partition"] for m in response.json()["messages"]} == {0, 1, 2, 3}


def test_describe_group__generation_strategy_members(api_client, orders):
    join(api_client, "billing", orders, member_id="a")
    join(api_client, "billing", orders, member_id="b")

    response = api_client.get("/api/v1/groups/billing")

    assert response.status_code == 200
    body = response.json()
    assert (body["generation"], body["strategy"]) == (2, "sticky")
    members = body["members"]
    assert [m["member_id"] for m in members] == ["a", "b"]
    assert set(members[0]) == {
        "member_id",
        "topic",
        "partitions",
        "joined_ms",
        "heartbeat_ms",
        "filter",
        "client",
        "host",
    }
    assert all(m["topic"] == "orders" for m in members)
    assert sorted(p for m in members for p in m["partitions"]) == [0, 1, 2, 3]
    assert all(m["heartbeat_ms"] >= m["joined_ms"] for m in members)


def test_describe_group__members_hidden_without_consume(api_client, client_factory, orders):
    payments_reader = client_factory("consume:payments")
    join(api_client, "billing", orders, member_id="a")

    body = payments_reader.get("/api/v1/groups/billing").json()

    assert body["members"] == []


def test_configure_group__patch(api_client, client_factory, topic_factory):
    topic_factory("orders", partitions=2)
    api_client.post(
        "/api/v1/groups/g/members", {"topic": "orders"}, content_type="application/json"
    )
    response = api_client.patch(
        "/api/v1/groups/g", {"strategy": "range"}, content_type="application/json"
    )
    assert (response.status_code, response.json()["strategy"]) == (200, "range")
    bad = api_client.patch("/api/v1/groups/g", {"strategy": "x"}, content_type="application/json")
    assert bad.status_code == 422
    reader = client_factory("consume:*")
    denied = reader.patch(
        "/api/v1/groups/g", {"strategy": "sticky"}, content_type="application/json"
    )
    assert denied.json()["error"]["code"] == "permission_denied"


def test_join_group__start_latest(api_client, topic_factory):
    topic = topic_factory().name
    api_client.post(
        f"/api/v1/topics/{topic}/messages",
        {"messages": [{"value": 1}]},
        content_type="application/json",
    )
    joined = api_client.post(
        "/api/v1/groups/late/members",
        {"topic": topic, "member_id": "m", "start": "latest"},
        content_type="application/json",
    )
    assert joined.status_code == 201
    polled = api_client.post(
        "/api/v1/groups/late/poll",
        {"topic": topic, "member_id": "m"},
        content_type="application/json",
    ).json()
    assert polled["messages"] == []


def test_join__member_id_of_another_topic_is_409(
    api_client, client_factory, orders, topic_factory, error_of
):
    topic_factory("x")
    assert join(api_client, "G", orders, member_id="worker-1").status_code == 201
    polled = poll(api_client, "G", orders, member_id="worker-1", max_messages=5)
    in_flight = [m["receipt"] for m in polled.json()["messages"]]
    assert in_flight
    # A key that may consume only "x" tries to take over the "orders" consumer's id.
    other = client_factory("consume:x")
    taken = join(other, "G", "x", member_id="worker-1")
    assert error_of(taken) == (409, "member_id_taken")
    assert "orders" not in taken.json()["error"]["message"]
    # The member is untouched: same topic, same partitions, its messages still its own.
    again = heartbeat(api_client, "G", "worker-1").json()
    assert (again["topic"], again["partitions"]) == (orders, [0, 1, 2, 3])
    acked = api_client.post("/api/v1/groups/G/ack", {"receipts": in_flight}, content_type=JSON)
    assert acked.json()["settled"] == len(in_flight)
    # Rejoining for its own topic is still a rejoin.
    assert join(api_client, "G", orders, member_id="worker-1").status_code == 201


def test_heartbeat_and_leave__another_topics_member_is_not_found(
    api_client, client_factory, orders, topic_factory, error_of
):
    """Issue 9, item 10: not 403 naming the member's topic, but as if it did not exist."""
    topic_factory("x")
    assert join(api_client, "G", orders, member_id="worker-1").status_code == 201
    other = client_factory("consume:x")
    for response in (heartbeat(other, "G", "worker-1"), leave(other, "G", "worker-1")):
        assert error_of(response) == (404, "member_not_found")
        assert "orders" not in response.content.decode()
    assert heartbeat(api_client, "G", "worker-1").status_code == 200


def test_join__client_name_and_host_in_the_group(api_client, orders):
    body = {"topic": orders, "member_id": "a", "client": "billing-3"}
    assert (
        api_client.post("/api/v1/groups/billing/members", body, content_type=JSON).status_code
        == 201
    )
    [member] = api_client.get("/api/v1/groups/billing").json()["members"]
    # The test client connects from 127.0.0.1 (Django's test REMOTE_ADDR).
    assert (member["client"], member["host"]) == ("billing-3", "rest 127.0.0.1")
    assert (
        api_client.get("/api/v1/groups/billing").json()["settings"]["session_timeout_ms"] == 45_000
    )


def test_join__client_name_too_long(api_client, orders):
    body = {"topic": orders, "client": "x" * 101}
    assert (
        api_client.post("/api/v1/groups/billing/members", body, content_type=JSON).status_code
        == 422
    )
