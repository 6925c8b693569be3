"""Acknowledged delivery over REST against real Daphne processes: deadlines, members on two."""

import threading
import time
from collections import Counter

import httpx
import pytest

from broker import models
from tests.integration.conftest import start_daphne, stop

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
WAIT_S = 20


def client(url, secret):
    return httpx.Client(
        base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )


def ok(response, status=200):
    assert response.status_code == status, response.text
    return response.json() if response.content else None


def test_redeliver_expired__the_server_runs_the_sweep(key_factory, topic_factory):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    # The embedded default: the server runs the periodic table itself, the sweep every 0.2 s.
    server, url = start_daphne(
        FERRY_BACKGROUND_IN_PROCESS="1", FERRY_ACK_SWEEP_INTERVAL_SECONDS="0.2"
    )
    try:
        with client(url, secret) as http:
            ok(http.patch("/groups/g", json={"ack_deadline_ms": 1000, "retry_delays_ms": [0]}))
            ok(http.post(f"/topics/{topic}/messages", json={"messages": [{"value": "hi"}]}))
            ok(http.post("/groups/g/members", json={"topic": topic, "member_id": "m"}), 201)
            poll = {"topic": topic, "member_id": "m", "max_messages": 10}
            [first] = ok(http.post("/groups/g/poll", json=poll))["messages"]
            delivered_s = time.monotonic()
            # Not acked: a long poll gets it again once the deadline passed and the sweep ran.
            [again] = ok(http.post("/groups/g/poll", json={**poll, "max_wait_ms": 5000}))[
                "messages"
            ]
            waited_s = time.monotonic() - delivered_s
            stale = ok(http.post("/groups/g/ack", json={"receipts": [first["receipt"]]}))
            acked = ok(http.post("/groups/g/ack", json={"receipts": [again["receipt"]]}))
            [lag] = ok(http.get("/groups/g"))["topics"][0]["partitions"]
    finally:
        stop(server)
    assert (first["offset"], first["attempt"]) == (0, 1)
    assert (again["offset"], again["attempt"], again["value"]) == (0, 2, "hi")
    assert again["receipt"] != first["receipt"]
    # After the 1 s deadline, and woken by the sweep well before the 5 s poll timeout.
    assert 0.9 < waited_s < 3, waited_s
    assert (stale["settled"], stale["stale"]) == (0, [first["receipt"]])
    assert (acked["settled"], acked["stale"]) == (1, [])
    assert (lag["committed_offset"], lag["in_flight"]) == (1, 0)


def test_deliver_messages__members_on_two_servers_share_the_work(key_factory, topic_factory):
    topic = topic_factory(partitions=4).name
    _, secret = key_factory("admin:*")
    a, url_a = start_daphne()
    b, url_b = start_daphne()
    total = 200
    got: list[tuple[str, int, int, int]] = []
    lock = threading.Lock()
    failures = []

    def member(url, member_id):
        try:
            with client(url, secret) as http:
                ok(
                    http.post("/groups/g/members", json={"topic": topic, "member_id": member_id}),
                    201,
                )
                deadline = time.monotonic() + WAIT_S
                while time.monotonic() < deadline:
                    with lock:
                        if len(got) >= total:
                            break
                    body = {"topic": topic, "member_id": member_id, "max_messages": 7}
                    messages = ok(http.post("/groups/g/poll", json=body))["messages"]
                    if messages:
                        receipts = [m["receipt"] for m in messages]
                        settled = ok(http.post("/groups/g/ack", json={"receipts": receipts}))
                        assert settled["stale"] == [], settled
                    with lock:
                        got.extend(
                            (member_id, m["partition"], m["offset"], m["attempt"]) for m in messages
                        )
                    time.sleep(0 if messages else 0.05)
                ok(http.delete(f"/groups/g/members/{member_id}"), 204)
        except Exception as exc:  # pragma: no cover - surfaced by the assert below
            failures.append(exc)

    try:
        with client(url_a, secret) as http:
            batch = [{"value": i, "partition": i % 4} for i in range(total // 2)]
            ok(http.post(f"/topics/{topic}/messages", json={"messages": batch}))
        on_a = threading.Thread(target=member, args=(url_a, "on-a"))
        on_a.start()
        # The second member joins through the other server while the first delivers (a
        # rebalance), and the second half is produced meanwhile.
        wait_until(lambda: bool(got), "the first deliveries on A")
        on_b = threading.Thread(target=member, args=(url_b, "on-b"))
        on_b.start()
        with client(url_b, secret) as http:
            for start in range(total // 2, total, 20):
                batch = [{"value": i, "partition": i % 4} for i in range(start, start + 20)]
                ok(http.post(f"/topics/{topic}/messages", json={"messages": batch}))
        on_a.join(timeout=WAIT_S + 10)
        on_b.join(timeout=WAIT_S + 10)
        with client(url_b, secret) as http:
            [offsets] = ok(http.get("/groups/g"))["topics"]
    finally:
        stop(a)
        stop(b)
    assert not failures, failures
    places = Counter((p, o) for _, p, o, _ in got)
    assert [place for place, n in places.items() if n > 1] == [], "delivered twice"
    assert len(places) == total
    assert {attempt for *_, attempt in got} == {1}
    assert {member_id for member_id, *_ in got} == {"on-a", "on-b"}
    for lag in offsets["partitions"]:
        assert (lag["committed_offset"], lag["in_flight"]) == (lag["end_offset"], 0), lag
    assert not models.GroupMember.objects.exists()


def wait_until(condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
