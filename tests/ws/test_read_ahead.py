"""A subscriber with a small window gets its next messages read ahead, its acks settled together.

See docs/websocket.md#flow-control-credit (FERRY_WS_READ_AHEAD). The credit still holds: an ack
lets one message more through only for a receipt this subscription was pushed and has not
settled; what was read ahead goes back to the group, with the attempt it had, when the acks
stop or the subscription ends.
"""

import pytest
from django.test import override_settings

from broker import consumers, models, subscriptions
from broker.core.records import SettleResult
from tests.ws.test_consumers import make_key, new_topic, produce, recv, send, session, sync
from tests.ws.test_held_acks import count_calls, subscribed

pytestmark = pytest.mark.django_db(transaction=True)


async def delivered(topic):
    """Messages in flight (runs counted by their messages) that were handed out, not waiting."""

    def count():
        runs = models.InFlight.objects.filter(partition__topic__name=topic, state="delivered")
        return sum(r.last_offset - r.offset + 1 for r in runs)

    return await sync(count)


async def frames_until(ws, done, timeout=3):
    """Frames received until done(frames) holds."""
    got: list[dict] = []
    while not done(got):
        got.append(await recv(ws, timeout))
    return got


def of_type(frames, kind):
    return [f for f in frames if f["type"] == kind]


async def backlog(topic, count):
    """A key, and a topic with messages 0 to count - 1."""
    secret = await make_key("admin:*")
    await new_topic(topic)
    await produce(topic, list(range(count)))
    return secret


async def ack_for_next(ws, item, **fields):
    """Ack item; the frames up to the next `messages` frame, and its one message."""
    await send(ws, {"type": "ack", "sub": "s", "receipts": [item["receipt"]], **fields})
    got = await frames_until(ws, lambda f: of_type(f, "messages"))
    (following,) = of_type(got, "messages")[0]["items"]
    return got, following


@override_settings(FERRY_WS_ACK_HOLD_MS=10_000, FERRY_WS_READ_AHEAD=4)
async def test_read_ahead__each_ack_gets_the_next_message_without_a_database_call(monkeypatch):
    secret = await backlog("ra1", 7)
    async with session(secret) as ws:
        await subscribed(ws, "ra1", prefetch=1)
        (item,) = (await recv(ws))["items"]
        assert await ws.receive_nothing(timeout=0.2)
        calls = count_calls(monkeypatch, "ack_and_deliver")
        alone = count_calls(monkeypatch, "ack_messages")
        values = [item["value"]]
        for ref in range(1, 6):
            _, item = await ack_for_next(ws, item, ref=ref)
            values.append(item["value"])
        # The first ack read 4 ahead with its own message; the next four came from there.
        assert values == [0, 1, 2, 3, 4, 5]
        assert (len(calls), alone) == (1, [])
        # Four acks held (not stored yet: messages 1 to 4), and message 5 in hand.
        assert await delivered("ra1") == 4 + 1
        await send(ws, {"type": "ack", "ref": 6, "sub": "s", "receipts": [item["receipt"]]})
        got = await frames_until(
            ws, lambda f: len(of_type(f, "acked")) == 5 and of_type(f, "messages")
        )
        # Settled together in one call, each frame answered on its own, in order.
        assert [(f["ref"], f["settled"], f["stale"]) for f in of_type(got, "acked")] == [
            (ref, 1, []) for ref in range(2, 7)
        ]
        assert [m["value"] for f in of_type(got, "messages") for m in f["items"]] == [6]
        assert (len(calls), alone) == (2, [])


@override_settings(FERRY_WS_ACK_HOLD_MS=100, FERRY_WS_READ_AHEAD=4)
async def test_read_ahead__a_stale_ack_lets_nothing_through():
    secret = await backlog("ra2", 6)
    async with session(secret) as ws:
        await subscribed(ws, "ra2", prefetch=1)
        (first,) = (await recv(ws))["items"]
        _, second = await ack_for_next(ws, first)
        # The same receipt again: settled already, so it frees nothing, and nothing comes but
        # its answer (after the hold).
        await send(ws, {"type": "ack", "ref": 2, "sub": "s", "receipts": [first["receipt"]]})
        got = await frames_until(ws, lambda f: of_type(f, "acked") and f[-1]["ref"] == 2)
        assert of_type(got, "messages") == []
        assert (got[-1]["settled"], got[-1]["stale"]) == (0, [first["receipt"]])
        assert await ws.receive_nothing(timeout=0.3)
        # The subscriber's own receipt still lets the next one through.
        _, third = await ack_for_next(ws, second)
        assert third["value"] == 2


@override_settings(FERRY_WS_ACK_HOLD_MS=20, FERRY_WS_READ_AHEAD=4)
async def test_read_ahead__handed_back_when_the_acks_stop(monkeypatch):
    monkeypatch.setattr(consumers, "READ_AHEAD_LINGER_S", 0.3)
    secret = await backlog("ra3", 8)
    async with session(secret) as ws:
        await subscribed(ws, "ra3", prefetch=1)
        (first,) = (await recv(ws))["items"]
        got, second = await ack_for_next(ws, first)
        assert of_type(got, "acked")  # answered before its message: no read-ahead was there yet
        assert await delivered("ra3") == 1 + 4
        # No ack comes: after the linger only the message in hand is out, the rest waits for
        # the group again, at once and not as a failed attempt.
        assert await ws.receive_nothing(timeout=0.6)
        assert await delivered("ra3") == 1
        _, third = await ack_for_next(ws, second)
        assert (third["value"], third["attempt"]) == (2, 1)


@override_settings(FERRY_WS_ACK_HOLD_MS=20, FERRY_WS_READ_AHEAD=4)
async def test_read_ahead__kept_while_the_acks_keep_coming(monkeypatch):
    """Only what waited the whole linger goes back: a subscriber acking on, slower than the
    reads but well within the linger per message, keeps its read-ahead, and nothing is handed
    back (each hand-back wakes every subscriber of the topic)."""
    import asyncio

    monkeypatch.setattr(consumers, "READ_AHEAD_LINGER_S", 0.2)
    released = count_calls(monkeypatch, "release_messages")
    secret = await backlog("ra7", 80)
    async with session(secret) as ws:
        await subscribed(ws, "ra7", prefetch=1)
        (item,) = (await recv(ws))["items"]
        values = [item["value"]]
        for _ in range(60):  # about 1.2 s: six lingers
            await asyncio.sleep(0.02)
            _, item = await ack_for_next(ws, item)
            values.append(item["value"])
    assert values == list(range(61))
    assert released == []


@override_settings(FERRY_WS_ACK_HOLD_MS=10_000, FERRY_WS_READ_AHEAD=4)
async def test_read_ahead__unsubscribe_hands_it_back_and_keeps_the_held_acks():
    secret = await backlog("ra4", 8)
    async with session(secret) as ws:
        await subscribed(ws, "ra4", prefetch=1)
        (item,) = (await recv(ws))["items"]
        for _ in range(3):
            _, item = await ack_for_next(ws, item)
        assert item["value"] == 3
        await send(ws, {"type": "unsubscribe", "ref": 9, "sub": "s"})
        got = await frames_until(ws, lambda f: of_type(f, "unsubscribed"))
        assert [f["settled"] for f in of_type(got, "acked")] == [1, 1]
    # Acked is acked (0 to 2); the one in hand (3) and the read-ahead (4, 5) wait for the group.
    runs = await sync(
        lambda: list(
            models.InFlight.objects.filter(partition__topic__name="ra4").values_list(
                "offset", "last_offset", "state", "attempt"
            )
        )
    )
    waiting = sorted(o for first, last, _, _ in runs for o in range(first, last + 1))
    assert waiting == [3, 4, 5]
    # Not failed attempts: delivered again, each is attempt 1 (api.md#acknowledged-delivery).
    assert {(state, attempt) for _, _, state, attempt in runs} == {("retry_wait", 0)}


@override_settings(FERRY_WS_ACK_HOLD_MS=10_000, FERRY_WS_READ_AHEAD=4)
async def test_read_ahead__not_for_a_window_larger_than_it(monkeypatch):
    secret = await backlog("ra5", 12)
    async with session(secret) as ws:
        await subscribed(ws, "ra5", prefetch=5)
        items = (await recv(ws))["items"]
        assert len(items) == 5
        await send(ws, {"type": "ack", "sub": "s", "receipts": [m["receipt"] for m in items]})
        got = await frames_until(ws, lambda f: of_type(f, "messages"))
        assert len(of_type(got, "messages")[0]["items"]) == 5
        assert await delivered("ra5") == 5


def test_held_acks__each_frame_answered_as_if_settled_alone():
    from broker.frames import AckFrame

    w, x, y, z = (f"{0:016x}.0.{offset:x}" for offset in range(4))
    a = AckFrame(type="ack", sub="s", ref=1, receipts=[x, y])
    b = AckFrame(type="ack", sub="s", ref=2, receipts=[y, z, z])
    c = AckFrame(type="ack", sub="s", ref=3, receipts=[w])
    held = subscriptions.HeldAcks([(a, 2), (b, 0), (c, 1)])
    assert held.receipts == [x, y, y, z, z, w]
    assert held.presumed == 3
    answers = held.answers(SettleResult(settled=3, stale=(w,)))
    # y was settled by the first frame: to the second it is stale, as a second ack would be.
    assert [(f.ref, r.settled, r.stale) for f, r in answers] == [
        (1, 2, ()),
        (2, 1, (y,)),
        (3, 0, (w,)),
    ]
    assert [h.acks for h in held.alone()] == [[(a, 2)], [(b, 0)], [(c, 1)]]


@override_settings(FERRY_WS_READ_AHEAD=4)
async def test_read_ahead__an_ordered_group_still_gets_each_partition_in_order():
    """An ordered group has one message of a partition in flight at a time: what is read ahead
    is the next message of the other partitions, so each partition's messages still come in
    order, one after the other's ack."""
    from asgiref.sync import sync_to_async

    from broker.core import groups, keys

    secret = await make_key("admin:*")
    await new_topic("ra6", partitions=3)
    await sync_to_async(groups.configure_group)(keys.CONSOLE, "g-ordered", ordered=True)
    for partition in range(3):
        await produce("ra6", [f"{partition}-{i}" for i in range(4)], partition=partition)
    async with session(secret) as ws:
        await send(
            ws,
            {"type": "subscribe", "sub": "s", "topic": "ra6", "group": "g-ordered", "prefetch": 1},
        )
        got = await frames_until(ws, lambda f: of_type(f, "messages"))
        (item,) = of_type(got, "messages")[0]["items"]
        seen = [item]
        while len(seen) < 12:
            _, item = await ack_for_next(ws, item)
            seen.append(item)
    by_partition: dict[int, list[str]] = {}
    for m in seen:
        by_partition.setdefault(m["partition"], []).append(m["value"])
    assert by_partition == {p: [f"{p}-{i}" for i in range(4)] for p in range(3)}
