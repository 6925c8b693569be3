"""An ack of a subscriber with credit left waits for the next push and is settled with it.

See docs/websocket.md#flow-control-credit (FERRY_WS_ACK_HOLD_MS). Acked is still acked: the
hold ends with the next push, after the hold time, before any other settlement of the
subscription, and before an unsubscribe or a closed socket hands its messages back.
"""

import asyncio

import pytest
from django.test import override_settings

from broker import models
from broker.core import delivery
from tests.ws.test_consumers import (
    make_key,
    new_topic,
    produce,
    recv,
    recv_type,
    send,
    session,
    sync,
)

pytestmark = pytest.mark.django_db(transaction=True)


def count_calls(monkeypatch, name):
    calls = []
    real = getattr(delivery, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(delivery, name, counted)
    return calls


async def subscribed(ws, topic, prefetch=8, sub="s"):
    await send(
        ws, {"type": "subscribe", "sub": sub, "topic": topic, "group": "g", "prefetch": prefetch}
    )
    await recv_type(ws, "subscribed")


async def in_flight(topic):
    return await sync(lambda: models.InFlight.objects.filter(partition__topic__name=topic).count())


@override_settings(FERRY_WS_ACK_HOLD_MS=10_000)
async def test_held_ack__settled_with_the_next_push_in_one_call(monkeypatch):
    secret = await make_key("admin:*")
    await new_topic("h1")
    async with session(secret) as ws:
        await subscribed(ws, "h1")
        await produce("h1", [0])
        (item,) = (await recv_type(ws, "messages"))["items"]
        # A late wake-up (the join's own) makes the push task look again, with whatever ack
        # it holds then: let it pass first.
        assert await ws.receive_nothing(timeout=0.3)
        alone = count_calls(monkeypatch, "ack_messages")
        together = count_calls(monkeypatch, "ack_and_deliver")
        await send(ws, {"type": "ack", "ref": 7, "sub": "s", "receipts": [item["receipt"]]})
        # Held: not settled yet, and nothing answered.
        assert await ws.receive_nothing(timeout=0.2)
        assert await in_flight("h1") == 1
        await produce("h1", [1])
        # The answer, then the push, from one call.
        acked = await recv(ws)
        assert (acked["type"], acked["ref"], acked["settled"]) == ("acked", 7, 1)
        pushed = await recv(ws)
        assert pushed["type"] == "messages"
        assert [m["value"] for m in pushed["items"]] == [1]
        assert (len(together), alone) == (1, [])
        assert await in_flight("h1") == 1  # only the new one


@override_settings(FERRY_WS_ACK_HOLD_MS=50)
async def test_held_ack__settled_alone_when_no_push_comes():
    secret = await make_key("admin:*")
    await new_topic("h2")
    await produce("h2", [0])
    async with session(secret) as ws:
        await subscribed(ws, "h2")
        (item,) = (await recv_type(ws, "messages"))["items"]
        await send(ws, {"type": "ack", "ref": 1, "sub": "s", "receipts": [item["receipt"]]})
        acked = await recv(ws, timeout=2)
        assert (acked["type"], acked["ref"], acked["settled"]) == ("acked", 1, 1)
        assert await in_flight("h2") == 0


@pytest.mark.parametrize(("then", "answer"), [("nack", "nacked"), ("ack", "acked")])
@override_settings(FERRY_WS_ACK_HOLD_MS=300)
async def test_held_ack__settled_first_when_another_settlement_comes(then, answer):
    """A nack, or a second ack, after a held ack: answered in the order they came (a second
    ack is held in turn: the push task had pushed all there was, so the credit the first
    frees does not wake it, and the hold's end settles it)."""
    secret = await make_key("admin:*")
    topic = f"h3-{then}"
    await new_topic(topic)
    await produce(topic, [0, 1])
    async with session(secret) as ws:
        await subscribed(ws, topic)
        first, second = (await recv_type(ws, "messages"))["items"]
        await send(ws, {"type": "ack", "ref": 1, "sub": "s", "receipts": [first["receipt"]]})
        await send(ws, {"type": then, "ref": 2, "sub": "s", "receipts": [second["receipt"]]})
        answers = [await recv(ws), await recv(ws)]
        assert [(a["type"], a["ref"], a["settled"]) for a in answers] == [
            ("acked", 1, 1),
            (answer, 2, 1),
        ]


@pytest.mark.parametrize("how", ["unsubscribe", "disconnect"])
@override_settings(FERRY_WS_ACK_HOLD_MS=10_000)
async def test_held_ack__settled_before_the_member_leaves(how):
    """Else the leave would hand the acked message to the rest of the group again."""
    secret = await make_key("admin:*")
    await new_topic("h5")
    await produce("h5", [0])
    async with session(secret) as ws:
        await subscribed(ws, "h5")
        (item,) = (await recv_type(ws, "messages"))["items"]
        await send(ws, {"type": "ack", "ref": 1, "sub": "s", "receipts": [item["receipt"]]})
        if how == "unsubscribe":
            await send(ws, {"type": "unsubscribe", "ref": 2, "sub": "s"})
            assert [(await recv(ws))["type"], (await recv(ws))["type"]] == [
                "acked",
                "unsubscribed",
            ]
    # Disconnected (with the ack still held, for "disconnect").
    for _ in range(100):
        if not await sync(lambda: models.GroupMember.objects.exists()):
            break
        await asyncio.sleep(0.02)
    assert await in_flight("h5") == 0
    async with session(secret) as other:
        await subscribed(other, "h5")
        assert await other.receive_nothing(timeout=0.3)


@override_settings(FERRY_WS_ACK_HOLD_MS=0)
async def test_held_ack__off_settles_each_ack_at_once(monkeypatch):
    secret = await make_key("admin:*")
    await new_topic("h6")
    await produce("h6", [0])
    async with session(secret) as ws:
        await subscribed(ws, "h6")
        (item,) = (await recv_type(ws, "messages"))["items"]
        alone = count_calls(monkeypatch, "ack_messages")
        await send(ws, {"type": "ack", "sub": "s", "receipts": [item["receipt"]]})
        assert (await recv(ws, timeout=2))["type"] == "acked"
        assert len(alone) == 1


@override_settings(FERRY_WS_ACK_HOLD_MS=10_000)
async def test_held_ack__its_error_is_answered_and_the_subscription_goes_on(monkeypatch):
    """An ack the core refuses, taken along by the next push: the ack's error frame, then the
    push, as if the ack had come alone (the subscription does not end)."""
    from broker.core import errors

    real = delivery.ack_and_deliver
    refusals: list[object] = []

    def refuse_once(*args, **kwargs):
        if not refusals:
            refusals.append(args)
            raise errors.InvalidRequest("Refused for the test.")
        return real(*args, **kwargs)

    monkeypatch.setattr(delivery, "ack_and_deliver", refuse_once)
    secret = await make_key("admin:*")
    await new_topic("h7")
    await produce("h7", [0])
    async with session(secret) as ws:
        await subscribed(ws, "h7")
        (first,) = (await recv_type(ws, "messages"))["items"]
        await send(ws, {"type": "ack", "ref": 5, "sub": "s", "receipts": [first["receipt"]]})
        await produce("h7", [1])
        error = await recv(ws)
        assert (error["type"], error["ref"], error["sub"]) == ("error", 5, "s")
        assert error["error"]["code"] == "invalid_request"
        (item,) = (await recv_type(ws, "messages"))["items"]
        assert item["value"] == 1
        # Still subscribed, the ack still to be sent again: a held ack goes with the next push.
        await send(ws, {"type": "ack", "ref": 6, "sub": "s", "receipts": [first["receipt"]]})
        await produce("h7", [2])
        acked = await recv(ws)
        assert (acked["type"], acked["ref"], acked["settled"]) == ("acked", 6, 1)
        assert [m["value"] for m in (await recv_type(ws, "messages"))["items"]] == [2]
