"""An ack's freed credit is pushed from the ack's own database call, never beyond the credit.

See docs/websocket.md#flow-control-credit and
docs/benchmarks.md#the-per-message-path-benchper_messagepy.
"""

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings

from broker.core import delivery, groups, keys
from tests.ws.test_consumers import make_key, new_topic, produce, recv, recv_type, send, session

pytestmark = pytest.mark.django_db(transaction=True)


def count_push_task_deliveries(monkeypatch):
    """Count the push task's deliveries (it calls delivery.deliver_messages; an ack does not)."""
    calls = []
    real = delivery.deliver_messages

    def counted(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(len(result.deliveries))
        return result

    monkeypatch.setattr(delivery, "deliver_messages", counted)
    return calls


@override_settings(FERRY_WS_READ_AHEAD=0)  # with it, see test_read_ahead.py
async def test_ack__pushes_the_freed_credit_without_waking_the_push_task(monkeypatch):
    secret = await make_key("admin:*")
    await new_topic("c1")
    await produce("c1", [0, 1, 2])
    async with session(secret) as ws:
        await send(
            ws, {"type": "subscribe", "sub": "s", "topic": "c1", "group": "g", "prefetch": 1}
        )
        await recv_type(ws, "subscribed")
        (item,) = (await recv_type(ws, "messages"))["items"]
        assert await ws.receive_nothing(timeout=0.2)
        calls = count_push_task_deliveries(monkeypatch)
        for expected in (1, 2):
            await send(ws, {"type": "ack", "sub": "s", "receipts": [item["receipt"]]})
            # The documented order: the answer, then the push the ack made room for.
            assert (await recv(ws))["type"] == "acked"
            pushed = await recv(ws)
            assert pushed["type"] == "messages"
            (item,) = pushed["items"]
            assert item["value"] == expected
        assert await ws.receive_nothing(timeout=0.2)
        assert calls == []


async def test_ack__a_busy_subscriber_never_gets_more_than_its_credit():
    secret = await make_key("admin:*")
    await new_topic("c2")
    await produce("c2", list(range(12)))
    async with session(secret) as ws:
        await send(
            ws, {"type": "subscribe", "sub": "s", "topic": "c2", "group": "g", "prefetch": 4}
        )
        await recv_type(ws, "subscribed")
        unsettled = [m["receipt"] for m in (await recv_type(ws, "messages"))["items"]]
        assert len(unsettled) == 4
        seen = 4
        # One ack at a time while three are in hand (the push task delivers), then three at
        # once with one in hand (the ack delivers, and reads ahead for the next acks, whose
        # answers may then come after the messages): never more than 4 unsettled.
        for batch in (1, 3, 1, 3):
            acked, unsettled = unsettled[:batch], unsettled[batch:]
            await send(ws, {"type": "ack", "sub": "s", "receipts": acked})
            answered = False
            while not answered or (len(unsettled) < 4 and seen < 12):
                frame = await recv(ws)
                if frame["type"] == "acked":
                    assert frame["settled"] == batch
                    answered = True
                    continue
                assert frame["type"] == "messages"
                unsettled += [m["receipt"] for m in frame["items"]]
                seen += len(frame["items"])
                assert len(unsettled) <= 4
        assert seen == 12
        assert await ws.receive_nothing(timeout=0.3)


async def test_ack__stale_receipt_frees_no_credit():
    secret = await make_key("admin:*")
    await new_topic("c3")
    await produce("c3", [0, 1, 2])
    async with session(secret) as ws:
        await send(
            ws, {"type": "subscribe", "sub": "s", "topic": "c3", "group": "g", "prefetch": 1}
        )
        await recv_type(ws, "subscribed")
        (item,) = (await recv_type(ws, "messages"))["items"]
        await send(ws, {"type": "ack", "sub": "s", "receipts": [item["receipt"]]})
        await recv_type(ws, "acked")
        await recv_type(ws, "messages")
        # Acked already: settles nothing, so nothing more is pushed.
        await send(ws, {"type": "ack", "sub": "s", "receipts": [item["receipt"]]})
        again = await recv_type(ws, "acked")
        assert (again["settled"], again["stale"]) == (0, [item["receipt"]])
        assert await ws.receive_nothing(timeout=0.3)


@override_settings(FERRY_WS_ACK_HOLD_MS=20)
async def test_ack__of_a_subscriber_that_had_everything_costs_no_empty_delivery(monkeypatch):
    """A subscriber acking each message as it comes, with credit to spare: one delivery per
    message. The push task had pushed all there was, so the credit an ack frees does not wake
    it for a round that would find nothing; the next append does."""
    secret = await make_key("admin:*")
    await new_topic("c4")
    async with session(secret) as ws:
        await send(
            ws, {"type": "subscribe", "sub": "s", "topic": "c4", "group": "g", "prefetch": 8}
        )
        await recv_type(ws, "subscribed")
        # The join's own wake-up makes the push task look once more: let it pass first.
        assert await ws.receive_nothing(timeout=0.3)
        calls = count_push_task_deliveries(monkeypatch)
        for value in range(3):
            await produce("c4", [value])
            (item,) = (await recv_type(ws, "messages"))["items"]
            assert item["value"] == value
            await send(ws, {"type": "ack", "sub": "s", "receipts": [item["receipt"]]})
            assert (await recv_type(ws, "acked"))["settled"] == 1
            assert await ws.receive_nothing(timeout=0.2)
        assert calls == [1, 1, 1]


async def test_ack__in_an_ordered_group_lets_the_partitions_next_message_go():
    """In an ordered group the push task stops at a partition's message in flight, with credit
    to spare: the ack that settles it wakes the task for the next one at once."""
    secret = await make_key("admin:*")
    await new_topic("c5")
    await sync_to_async(groups.configure_group)(keys.CONSOLE, "g-ordered", ordered=True)
    await produce("c5", [0, 1, 2])
    async with session(secret) as ws:
        await send(
            ws,
            {"type": "subscribe", "sub": "s", "topic": "c5", "group": "g-ordered", "prefetch": 8},
        )
        await recv_type(ws, "subscribed")
        for value in range(3):
            # Well within the heartbeat interval (3 s), which would also start a round.
            (item,) = (await recv_type(ws, "messages", timeout=1))["items"]
            assert item["value"] == value
            await send(ws, {"type": "ack", "sub": "s", "receipts": [item["receipt"]]})
        assert (await recv_type(ws, "acked", timeout=1))["settled"] == 1
