"""WebSocket push against real Daphne: across processes through Redis, shutdown, catch-up."""

import subprocess
import tempfile
import time
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from broker import models
from tests.integration.conftest import ROOT, free_port, start_daphne, stop

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/ws/v1/"


def open_ws(url, secret):
    return connect(ws_url(url), additional_headers={"Authorization": f"Bearer {secret}"})


def send(ws, frame):
    ws.send(orjson.dumps(frame).decode())


def recv_type(ws, kind, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        frame = orjson.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if frame["type"] == kind:
            return frame


def scraped(http_url: str, name: str) -> list[Any]:
    """The samples of one metric in the server's /metrics."""
    text = httpx.get(f"{http_url}/metrics").text
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def database_calls(http_url: str) -> Counter[tuple[str, str]]:
    """The server's ferry_database_calls_total by (pool, call), from its /metrics."""
    return Counter(
        {
            (s.labels["pool"], s.labels["call"]): int(s.value)
            for s in scraped(http_url, "ferry_database_calls_total")
        }
    )


def cache_reads(http_url: str) -> Counter[str]:
    """The server's ferry_message_cache_reads_total by result, from its /metrics."""
    samples = scraped(http_url, "ferry_message_cache_reads_total")
    return Counter({s.labels["result"]: int(s.value) for s in samples})


def subscribe(ws, topic, group="g", **fields):
    send(ws, {"type": "subscribe", "sub": "s", "topic": topic, "group": group, **fields})
    return recv_type(ws, "subscribed")


def test_push__published_on_one_process_reaches_subscribers_on_both(
    redis_url, key_factory, topic_factory
):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    # A long heartbeat interval: only the Redis wake-up can bring the message quickly.
    env = {"REDIS_URL": redis_url, "FERRY_HEARTBEAT_INTERVAL_MS": "20000"}
    a, url_a = start_daphne(**env)
    b, url_b = start_daphne(**env)
    try:
        with (
            open_ws(url_b, secret) as subscriber,
            open_ws(url_a, secret) as producer,
            open_ws(url_a, secret) as neighbour,
        ):
            subscribe(subscriber, topic)
            # On the producer's process: woken straight from the commit, not through Redis.
            subscribe(neighbour, topic, group="g2")
            started = time.monotonic()
            send(
                producer,
                {"type": "publish", "ref": 1, "topic": topic, "messages": [{"value": "hi"}]},
            )
            assert recv_type(producer, "published")["results"][0]["offset"] == 0
            items = recv_type(subscriber, "messages", timeout=5)["items"]
            elapsed = time.monotonic() - started
            near = recv_type(neighbour, "messages", timeout=5)["items"]
    finally:
        stop(a)
        stop(b)
    assert [m["value"] for m in items] == ["hi"]
    assert [m["value"] for m in near] == ["hi"]
    assert elapsed < 3, elapsed


def test_push__on_the_committing_process_needs_no_redis(key_factory, topic_factory):
    """A subscriber on the process that committed the message is woken straight from the
    commit, also while Redis is unreachable (docs/operations.md): not after a database poll."""
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    redis_script = str(ROOT / "scripts" / "redis")
    with tempfile.TemporaryDirectory(prefix="ferry-redis-") as directory:
        started = subprocess.run(
            [redis_script, "start", directory, str(free_port())],
            check=True,
            capture_output=True,
            text=True,
        )
        redis_url = started.stdout.strip().splitlines()[-1]
        # Long heartbeats and database polls: only the wake-up can bring the message quickly.
        server, url = start_daphne(
            REDIS_URL=redis_url, FERRY_WAKEUP_POLL_MS="30000", FERRY_HEARTBEAT_INTERVAL_MS="20000"
        )
        try:
            with open_ws(url, secret) as subscriber, open_ws(url, secret) as producer:
                subscribe(subscriber, topic)
                subprocess.run([redis_script, "stop", directory], check=True, capture_output=True)
                started_at = time.monotonic()
                send(producer, {"type": "publish", "topic": topic, "messages": [{"value": 1}]})
                recv_type(producer, "published")
                items = recv_type(subscriber, "messages", timeout=10)["items"]
                elapsed = time.monotonic() - started_at
        finally:
            stop(server)
            subprocess.run([redis_script, "stop", directory], check=False, capture_output=True)
    assert [m["value"] for m in items] == [1]
    assert elapsed < 3, elapsed


def test_shutdown__tells_subscribers_and_returns_their_messages(key_factory, topic_factory):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne()
    try:
        with open_ws(url, secret) as ws:
            subscribe(ws, topic)
            send(ws, {"type": "publish", "topic": topic, "messages": [{"value": 1}]})
            recv_type(ws, "messages")
            assert models.InFlight.objects.get().state == "delivered"
            server.terminate()
            closing = recv_type(ws, "closing")
            assert closing["reason"]
            with pytest.raises(ConnectionClosed) as closed:
                recv_type(ws, "never")
            server.wait(timeout=15)
    finally:
        stop(server)
    # Autobahn sends only 1000 or 3000-4999: ours, not RFC 6455's 1001 (docs/websocket.md).
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4503
    # Back with the group at once, and the member gone.
    assert models.InFlight.objects.get().state == "retry_wait"
    assert not models.GroupMember.objects.exists()


def test_reconnect__offline_subscriber_catches_up(broker_url, key_factory, topic_factory):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    with open_ws(broker_url, secret) as ws:
        subscribe(ws, topic)
        send(ws, {"type": "publish", "topic": topic, "messages": [{"value": 1}]})
        item = recv_type(ws, "messages")["items"][0]
        send(ws, {"type": "ack", "sub": "s", "receipts": [item["receipt"]]})
        recv_type(ws, "acked")
    with open_ws(broker_url, secret) as producer:
        send(
            producer, {"type": "publish", "topic": topic, "messages": [{"value": 2}, {"value": 3}]}
        )
        recv_type(producer, "published")
    with open_ws(broker_url, secret) as ws:
        subscribe(ws, topic)
        items = recv_type(ws, "messages")["items"]
    assert [m["value"] for m in items] == [2, 3]
    # The server leaves the group after the socket closes; let it finish before the test's
    # database is flushed.
    deadline = time.monotonic() + 10
    while models.GroupMember.objects.exists():
        assert time.monotonic() < deadline, "the subscription did not leave its group"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["close", "shutdown"])
def test_held_ack__settled_when_the_socket_closes_or_the_server_stops(
    how, key_factory, topic_factory
):
    """An ack still held for the next push (FERRY_WS_ACK_HOLD_MS) when the client closes the
    socket, or the server is told to stop, is settled: not handed back to the group."""
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne(FERRY_WS_ACK_HOLD_MS="60000")
    try:
        with open_ws(url, secret) as ws:
            subscribe(ws, topic, prefetch=8)
            send(ws, {"type": "publish", "topic": topic, "messages": [{"value": 1}]})
            item = recv_type(ws, "messages")["items"][0]
            send(ws, {"type": "ack", "ref": 1, "sub": "s", "receipts": [item["receipt"]]})
            # Held: nothing answers it for a minute.
            with pytest.raises(TimeoutError):
                recv_type(ws, "acked", timeout=0.3)
            if how == "shutdown":
                server.terminate()
                recv_type(ws, "closing")
                server.wait(timeout=15)
        deadline = time.monotonic() + 10
        while models.GroupMember.objects.exists():
            assert time.monotonic() < deadline, "the subscription did not leave its group"
            time.sleep(0.05)
    finally:
        stop(server)
    assert not models.InFlight.objects.exists()
    offset = models.GroupOffset.objects.get(group__name="g")
    assert offset.committed_offset == 1


def test_held_acks__a_subscriber_acking_each_message_of_a_fast_stream_gets_them_all(
    broker_url, key_factory, topic_factory
):
    """Single-message publishes about a millisecond apart to a subscriber that acks each push
    (as bench/per_message.py's end-to-end run): acks go with the next push or are settled by
    their timer, often both at once. A timer's settlement that waited for itself once stalled
    the connection after a few hundred messages; here every message comes and is settled."""
    import asyncio

    from websockets.asyncio.client import connect as connect_async

    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    total = 1000
    headers = {"Authorization": f"Bearer {secret}"}

    async def run() -> tuple[list[int], int]:
        url = ws_url(broker_url)
        async with (
            connect_async(url, additional_headers=headers) as sub,
            connect_async(url, additional_headers=headers) as pub,
        ):
            await sub.send(
                orjson.dumps(
                    {"type": "subscribe", "sub": "s", "topic": topic, "group": "g", "prefetch": 64}
                ).decode()
            )
            while orjson.loads(await sub.recv())["type"] != "subscribed":
                pass
            values: list[int] = []
            acked = 0

            async def listen() -> None:
                nonlocal acked
                while acked < total:
                    frame = orjson.loads(await sub.recv())
                    if frame["type"] == "messages":
                        values.extend(m["value"] for m in frame["items"])
                        receipts = [m["receipt"] for m in frame["items"]]
                        await sub.send(
                            orjson.dumps({"type": "ack", "sub": "s", "receipts": receipts}).decode()
                        )
                    elif frame["type"] == "acked":
                        acked += frame["settled"]

            async def drain() -> None:
                for _ in range(total):
                    await pub.recv()

            tasks = asyncio.gather(listen(), drain())
            for i in range(total):
                await pub.send(
                    orjson.dumps(
                        {"type": "publish", "topic": topic, "messages": [{"value": i}]}
                    ).decode()
                )
                await asyncio.sleep(0.001)
            await asyncio.wait_for(tasks, 30)
            return values, acked

    before, kept_before = database_calls(broker_url), cache_reads(broker_url)
    values, acked = asyncio.run(run())
    assert sorted(values) == list(range(total))
    assert acked == total
    # The commits ran on the server's database thread; the pushes and acks (a few messages
    # each) ran on its event loop, between them (dbthreads.run_here).
    grown = database_calls(broker_url) - before
    assert grown[("write", "append_batches")] >= 1
    assert sum(n for (pool, _), n in grown.items() if pool == "loop") >= 1
    # Published to this process, the messages were pushed from its memory (log/recent.py).
    assert (cache_reads(broker_url) - kept_before)["kept"] >= 1
    deadline = time.monotonic() + 10
    while models.GroupMember.objects.exists():
        assert time.monotonic() < deadline, "the subscription did not leave its group"
        time.sleep(0.05)
    assert not models.InFlight.objects.exists()


def test_read_ahead__a_prefetch_2_subscriber_gets_each_message_once_and_the_rest_goes_back(
    key_factory, topic_factory
):
    """A subscriber with prefetch 2 that acks each message as it comes (FERRY_WS_READ_AHEAD):
    the backlog comes in order, once each, never more than 2 in hand, every ack answered; when
    the server stops, what it had read ahead goes back to the group with the messages in hand,
    and the acked ones stay acked."""
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne()
    total, acking = 300, 200
    try:
        with open_ws(url, secret) as ws:
            send(
                ws,
                {
                    "type": "publish",
                    "topic": topic,
                    "messages": [{"value": i} for i in range(total)],
                },
            )
            recv_type(ws, "published")
            subscribe(ws, topic, prefetch=2)
            values: list[int] = []
            acks_sent = answered = 0
            while acks_sent < acking or answered < acking:
                frame = orjson.loads(ws.recv(timeout=10))
                if frame["type"] == "acked":
                    answered += frame["settled"]
                    continue
                assert frame["type"] == "messages"
                for m in frame["items"]:
                    values.append(m["value"])
                    assert len(values) - acks_sent <= 2
                    if acks_sent < acking:
                        send(ws, {"type": "ack", "sub": "s", "receipts": [m["receipt"]]})
                        acks_sent += 1
            assert values == list(range(acking + 2))
            assert answered == acking
            server.terminate()
            recv_type(ws, "closing")
            server.wait(timeout=15)
    finally:
        stop(server)
    offset = models.GroupOffset.objects.get(group__name="g")
    assert offset.committed_offset == acking
    runs = models.InFlight.objects.values_list("offset", "last_offset", "state")
    waiting = sorted(o for first, last, state in runs for o in range(first, last + 1))
    # The two in hand, and the 16 read ahead after them (FERRY_WS_READ_AHEAD's default, topped
    # up as acks come): back with the group.
    assert waiting == list(range(acking, acking + 2 + 16))
    assert {state for *_, state in runs} == {"retry_wait"}


def test_nack__a_failed_batch_comes_back_whole_and_one_failed_message_alone(
    broker_url, key_factory, topic_factory
):
    """A subscriber that fails its whole batch gets it again, each message a second attempt;
    one that then fails one message gets that one again. Every message is acked once."""
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    with open_ws(broker_url, secret) as ws:
        subscribe(ws, topic, prefetch=10)
        send(ws, {"type": "publish", "topic": topic, "messages": [{"value": i} for i in range(10)]})

        def take(count):
            items: list[dict] = []
            while len(items) < count:
                items += recv_type(ws, "messages")["items"]
            return items

        first = take(10)
        receipts = [m["receipt"] for m in first]
        send(ws, {"type": "nack", "sub": "s", "receipts": receipts, "delay_ms": 0})
        assert recv_type(ws, "nacked")["settled"] == 10
        again = take(10)
        assert sorted((m["offset"], m["attempt"]) for m in again) == [(o, 2) for o in range(10)]
        send(ws, {"type": "nack", "sub": "s", "receipts": [again[4]["receipt"]], "delay_ms": 0})
        assert recv_type(ws, "nacked")["settled"] == 1
        (third,) = take(1)
        assert (third["offset"], third["attempt"]) == (again[4]["offset"], 3)
        rest = [m["receipt"] for m in again if m is not again[4]] + [third["receipt"]]
        send(ws, {"type": "ack", "sub": "s", "receipts": rest})
        assert recv_type(ws, "acked")["settled"] == 10
    offsets = models.GroupOffset.objects.filter(partition__topic__name=topic)
    assert [o.committed_offset for o in offsets] == [10]
    assert not models.InFlight.objects.filter(partition__topic__name=topic).exists()
    deadline = time.monotonic() + 10
    while models.GroupMember.objects.exists():
        assert time.monotonic() < deadline, "the subscription did not leave its group"
        time.sleep(0.05)
