"""The channel layer's scripted group_send (broker/core/redislayer.py) against a real Redis.

Each layer object here stands for one process: its own client prefix, its own connections.
What one sends, channels_redis's own layer receives, and the other way round.
"""

import asyncio
import logging
import time

import pytest
import redis.asyncio as aioredis
from channels_redis.core import RedisChannelLayer

from broker.core.redislayer import ScriptedRedisChannelLayer

pytestmark = pytest.mark.integration

EVENT = {"type": "ferry.messages_appended", "topic_id": 7, "end_offsets": {"0": 3}}


def layer(url: str, cls: type = ScriptedRedisChannelLayer, **config) -> RedisChannelLayer:
    return cls(hosts=[url], **{"capacity": 100, "expiry": 30, **config})


async def received(layer_: RedisChannelLayer, channel: str) -> dict:
    async with asyncio.timeout(5):
        return await layer_.receive(channel)


async def nothing_for(layer_: RedisChannelLayer, channel: str) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await layer_.receive(channel)


async def test_group_send__reaches_every_member_in_every_process(redis_url):
    sender, here, there = layer(redis_url), layer(redis_url), layer(redis_url, RedisChannelLayer)
    try:
        # Two listeners share one process's channel key; a third is in a plain channels_redis.
        a, b = await here.new_channel("ws."), await here.new_channel("ws.")
        c = await there.new_channel("ws.")
        for channel in (a, b, c):
            await sender.group_add("ferry.topic.7", channel)
        await sender.group_send("ferry.topic.7", EVENT)
        assert sender._scripts is not None  # the scripts' path, not channels_redis's
        for layer_, channel in ((here, a), (here, b), (there, c)):
            assert await received(layer_, channel) == EVENT
        # And the other way: channels_redis's own group_send reaches this layer's listeners.
        await there.group_send("ferry.topic.7", {**EVENT, "topic_id": 8})
        assert (await received(here, a))["topic_id"] == 8
    finally:
        for layer_ in (sender, here, there):
            await layer_.flush()


async def test_group_send__to_a_group_without_members_stores_nothing(redis_url):
    sender = layer(redis_url, prefix="empty")
    client = aioredis.from_url(redis_url)
    try:
        await sender.group_send("ferry.topic.1", EVENT)
        assert await client.keys("empty*") == []
    finally:
        await sender.flush()
        await client.aclose()


async def test_group_send__drops_expired_members_and_messages(redis_url):
    sender, listener = layer(redis_url, group_expiry=60), layer(redis_url)
    client = aioredis.from_url(redis_url)
    try:
        gone, alive = await listener.new_channel("ws."), await listener.new_channel("ws.")
        await sender.group_add("ferry.topic.2", gone)
        await sender.group_add("ferry.topic.2", alive)
        group_key = sender._group_key("ferry.topic.2")
        # Joined two minutes ago and never again: past the group expiry.
        await client.zadd(group_key, {gone: time.time() - 120})
        # A message left on the listeners' key 40 s ago: past the message expiry (30 s).
        channel_key = sender.prefix + listener.non_local_name(alive)
        await client.zadd(channel_key, {b"stale": time.time() - 40})
        await sender.group_send("ferry.topic.2", EVENT)
        assert await client.zrange(group_key, 0, -1) == [alive.encode()]
        assert await client.zcard(channel_key) == 1  # the stale one gone, the new one there
        message = await received(listener, alive)
        assert message == EVENT
        await nothing_for(listener, gone)
    finally:
        await sender.flush()
        await listener.flush()
        await client.aclose()


async def test_group_send__stops_at_a_channel_keys_capacity(redis_url, caplog):
    sender, listener = layer(redis_url, capacity=2), layer(redis_url, capacity=2)
    try:
        channel = await listener.new_channel("ws.")
        await sender.group_add("ferry.topic.3", channel)
        caplog.set_level(logging.INFO, logger="broker.core.redislayer")
        for offset in range(3):
            await sender.group_send("ferry.topic.3", {**EVENT, "end_offsets": {"0": offset}})
        assert "1 of 1 channels over capacity in group ferry.topic.3" in caplog.text
        got = [(await received(listener, channel))["end_offsets"] for _ in range(2)]
        assert got == [{"0": 0}, {"0": 1}]
        await nothing_for(listener, channel)
    finally:
        await sender.flush()
        await listener.flush()


async def test_group_send__after_redis_forgot_its_scripts(redis_url):
    sender, listener = layer(redis_url), layer(redis_url)
    client = aioredis.from_url(redis_url)
    try:
        channel = await listener.new_channel("ws.")
        await sender.group_add("ferry.topic.4", channel)
        await sender.group_send("ferry.topic.4", EVENT)
        assert await received(listener, channel) == EVENT
        await client.script_flush()  # as a restarted Redis has
        await sender.group_send("ferry.topic.4", EVENT)
        assert await received(listener, channel) == EVENT
    finally:
        await sender.flush()
        await listener.flush()
        await client.aclose()


async def test_group_send__sharded_layers_keep_channels_redis_own(redis_url):
    # Two databases of one server stand for two shards.
    shards = [redis_url, redis_url.rsplit("/", 1)[0] + "/1"]
    sender, listener = (ScriptedRedisChannelLayer(hosts=shards) for _ in range(2))
    try:
        assert sender.ring_size == 2
        channel = await listener.new_channel("ws.")
        await sender.group_add("ferry.topic.5", channel)
        await sender.group_send("ferry.topic.5", EVENT)
        assert await received(listener, channel) == EVENT
        assert sender._scripts is None  # channels_redis's path, not the scripts
    finally:
        await sender.flush()
        await listener.flush()


async def test_receive__a_backup_cleanup_that_meets_a_closed_connection_does_not_raise(
    redis_url, caplog
):
    """channels_redis fires this cleanup and forgets it: an error there was logged by asyncio as
    "Task exception was never retrieved", with a traceback (seen after a Redis restart)."""
    listener, killer = layer(redis_url, prefix="clean"), aioredis.from_url(redis_url)
    try:
        channel = await listener.new_channel("ws.")
        await listener.send(channel, EVENT)
        assert await received(listener, channel) == EVENT
        # Redis ends every other client's connection, the listener's pooled one among them.
        await killer.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        channel_key = listener.prefix + listener.non_local_name(channel)
        with caplog.at_level(logging.INFO, logger="broker.core.redislayer"):
            await listener._clean_receive_backup(0, channel_key)
        assert "a received wake-up's backup stays" in caplog.text
    finally:
        await listener.flush()
        await killer.aclose()
