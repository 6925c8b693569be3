"""Push mode against a fake WebSocket broker (websockets' own server): frames, reconnects."""

import asyncio
import json

import pytest
from websockets.asyncio.server import serve

from ferry_client import AsyncConsumer, Delivery, FerryError
from ferry_client.records import default_client_name


def item(offset, value):
    return {
        "partition": 0,
        "offset": offset,
        "timestamp_ms": 0,
        "key": None,
        "tag": None,
        "headers": {},
        "id": None,
        "value": value,
        "receipt": f"r{offset}",
        "attempt": 1,
        "deadline_ms": 0,
    }


class FakeBroker:
    """Serves scripted sessions; `script(ws, frames)` runs each connection after the subscribe."""

    def __init__(self, *scripts):
        self.scripts = list(scripts)
        self.subscribes = []
        self.headers = []

    async def __call__(self, ws):
        self.headers.append(ws.request.headers)
        subscribe = json.loads(await ws.recv())
        self.subscribes.append(subscribe)
        script = self.scripts.pop(0)
        await script(ws, subscribe)

    async def start(self):
        self.server = await serve(self, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def subscribed(ws, member_id="m1"):
    answer = {"type": "subscribed", "ref": "subscribe", "sub": "ferry-client"}
    await ws.send(json.dumps({**answer, "member_id": member_id, "partitions": [0]}))


async def frames_until(ws, kinds):
    """Frames received until one of each kind has come."""
    got: list[dict] = []
    while not kinds <= {f["type"] for f in got}:
        got.append(json.loads(await ws.recv()))
    return got


async def consume(url, handler, *, until, **options):
    consumer = AsyncConsumer(url, "key", "g", "t", handler, **options)
    task = asyncio.create_task(consumer.run())
    async with asyncio.timeout(5):
        await until.wait()
        consumer.stop()
        await task


async def test_subscriber__settles_on_the_socket_and_unsubscribes():
    settled = asyncio.Event()
    seen = []

    async def session(ws, subscribe):
        await subscribed(ws)
        await ws.send(json.dumps({"type": "messages", "items": [item(0, "ok"), item(1, "bad")]}))
        seen.extend(await frames_until(ws, {"ack", "nack"}))
        settled.set()
        seen.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"type": "unsubscribed", "ref": "unsubscribe"}))

    def handler(delivery):
        if delivery.value == "bad":
            raise ValueError("boom")

    broker = FakeBroker(session)
    await consume(await broker.start(), handler, until=settled)
    broker.server.close()
    assert broker.headers[0]["Authorization"] == "Bearer key"
    assert broker.subscribes[0] == {
        "type": "subscribe",
        "ref": "subscribe",
        "sub": "ferry-client",
        "topic": "t",
        "group": "g",
        "prefetch": 10,
        "from": "committed",
        "client": default_client_name(),
    }
    by_type = {f["type"]: f for f in seen}
    assert by_type["ack"]["receipts"] == ["r0"]
    assert (by_type["nack"]["receipts"], by_type["nack"]["error"]) == (["r1"], "boom")
    assert seen[-1]["type"] == "unsubscribe"


async def test_subscriber__resubscribes_as_the_same_member_after_closing():
    done = asyncio.Event()
    values: list[Delivery] = []

    async def first(ws, subscribe):
        await subscribed(ws, member_id="m1")
        await ws.send(json.dumps({"type": "messages", "items": [item(0, "before")]}))
        await frames_until(ws, {"ack"})
        await ws.send(json.dumps({"type": "closing", "reason": "server shutting down"}))
        await ws.close(1001)

    async def second(ws, subscribe):
        await subscribed(ws, member_id=subscribe.get("member_id"))
        await ws.send(json.dumps({"type": "messages", "items": [item(1, "after")]}))
        await frames_until(ws, {"ack"})
        done.set()
        await frames_until(ws, {"unsubscribe"})

    broker = FakeBroker(first, second)
    await consume(await broker.start(), values.append, until=done, filter={"tags": "a"})
    broker.server.close()
    assert [d.value for d in values] == ["before", "after"]
    assert [s.get("member_id") for s in broker.subscribes] == [None, "m1"]
    assert broker.subscribes[1]["filter"] == {"tags": "a"}


async def test_subscriber__a_refused_subscription_raises():
    async def refuse(ws, subscribe):
        error = {"code": "permission_denied", "message": "no", "detail": {"topic": "t"}}
        await ws.send(json.dumps({"type": "error", "ref": "subscribe", "error": error}))
        await ws.wait_closed()

    broker = FakeBroker(refuse)
    consumer = AsyncConsumer(await broker.start(), "key", "g", "t", print)
    with pytest.raises(FerryError) as refused:
        async with asyncio.timeout(5):
            await consumer.run()
    broker.server.close()
    assert (refused.value.code, refused.value.detail) == ("permission_denied", {"topic": "t"})


async def test_subscriber__outage_refusals_and_closes_resubscribe_after_retry_after():
    """A subscribe refused as unavailable, a subscription ended by a full disk, and a server
    close (4503) are each followed by a new subscribe (docs/operations.md)."""
    done = asyncio.Event()
    values: list[Delivery] = []
    outage = {"code": "unavailable", "message": "database away", "detail": {"retry_after": 0.05}}
    full = {"code": "insufficient_storage", "message": "disk full", "detail": {"retry_after": 0}}

    async def refused(ws, subscribe):
        await ws.send(json.dumps({"type": "error", "ref": "subscribe", "error": outage}))
        await ws.wait_closed()

    async def ended(ws, subscribe):
        await subscribed(ws, member_id="m1")
        await ws.send(json.dumps({"type": "error", "sub": "ferry-client", "error": full}))
        await ws.wait_closed()

    async def closed(ws, subscribe):
        await subscribed(ws, member_id="m1")
        await ws.close(4503, "unavailable")

    async def served(ws, subscribe):
        await subscribed(ws, member_id="m1")
        await ws.send(json.dumps({"type": "messages", "items": [item(0, "after")]}))
        await frames_until(ws, {"ack"})
        done.set()
        await frames_until(ws, {"unsubscribe"})

    broker = FakeBroker(refused, ended, closed, served)
    await consume(await broker.start(), values.append, until=done)
    broker.server.close()
    assert [d.value for d in values] == ["after"]
    assert len(broker.subscribes) == 4


def test_consumer__refuses_bad_options():
    with pytest.raises(ValueError, match="mode"):
        AsyncConsumer("http://h", "k", "g", "t", print, mode="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency"):
        AsyncConsumer("http://h", "k", "g", "t", print, concurrency=0)
    with pytest.raises(ValueError, match="push mode"):
        AsyncConsumer("http://h", "k", "g", "t", print, mode="pull", start="latest")
