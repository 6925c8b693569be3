"""A subscriber learns a rebalance from an `assigned` frame while it is busy acking, not only
at its next heartbeat (docs/websocket.md#server-frames)."""

import pytest
from django.test import override_settings

from broker.core import keys, membership
from tests.ws.test_consumers import make_key, new_topic, produce, recv, send, session, sync

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(FERRY_HEARTBEAT_INTERVAL_MS=60_000)
async def test_assigned__sent_to_a_member_that_acks_through_the_rebalance():
    secret = await make_key("admin:*")
    await new_topic("rb1", partitions=2)
    await produce("rb1", list(range(40)), key="k")  # one key: one partition holds them all
    await produce("rb1", list(range(40)), key="other")
    async with session(secret) as ws:
        await send(
            ws, {"type": "subscribe", "sub": "s", "topic": "rb1", "group": "g", "prefetch": 2}
        )
        subscribed = await recv(ws)
        assert subscribed["type"] == "subscribed"
        assert sorted(subscribed["partitions"]) == [0, 1]
        joined = False
        assigned = None
        # Ack each message as it comes, prefetch 2: every ack pushes the next from its own
        # database call, so the push task has no credit to deliver with.
        for _ in range(30):
            frame = await recv(ws)
            if frame["type"] == "assigned":
                assigned = frame
                break
            if frame["type"] == "acked":
                # Messages of a partition this member lost are still its own to settle.
                assert frame["stale"] == []
                assert frame["settled"] >= 1
                continue
            assert frame["type"] == "messages"
            await send(
                ws,
                {"type": "ack", "sub": "s", "receipts": [m["receipt"] for m in frame["items"]]},
            )
            if not joined:
                other = await sync(membership.join_group, keys.CONSOLE, "g", "rb1", "other")
                joined = True
        assert assigned is not None, "no assigned frame within 30 frames of the rebalance"
        assert assigned["generation"] == other.generation
        assert len(assigned["partitions"]) == 1
        assert assigned["partitions"] != list(other.partitions)
