"""The WebSocket protocol through Channels' communicator (docs/websocket.md)."""

import contextlib
import json

import orjson
import pytest
from channels.testing import WebsocketCommunicator

from broker.core import groups, keys, log, topics
from broker.core.records import NewMessage
from mqsite.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


async def connect(secret=None, path="/ws/v1/", headers=None):
    url = f"{path}?token={secret}" if secret and headers is None else path
    comm = WebsocketCommunicator(
        application, url, headers=headers or [(b"origin", b"http://localhost")]
    )
    connected, _ = await comm.connect()
    assert connected
    return comm


async def send(comm, frame):
    await comm.send_to(text_data=orjson.dumps(frame).decode())


async def recv(comm, timeout=3):
    return orjson.loads(await comm.receive_from(timeout=timeout))


async def recv_type(comm, kind, timeout=3):
    while True:
        frame = await recv(comm, timeout)
        if frame["type"] == kind:
            return frame


@contextlib.asynccontextmanager
async def session(secret):
    comm = await connect(secret)
    try:
        yield comm
    finally:
        await comm.disconnect()


def make_key(*perms):
    from asgiref.sync import sync_to_async

    async def inner():
        return await sync_to_async(
            lambda: keys.create_api_key(
                keys.CONSOLE,
                f"k{id(perms)}-{len(perms)}",
                [keys.parse_permission(p) for p in perms],
            )[1]
        )()

    return inner()


async def sync(fn, *args, **kwargs):
    from asgiref.sync import sync_to_async

    return await sync_to_async(fn)(*args, **kwargs)


async def new_topic(name, partitions=1, **options):
    return await sync(topics.create_topic, keys.CONSOLE, name, partitions, **options)


async def produce(name, values, **fields):
    return await sync(
        log.append_messages,
        keys.CONSOLE,
        name,
        [NewMessage(orjson.dumps(v), **fields) for v in values],
    )


async def test_subscribe__pushes_and_acks():
    secret = await make_key("admin:*")
    await new_topic("t1")
    await produce("t1", [1, 2, 3])
    async with session(secret) as ws:
        await send(ws, {"type": "subscribe", "sub": "s", "topic": "t1", "group": "g", "ref": 1})
        subscribed = await recv(ws)
        assert subscribed["type"] == "subscribed"
        assert subscribed["partitions"] == [0]
        frame = await recv_type(ws, "messages")
        assert [m["value"] for m in frame["items"]] == [1, 2, 3]
        assert all(m["attempt"] == 1 and m["receipt"] for m in frame["items"])
        await send(
            ws, {"type": "ack", "sub": "s", "receipts": [m["receipt"] for m in frame["items"]]}
        )
        acked = await recv_type(ws, "acked")
        assert acked["settled"] == 3
        # New messages are pushed as they are committed.
        await produce("t1", [4])
        frame = await recv_type(ws, "messages")
        assert [m["value"] for m in frame["items"]] == [4]


async def test_subscribe__credit_is_never_exceeded():
    secret = await make_key("admin:*")
    await new_topic("t2")
    await produce("t2", list(range(10)))
    async with session(secret) as ws:
        await send(
            ws, {"type": "subscribe", "sub": "s", "topic": "t2", "group": "g", "prefetch": 3}
        )
        await recv_type(ws, "subscribed")
        frame = await recv_type(ws, "messages")
        assert len(frame["items"]) == 3
        assert await ws.receive_nothing(timeout=0.3)
        await send(ws, {"type": "ack", "sub": "s", "receipts": [frame["items"][0]["receipt"]]})
        await recv_type(ws, "acked")
        frame = await recv_type(ws, "messages")
        assert len(frame["items"]) == 1
        await send(ws, {"type": "credit", "sub": "s", "n": 2})
        frame = await recv_type(ws, "messages")
        assert len(frame["items"]) == 2


async def test_nack__redelivered_with_next_attempt():
    secret = await make_key("admin:*")
    await new_topic("t3")
    await sync(groups.configure_group, keys.CONSOLE, "g", retry_delays_ms=[0])
    await produce("t3", ["x"])
    async with session(secret) as ws:
        await send(ws, {"type": "subscribe", "sub": "s", "topic": "t3", "group": "g"})
        item = (await recv_type(ws, "messages"))["items"][0]
        await send(ws, {"type": "nack", "sub": "s", "receipts": [item["receipt"]], "error": "e"})
        await recv_type(ws, "nacked")
        again = (await recv_type(ws, "messages"))["items"][0]
        assert (again["offset"], again["attempt"]) == (0, 2)
        await send(ws, {"type": "reject", "sub": "s", "receipts": [again["receipt"]]})
        assert (await recv_type(ws, "rejected"))["dead_lettered"] == 1


async def test_disconnect__redelivers_to_another_member():
    secret = await make_key("admin:*")
    await new_topic("t4")
    await produce("t4", ["x"])
    a = await connect(secret)
    await send(a, {"type": "subscribe", "sub": "s", "topic": "t4", "group": "g"})
    assert (await recv_type(a, "messages"))["items"][0]["value"] == "x"
    async with session(secret) as b:
        await send(b, {"type": "subscribe", "sub": "s", "topic": "t4", "group": "g"})
        await recv_type(b, "subscribed")
        await a.disconnect()
        item = (await recv_type(b, "messages", timeout=5))["items"][0]
        assert item["value"] == "x"


async def test_publish__durable_and_idempotent():
    secret = await make_key("admin:*")
    await new_topic("t5")
    async with session(secret) as ws:
        frame = {
            "type": "publish",
            "ref": "p1",
            "topic": "t5",
            "messages": [{"value": 1, "id": "a"}],
        }
        await send(ws, frame)
        first = await recv_type(ws, "published")
        await send(ws, frame)
        second = await recv_type(ws, "published")
    assert first["ref"] == "p1"
    assert first["results"][0]["offset"] == 0
    assert not first["results"][0]["duplicate"]
    assert second["results"][0]["duplicate"]


async def test_malformed_frames__error_and_still_usable():
    secret = await make_key("admin:*")
    async with session(secret) as ws:
        await ws.send_to(text_data="{nope")
        assert (await recv(ws))["error"]["code"] == "malformed_json"
        await send(ws, {"type": "warp", "ref": 7})
        error = await recv(ws)
        assert (error["error"]["code"], error["ref"]) == ("unknown_frame", 7)
        await send(ws, {"type": "subscribe", "sub": "s"})
        assert (await recv(ws))["error"]["code"] == "invalid_frame"
        await send(ws, {"type": "ack", "sub": "nope", "receipts": ["0123456789abcdef.1.0"]})
        assert (await recv(ws))["error"]["code"] == "subscription_not_found"
        await send(ws, {"type": "ping", "ref": "x"})
        assert (await recv(ws))["type"] == "pong"


async def test_auth__frame_header_and_permissions():
    secret = await make_key("consume:other.*")
    await new_topic("t6")
    ws = await connect()
    try:
        await send(ws, {"type": "subscribe", "sub": "s", "topic": "t6", "group": "g"})
        assert (await recv(ws))["error"]["code"] == "unauthenticated"
        await send(ws, {"type": "auth", "token": "wrong"})
        assert (await recv(ws))["error"]["code"] == "unauthenticated"
        await send(ws, {"type": "auth", "token": secret})
        assert (await recv(ws))["type"] == "authenticated"
        await send(ws, {"type": "subscribe", "sub": "s", "topic": "t6", "group": "g"})
        assert (await recv(ws))["error"]["code"] == "permission_denied"
    finally:
        await ws.disconnect()
    header = await connect(
        headers=[(b"authorization", f"Bearer {secret}".encode()), (b"origin", b"http://localhost")]
    )
    await send(header, {"type": "ping"})
    assert (await recv(header))["type"] == "pong"
    await header.disconnect()


async def test_frame_too_large__closes():
    from django.test import override_settings

    secret = await make_key("admin:*")
    with override_settings(FERRY_WS_MAX_FRAME_BYTES=100):
        ws = await connect(secret)
        await ws.send_to(text_data="x" * 200)
        assert (await recv(ws))["error"]["code"] == "frame_too_large"
        closed = await ws.receive_output(timeout=1)
        assert closed == {"type": "websocket.close", "code": 4413}
        await ws.disconnect()


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "subscribe", "sub": "s", "topic": "t", "group": "g", "prefetch": True},
        {"type": "subscribe", "sub": "s", "topic": "t", "group": "g", "timestamp_ms": 2**63},
        {"type": "credit", "sub": "s", "n": True},
        {"type": "ping", "ref": True},
        {"type": "ping", "ref": 2**64},
        {"type": "extend", "sub": "s", "receipts": ["0123456789abcdef.1.0"], "extend_ms": 2**63},
        {"type": "ack", "sub": "s", "receipts": ["a.ffffffffffffffffffff.1"]},
        {"type": "publish", "topic": "t", "messages": [{"value": 1, "partition": False}]},
        {"type": "subscribe", "sub": "s", "topic": "t", "group": "g", "filter": {"tags": 1}},
    ],
)
async def test_strict_and_bounded_frames__invalid_frame(frame):
    secret = await make_key("admin:*")
    async with session(secret) as ws:
        # json: orjson refuses integers past 64 bits, which is what some of these send.
        await ws.send_to(text_data=json.dumps(frame))
        assert (await recv(ws))["error"]["code"] == "invalid_frame"
        await send(ws, {"type": "ping", "ref": 1})
        assert (await recv(ws))["type"] == "pong"


async def test_publish__value_nested_too_deep_is_invalid_frame():
    secret = await make_key("admin:*")
    async with session(secret) as ws:
        value = "[" * 300 + "1" + "]" * 300
        await ws.send_to(
            text_data='{"type": "publish", "ref": 1, "topic": "t", "messages": [{"value": '
            + value
            + "}]}"
        )
        error = await recv(ws)
        assert (error["error"]["code"], error["ref"]) == ("invalid_frame", 1)


async def test_push_task_failure__the_member_leaves_and_its_messages_go_back(monkeypatch):
    """Issue 9, item 1: a failed subscription kept its member and prefetch in flight."""
    from broker import consumers as consumers_module
    from broker import models

    secret = await make_key("admin:*")
    await new_topic("fails")
    await produce("fails", [1, 2, 3])
    sent = 0
    real_push = consumers_module.BrokerConsumer._push

    async def push_then_fail(self, s, deliveries):
        nonlocal sent
        sent += 1
        if sent > 1:
            raise RuntimeError("the socket broke")
        await real_push(self, s, deliveries)

    monkeypatch.setattr(consumers_module.BrokerConsumer, "_push", push_then_fail)
    async with session(secret) as ws:
        await send(
            ws, {"type": "subscribe", "sub": "s", "topic": "fails", "group": "g", "prefetch": 1}
        )
        await recv_type(ws, "messages")
        await produce("fails", [4])
        await send(ws, {"type": "credit", "sub": "s", "n": 5})
        error = await recv_type(ws, "error")
        assert error["sub"] == "s"
        members = await sync(lambda: list(models.GroupMember.objects.all()))
        states = await sync(lambda: list(models.InFlight.objects.values_list("state", flat=True)))
    assert members == []
    assert "delivered" not in states


async def test_subscribe__client_name_shown_with_the_member():
    secret = await make_key("admin:*")
    await new_topic("t-client")
    async with session(secret) as ws:
        frame = {
            "type": "subscribe",
            "sub": "s",
            "topic": "t-client",
            "group": "g",
            "client": "ui-1",
        }
        await send(ws, frame)
        await recv_type(ws, "subscribed")
        info = await sync(groups.describe_group, keys.CONSOLE, "g")
        [member] = info.members
        assert member.client == "ui-1"
        assert member.host.startswith("websocket")


async def test_connection_failure__closes_4500_and_the_member_leaves(monkeypatch):
    """Issue 17: whatever ends the connection ends its members; never 1011."""
    from broker import models
    from broker.consumers import BrokerConsumer

    async def broken(self, text_data=None, bytes_data=None):
        raise RuntimeError("a bug below the frame handlers")

    secret = await make_key("admin:*")
    await new_topic("breaks")
    ws = await connect(secret)
    await send(ws, {"type": "subscribe", "sub": "s", "topic": "breaks", "group": "g"})
    await recv_type(ws, "subscribed")
    # A failure the frame handlers do not answer: the consumer's application fails.
    monkeypatch.setattr(BrokerConsumer, "receive", broken)
    await send(ws, {"type": "ping"})
    closed = await ws.receive_output(timeout=3)
    assert closed == {"type": "websocket.close", "code": 4500}
    await ws.wait(timeout=3)
    assert await sync(lambda: list(models.GroupMember.objects.all())) == []


async def test_disconnect__a_leave_that_cannot_be_written_stops_heartbeating(monkeypatch, settings):
    """Issue 17: the database failing while a socket closes leaves members that no longer
    heartbeat (every subscription's, not only the first's), so the session timeout expires them."""
    import asyncio

    from django.db.utils import OperationalError

    from broker import models
    from broker.core import membership

    def database_away(*args, **kwargs):
        raise OperationalError("the database went away")

    def heartbeats():
        return sorted(models.GroupMember.objects.values_list("heartbeat_ms", flat=True))

    settings.FERRY_HEARTBEAT_INTERVAL_MS = 100
    secret = await make_key("admin:*")
    await sync(groups.configure_group, keys.CONSOLE, "g", session_timeout_ms=1000)
    ws = await connect(secret)
    for name in ("gone1", "gone2"):
        await new_topic(name)
        await send(ws, {"type": "subscribe", "sub": name, "topic": name, "group": "g"})
        await recv_type(ws, "subscribed")
    monkeypatch.setattr(membership, "leave_group", database_away)
    await ws.disconnect()
    beats = await sync(heartbeats)
    await asyncio.sleep(0.5)

    assert len(beats) == 2
    assert await sync(heartbeats) == beats
    await asyncio.sleep(0.6)
    assert await sync(membership.expire_members) == 2
