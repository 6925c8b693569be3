"""broker/core/events.py with a channel layer that fails, as Redis does when it is down (issue 17):
waits fall back to a database poll, it is said once, and the layer is taken back by itself."""

import asyncio
import logging
import time
from typing import Any

import orjson
import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, channel_layers
from django.db import connection

from broker.core import events, keys, log, topics
from broker.core.records import NewMessage

pytestmark = pytest.mark.django_db(transaction=True)


class FlakyLayer(InMemoryChannelLayer):
    """The in-memory layer, except that every call fails while `down` (a killed Redis)."""

    down = True

    def _check(self) -> None:
        if FlakyLayer.down:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    async def group_add(self, group, channel):
        self._check()
        await super().group_add(group, channel)

    async def group_send(self, group, message):
        self._check()
        await super().group_send(group, message)

    async def receive(self, channel):
        self._check()
        return await super().receive(channel)


@pytest.fixture
def flaky_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.core.test_events.FlakyLayer"}}
    settings.FERRY_LAYER_PROBE_SECONDS = 0.1
    channel_layers.backends.clear()
    FlakyLayer.down = True
    yield FlakyLayer
    channel_layers.backends.clear()
    events._down_since = None
    events._memberships.clear()
    events._probe = None


async def close_thread_connection():
    """The core ran on asgiref's thread: close its connection (PostgreSQL drops the test
    database at the end), as tests/core/test_groupcommit.py does."""

    def close():
        connection.inc_thread_sharing()
        try:
            connection.close()
        finally:
            connection.dec_thread_sharing()

    await sync_to_async(close)()


async def test_long_poll__layer_down_falls_back_to_a_database_poll(flaky_layer, caplog):
    try:
        await _layer_down_then_back(flaky_layer, caplog)
    finally:
        await close_thread_connection()


async def _layer_down_then_back(flaky_layer, caplog):
    await sync_to_async(topics.create_topic)(keys.CONSOLE, "outage", 1)

    async def produce_later() -> None:
        await asyncio.sleep(0.3)
        await sync_to_async(log.append_messages)(
            keys.CONSOLE, "outage", [NewMessage(orjson.dumps(1))]
        )

    caplog.set_level(logging.WARNING, logger="broker.core.events")
    producer = asyncio.create_task(produce_later())
    started = time.monotonic()
    result = await log.read_messages_async(keys.CONSOLE, "outage", 0, 0, 10, 10_000)
    elapsed = time.monotonic() - started
    await producer

    assert [m.offset for m in result.messages] == [0]
    # Woken by the database poll (FERRY_WAKEUP_POLL_MS, 250 ms), not at the 10 s deadline.
    assert elapsed < 2, elapsed
    assert not events.layer_up()
    assert [r.message for r in caplog.records].count(
        "channel layer unreachable (group_add: Error 111 connecting to 127.0.0.1:6379. "
        "Connection refused.): wake-ups fall back to a database poll every 250 ms until it is "
        "back"
    ) == 1

    # Back: the probe sees it, says so once, and this process's listeners are added again.
    events._memberships.setdefault("ferry.topic.1", set()).add("ferry.poll.listener")
    flaky_layer.down = False
    await events.join("ferry.topic.2", "ferry.poll.other")  # after the probe started
    for _ in range(50):
        if events.layer_up():
            break
        await asyncio.sleep(0.05)
    assert events.layer_up()
    assert sum("channel layer reachable again" in r.message for r in caplog.records) == 1
    layer: Any = channel_layers["default"]
    assert "ferry.poll.listener" in layer.groups["ferry.topic.1"]
    assert "ferry.poll.other" in layer.groups["ferry.topic.2"]


async def test_stop_waiting__ends_waiting_long_polls_at_once(monkeypatch):
    """A shutdown (mqsite/shutdown.py): a waiting long poll answers now with what it finds,
    and one starting later does not wait."""
    monkeypatch.setattr(events, "_stopping", False)
    try:
        await sync_to_async(topics.create_topic)(keys.CONSOLE, "stopping", 1)
        started = time.monotonic()
        poll = asyncio.create_task(
            log.read_messages_async(keys.CONSOLE, "stopping", 0, 0, 10, 20_000)
        )
        while not events._polls:
            assert time.monotonic() - started < 5
            await asyncio.sleep(0.01)
        assert await events.stop_waiting() == 1
        result = await asyncio.wait_for(poll, 2)
        assert result.messages == ()
        result = await asyncio.wait_for(
            log.read_messages_async(keys.CONSOLE, "stopping", 0, 0, 10, 20_000), 2
        )
        assert result.messages == ()
        assert time.monotonic() - started < 3
    finally:
        await close_thread_connection()


class SlowLayer(InMemoryChannelLayer):
    """The in-memory layer, with a group_send as slow as a busy Redis, counting the sends."""

    sent: list[int] = []

    async def group_send(self, group, message):
        SlowLayer.sent.append(message["n"])
        await asyncio.sleep(0.05)
        await super().group_send(group, message)


@pytest.fixture
def slow_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.core.test_events.SlowLayer"}}
    channel_layers.backends.clear()
    SlowLayer.sent = []
    yield SlowLayer
    channel_layers.backends.clear()
    events._server_loop = None


async def test_wake_ups_of_a_burst_of_commits_coalesce(slow_layer):
    """Commits announced while a send to their group is under way cost one more send, after
    it, carrying the last of them: a listener still hears of the last commit."""
    events.listen_here()
    layer = channel_layers["default"]
    channel = await layer.new_channel("t.")  # type: ignore[call-arg]
    await events.join("ferry.topic.7", channel)

    def commits() -> None:  # on a database thread, as after each commit
        for n in range(10):
            events._send("ferry.topic.7", {"type": events.MESSAGES_APPENDED, "n": n})

    await asyncio.to_thread(commits)
    for _ in range(100):
        if not events._sending:
            break
        await asyncio.sleep(0.02)
    assert slow_layer.sent[0] == 0
    assert slow_layer.sent[-1] == 9
    assert len(slow_layer.sent) <= 3
    heard = [await asyncio.wait_for(layer.receive(channel), 1)]
    while len(heard) < len(slow_layer.sent):
        heard.append(await asyncio.wait_for(layer.receive(channel), 1))
    assert heard[-1]["n"] == 9
    await events.leave("ferry.topic.7", channel)


async def test_direct_listener__woken_at_once_and_the_layer_only_for_its_members(slow_layer):
    """A listener that joins with a wake callback hears this process's events straight from the
    commit; the in-memory layer carries them only to the group's other members (a long poll)."""
    events.listen_here()
    group = "ferry.topic.8"
    woken: list[dict[str, Any]] = []
    await events.join(group, "direct", woken.append)

    def commit(n: int) -> None:  # on a database thread, as after each commit
        events._send(group, {"type": events.MESSAGES_APPENDED, "n": n})

    async def until(count: int) -> None:
        for _ in range(100):
            if len(woken) >= count and not events._sending:
                return
            await asyncio.sleep(0.01)

    await asyncio.to_thread(commit, 1)
    await until(1)
    assert [e["n"] for e in woken] == [1]
    assert events.from_here(woken[0])
    assert slow_layer.sent == []  # nobody listens through the layer

    layer = channel_layers["default"]
    polling = await layer.new_channel("poll.")  # type: ignore[call-arg]
    await events.join(group, polling)
    await asyncio.to_thread(commit, 2)
    await until(2)
    assert [e["n"] for e in woken] == [1, 2]
    assert slow_layer.sent == [2]
    assert (await asyncio.wait_for(layer.receive(polling), 1))["n"] == 2

    await events.leave(group, polling)
    await events.leave(group, "direct")
    assert group not in events._local
    assert group not in events._memberships
    await asyncio.to_thread(commit, 3)
    await asyncio.sleep(0.05)
    assert [e["n"] for e in woken] == [1, 2]
    assert slow_layer.sent == [2]
