"""REST edge tests for the console's management endpoints: purge, group delete, reset preview,
message lookup, scheduled deliver-now and reschedule, keys and the audit log."""

import pytest

from broker import models
from broker.core import keys, log, membership
from broker.core.records import NewMessage

JSON = "application/json"


def produce(topic, n, partition=0, **fields):
    log.append_messages(
        keys.CONSOLE,
        topic,
        [NewMessage(value=b"1", partition=partition, **fields) for _ in range(n)],
    )


def audit_actions():
    return list(models.AuditEntry.objects.order_by("id").values_list("action", "outcome"))


def test_purge_topic__all_and_up_to(api_client, topic_factory):
    topic = topic_factory(partitions=2).name
    produce(topic, 4, 0)
    produce(topic, 2, 1)
    response = api_client.post(
        f"/api/v1/topics/{topic}/purge", {"up_to": {"0": 3}}, content_type=JSON
    )
    assert response.status_code == 200
    body = response.json()
    assert body["removed"] == 3
    assert [(p["start_offset"], p["message_count"]) for p in body["partition_offsets"]] == [
        (3, 1),
        (0, 2),
    ]
    response = api_client.post(f"/api/v1/topics/{topic}/purge", content_type=JSON)
    assert response.json()["removed"] == 3
    topic_out = api_client.get(f"/api/v1/topics/{topic}").json()
    assert (topic_out["message_count"], topic_out["bytes_stored"]) == (0, 0)
    entry = models.AuditEntry.objects.order_by("id").first()
    assert entry is not None
    assert (entry.action, entry.actor[:4], entry.source, entry.params) == (
        "topic.purge",
        "key:",
        "api",
        {"up_to": {"0": 3}},
    )
    assert entry.result == {"removed": 3}


def test_purge_topic__errors(api_client, client_factory, topic_factory, error_of):
    topic = topic_factory().name
    produce(topic, 2)
    post = api_client.post
    assert error_of(
        post(f"/api/v1/topics/{topic}/purge", {"up_to": {"0": 9}}, content_type=JSON)
    ) == (
        409,
        "offset_out_of_range",
    )
    assert error_of(
        post(f"/api/v1/topics/{topic}/purge", {"up_to": {"4": 0}}, content_type=JSON)
    ) == (
        404,
        "partition_not_found",
    )
    assert error_of(post("/api/v1/topics/nope/purge", content_type=JSON)) == (
        404,
        "topic_not_found",
    )
    consumer = client_factory(f"consume:{topic}")
    assert error_of(consumer.post(f"/api/v1/topics/{topic}/purge", content_type=JSON)) == (
        403,
        "permission_denied",
    )
    assert models.Message.objects.count() == 2
    assert [outcome for _, outcome in audit_actions()] == [
        "offset_out_of_range",
        "partition_not_found",
        "topic_not_found",
        "permission_denied",
    ]


def test_delete_group__refused_then_forced(api_client, topic_factory, error_of):
    topic = topic_factory().name
    membership.join_group(keys.CONSOLE, "g", topic, "m")
    assert error_of(api_client.delete("/api/v1/groups/g")) == (409, "group_has_members")
    assert api_client.delete("/api/v1/groups/g?force=true").status_code == 204
    assert error_of(api_client.get("/api/v1/groups/g")) == (404, "group_not_found")
    assert error_of(api_client.delete("/api/v1/groups/g")) == (404, "group_not_found")
    assert audit_actions() == [
        ("group.delete", "group_has_members"),
        ("group.delete", "ok"),
        ("group.delete", "group_not_found"),
    ]


def test_delete_group__needs_admin_all(client_factory, error_of, db):
    models.ConsumerGroup.objects.create(name="g")
    client = client_factory("admin:orders")
    assert error_of(client.delete("/api/v1/groups/g")) == (403, "permission_denied")
    assert models.ConsumerGroup.objects.exists()


def test_reset__dry_run_then_shift(api_client, topic_factory, error_of):
    topic = topic_factory(partitions=2).name
    produce(topic, 5, 0)
    produce(topic, 2, 1)
    api_client.post(
        "/api/v1/groups/g/commit",
        {"topic": topic, "offsets": [{"partition": 0, "offset": 4}, {"partition": 1, "offset": 2}]},
        content_type=JSON,
    )
    body = {"topic": topic, "to": "shift", "shift_by": -3}
    preview = api_client.post(
        "/api/v1/groups/g/reset", {**body, "dry_run": True}, content_type=JSON
    )
    assert preview.status_code == 200
    assert preview.json() == {
        "group": "g",
        "topic": topic,
        "dry_run": True,
        "partitions": [
            {"partition": 0, "current": 4, "target": 1, "delta": -3},
            {"partition": 1, "current": 2, "target": 0, "delta": -2},
        ],
    }
    assert audit_actions() == []
    done = api_client.post("/api/v1/groups/g/reset", body, content_type=JSON).json()
    assert [p["committed_offset"] for p in done["partitions"]] == [1, 0]
    assert (done["committed_total"], done["end_total"], done["lag"]) == (1, 7, 6)
    assert audit_actions() == [("group.reset", "ok")]
    missing = api_client.post(
        "/api/v1/groups/g/reset",
        {"topic": topic, "to": "shift", "dry_run": True},
        content_type=JSON,
    )
    assert error_of(missing) == (400, "invalid_request")


def test_describe_group__totals_and_retry_waiting(api_client, topic_factory):
    topic = topic_factory().name
    produce(topic, 3)
    member = api_client.post(
        "/api/v1/groups/g/members", {"topic": topic, "member_id": "m"}, content_type=JSON
    ).json()
    polled = api_client.post(
        "/api/v1/groups/g/poll",
        {"topic": topic, "member_id": member["member_id"], "max_messages": 2},
        content_type=JSON,
    ).json()
    api_client.post(
        "/api/v1/groups/g/nack",
        {"receipts": [polled["messages"][0]["receipt"]], "delay_ms": 60_000},
        content_type=JSON,
    )
    (offsets,) = api_client.get("/api/v1/groups/g").json()["topics"]
    assert (offsets["in_flight"], offsets["retry_waiting"], offsets["lag"]) == (1, 1, 3)
    assert (offsets["partitions"][0]["in_flight"], offsets["partitions"][0]["retry_waiting"]) == (
        1,
        1,
    )


def test_lookup_messages__by_key_and_id(api_client, topic_factory, error_of):
    topic = topic_factory(partitions=2).name
    produce(topic, 2, 0, key="k")
    produce(topic, 1, 1, client_id="id-7")
    by_key = api_client.get(f"/api/v1/topics/{topic}/messages", {"key": "k"})
    assert by_key.status_code == 200
    body = by_key.json()
    assert [(m["partition"], m["offset"]) for m in body["messages"]] == [(0, 1), (0, 0)]
    assert (body["indexed"], body["scanned"], body["complete"]) == (True, 0, True)
    assert body["messages"][0]["value"] == 1
    assert body["messages"][0]["size_bytes"] > 0
    by_id = api_client.get(f"/api/v1/topics/{topic}/messages", {"id": "id-7", "partition": 1})
    assert [m["id"] for m in by_id.json()["messages"]] == ["id-7"]
    assert error_of(api_client.get(f"/api/v1/topics/{topic}/messages")) == (400, "invalid_request")
    assert error_of(api_client.get("/api/v1/topics/nope/messages", {"key": "k"})) == (
        404,
        "topic_not_found",
    )
    assert error_of(
        api_client.get(f"/api/v1/topics/{topic}/messages", {"key": "k", "partition": 9})
    ) == (
        404,
        "partition_not_found",
    )


def test_lookup_messages__needs_consume(client_factory, topic_factory, error_of):
    topic = topic_factory().name
    client = client_factory(f"produce:{topic}")
    assert error_of(client.get(f"/api/v1/topics/{topic}/messages", {"key": "k"})) == (
        403,
        "permission_denied",
    )


def _scheduled(topic):
    (result,) = log.append_messages(keys.CONSOLE, topic, [NewMessage(value=b"1", delay_ms=60_000)])
    return result.scheduled_id


def test_deliver_now_and_reschedule(api_client, topic_factory, error_of):
    topic = topic_factory().name
    sid = _scheduled(topic)
    later = log.now_ms() + 120_000
    response = api_client.post(
        f"/api/v1/scheduled/{sid}/reschedule", {"deliver_at_ms": later}, content_type=JSON
    )
    assert (response.status_code, response.json()["deliver_at_ms"]) == (200, later)
    response = api_client.post(f"/api/v1/scheduled/{sid}/deliver_now")
    assert response.json()["deliver_at_ms"] <= log.now_ms()
    too_far = log.now_ms() + 10**12
    assert error_of(
        api_client.post(
            f"/api/v1/scheduled/{sid}/reschedule", {"deliver_at_ms": too_far}, content_type=JSON
        )
    ) == (400, "invalid_request")
    assert error_of(api_client.post(f"/api/v1/scheduled/{sid + 1}/deliver_now")) == (
        404,
        "scheduled_not_found",
    )
    assert [a for a, _ in audit_actions()] == [
        "scheduled.reschedule",
        "scheduled.deliver_now",
        "scheduled.reschedule",
        "scheduled.deliver_now",
    ]


def test_deliver_now__needs_produce(client_factory, topic_factory, error_of):
    topic = topic_factory().name
    sid = _scheduled(topic)
    client = client_factory(f"consume:{topic}")
    # As if it did not exist: 403 would tell the key that the id is taken, and by which topic.
    assert error_of(client.post(f"/api/v1/scheduled/{sid}/deliver_now")) == (
        404,
        "scheduled_not_found",
    )


def test_keys__create_list_revoke(api_client, error_of):
    created = api_client.post(
        "/api/v1/keys", {"name": "ci", "permissions": ["produce:orders.*"]}, content_type=JSON
    )
    assert created.status_code == 201
    body = created.json()
    assert body["secret"].startswith("fry_")
    assert (body["permissions"], body["created_by"][:4], body["revoked"]) == (
        ["produce:orders.*"],
        "key:",
        False,
    )
    listed = {k["name"]: k for k in api_client.get("/api/v1/keys").json()}
    assert "secret" not in listed["ci"]
    assert listed["ci"]["last_used_ms"] is None
    revoked = api_client.delete("/api/v1/keys/ci")
    assert (revoked.status_code, revoked.json()["revoked"]) == (200, True)
    assert error_of(api_client.delete("/api/v1/keys/nope")) == (404, "api_key_not_found")
    again = api_client.post(
        "/api/v1/keys", {"name": "ci", "permissions": ["produce:*"]}, content_type=JSON
    )
    assert error_of(again) == (409, "api_key_exists")
    bad = api_client.post(
        "/api/v1/keys", {"name": "x", "permissions": ["fly:*"]}, content_type=JSON
    )
    assert error_of(bad) == (400, "invalid_request")
    assert audit_actions() == [
        ("key.create", "ok"),
        ("key.revoke", "ok"),
        ("key.revoke", "api_key_not_found"),
        ("key.create", "api_key_exists"),
        ("key.create", "invalid_request"),
    ]


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/api/v1/keys"), ("delete", "/api/v1/keys/x"), ("get", "/api/v1/audit")],
)
def test_keys_and_audit__need_admin_all(client_factory, error_of, method, path):
    client = client_factory("admin:orders.*")
    assert error_of(getattr(client, method)(path)) == (403, "permission_denied")


def test_audit__lists_filtered_newest_first(api_client, topic_factory, error_of):
    api_client.post("/api/v1/topics", {"name": "a"}, content_type=JSON)
    api_client.delete("/api/v1/topics/a")
    api_client.delete("/api/v1/topics/a")
    page = api_client.get("/api/v1/audit", {"limit": 2}).json()
    assert [(e["action"], e["outcome"]) for e in page["items"]] == [
        ("topic.delete", "topic_not_found"),
        ("topic.delete", "ok"),
    ]
    older = api_client.get("/api/v1/audit", {"before_id": page["next_before_id"]}).json()
    assert [e["action"] for e in older["items"]] == ["topic.create"]
    assert older["next_before_id"] is None
    only = api_client.get("/api/v1/audit", {"action": "topic.create"}).json()["items"]
    assert [e["target"] for e in only] == ["a"]
    assert error_of(api_client.get("/api/v1/audit", {"source": "web"})) == (400, "invalid_request")
