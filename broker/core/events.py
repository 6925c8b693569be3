"""The only code that talks to the channel layer: group names, events, publish on commit, waits.

See docs/architecture.md#events. Events are wake-ups, not data: a listener that gets one reads
the database again, so a lost or duplicated event costs latency, never correctness. That is
also why an unreachable layer (Redis) takes nothing down (docs/decisions/0014): waiters then
re-read the database every FERRY_WAKEUP_POLL_MS, and the layer is probed until it answers.
"""

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, cast

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.db import transaction

from broker import settings as ferry_settings
from broker.core import dbthreads

logger = logging.getLogger(__name__)

MESSAGES_APPENDED = "ferry.messages_appended"
# Messages of the topic are deliverable again: retries came due, nacks, redrives, a member left.
MESSAGES_RETURNED = "ferry.messages_returned"
# Sent to the channels of this process's waiting long polls when it shuts down (stop_waiting).
STOP_WAITING = "ferry.stop_waiting"

T = TypeVar("T")


class _ChannelLayer(Protocol):
    """What this module uses of a channel layer.

    channels types get_channel_layer() as BaseChannelLayer | None, whose new_channel() takes no
    prefix; the layers settings configure (in-memory, Redis) all take one, and one is always set.
    """

    async def new_channel(self, prefix: str = ...) -> str: ...
    async def receive(self, channel: str) -> dict[str, Any]: ...
    async def send(self, channel: str, message: dict[str, Any]) -> None: ...
    async def group_add(self, group: str, channel: str) -> None: ...
    async def group_discard(self, group: str, channel: str) -> None: ...
    async def group_send(self, group: str, message: dict[str, Any]) -> None: ...


def topic_group(topic_id: int) -> str:
    """The layer group that hears about new messages in a topic (ids keep names under 100 chars)."""
    return f"ferry.topic.{topic_id}"


# The event loop of the server in this process (the last that waited on the layer): where
# sends from other threads go, since the in-memory layer's queues belong to it.
_server_loop: asyncio.AbstractEventLoop | None = None


def listen_here() -> None:
    """Note the running loop as the one that listens on the layer (long polls, WebSockets)."""
    global _server_loop
    _server_loop = asyncio.get_running_loop()


def _loop_for_send() -> asyncio.AbstractEventLoop | None:
    loop = dbthreads.home_loop()
    if loop is not None:
        return loop
    # A background job's thread (the embedded runner): the server's loop, while it runs.
    server = _server_loop
    if server is not None and server.is_running() and not server.is_closed():
        return server
    return None


def _layer() -> _ChannelLayer:
    return cast(_ChannelLayer, get_channel_layer())


# The layer's health in this process. Down: since when (monotonic), else None. Logged once when
# it goes down and once when it is back, never per request.
_down_since: float | None = None
_probe: "asyncio.Task[None] | None" = None
# Layer groups this process's listeners belong to, each with their channels: a restarted Redis
# has lost them, so they are added again when the layer is back.
_memberships: dict[str, set[str]] = {}
Wake = Callable[[dict[str, Any]], None]
# Listeners of this process woken without the layer: by group, each listener's channel with its
# loop and its callback (join(..., wake=...)).
_local: dict[str, dict[str, tuple[asyncio.AbstractEventLoop, Wake]]] = {}
# Events sent from this process say so: its listeners woken directly skip the layer's copy.
ORIGIN = uuid.uuid4().hex


def _new_origin() -> None:
    global ORIGIN
    ORIGIN = uuid.uuid4().hex  # a forked child (a Celery worker's) is another process


os.register_at_fork(after_in_child=_new_origin)

# The channels of this process's waiting long polls, and whether it is shutting down.
_polls: set[str] = set()
_stopping = False
# A layer call that takes longer than this counts as a failure (a hung Redis).
LAYER_TIMEOUT_S = 2.0
PROBE_GROUP = "ferry.probe"


def layer_is_redis() -> bool:
    """Whether wake-ups go through Redis (several processes), not the in-memory layer."""
    return isinstance(_layer(), (RedisChannelLayer, RedisPubSubChannelLayer))


def layer_up() -> bool:
    """Whether the channel layer answered its last call in this process."""
    return _down_since is None


def wakeup_poll_s() -> float:
    """How often a waiter re-reads the database while the layer is down."""
    return float(ferry_settings.get("WAKEUP_POLL_MS")) / 1000


def layer_failed(what: str, exc: BaseException) -> None:
    """Note that a layer call failed: waiters fall back to the database poll until it is back."""
    global _down_since
    if _down_since is None:
        _down_since = time.monotonic()
        logger.warning(
            "channel layer unreachable (%s: %s): wake-ups fall back to a database poll every "
            "%d ms until it is back",
            what,
            exc,
            ferry_settings.get("WAKEUP_POLL_MS"),
        )
    _start_probe()


def _layer_back() -> None:
    global _down_since
    if _down_since is not None:
        logger.warning(
            "channel layer reachable again after %.1f s: wake-ups through it again",
            time.monotonic() - _down_since,
        )
        _down_since = None


def _start_probe() -> None:
    """Probe the layer from the server's loop until it answers (no loop here: the next call is
    the probe)."""
    global _probe
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop is not _server_loop:
        server = _server_loop
        if server is not None and server.is_running() and not server.is_closed():
            server.call_soon_threadsafe(_start_probe)
        return
    if _probe is None or _probe.done():
        _probe = loop.create_task(_probe_until_back())


async def _probe_until_back() -> None:
    while _down_since is not None:
        await asyncio.sleep(float(ferry_settings.get("LAYER_PROBE_SECONDS")))
        layer = _layer()
        try:
            async with asyncio.timeout(LAYER_TIMEOUT_S):
                await layer.group_send(PROBE_GROUP, {"type": "ferry.probe"})
            # Until none is left: listeners may join while this runs.
            added: set[tuple[str, str]] = set()
            while todo := {(g, c) for g, cs in _memberships.items() for c in cs} - added:
                for group, channel in todo:
                    async with asyncio.timeout(LAYER_TIMEOUT_S):
                        await layer.group_add(group, channel)
                    added.add((group, channel))
        except Exception:  # noqa: S112 -- still down; said once by layer_failed
            continue
        _layer_back()


def _probing() -> bool:
    return _probe is not None and not _probe.done()


async def _call(make: Callable[[], Awaitable[None]]) -> None:
    """A layer call, made once more at once if it fails while the layer is up: a pooled
    connection that died with a restarted Redis fails once, then is replaced."""
    try:
        async with asyncio.timeout(LAYER_TIMEOUT_S):
            await make()
            return
    except Exception:
        if not layer_up():
            raise
    async with asyncio.timeout(LAYER_TIMEOUT_S):
        await make()


async def _answers() -> bool:
    """Whether the layer answers now; notes it down if not."""
    try:
        await _call(lambda: _layer().group_send(PROBE_GROUP, {"type": "ferry.probe"}))
    except Exception as exc:
        layer_failed("group_send", exc)
        return False
    return True


async def join(group: str, channel: str, wake: Wake | None = None) -> None:
    """Add channel to a layer group; never fails (a down layer re-adds it when it is back).

    With wake, this process's events to group call wake on the caller's loop at once, without
    the layer, which then carries only other processes' events (if any process can send one:
    Redis; the in-memory layer is this process's alone, so the channel does not join it). Such
    a listener ignores the layer's copies of this process's events (from_here).
    """
    if wake is not None:
        _local.setdefault(group, {})[channel] = (asyncio.get_running_loop(), wake)
        if not layer_is_redis():
            return
    _memberships.setdefault(group, set()).add(channel)
    if not layer_up() and _probing():
        return
    try:
        await _call(lambda: _layer().group_add(group, channel))
    except Exception as exc:
        layer_failed("group_add", exc)


async def leave(group: str, channel: str) -> None:
    """Remove channel from a layer group; never fails (Redis expires the entry in the end)."""
    listeners = _local.get(group, {})
    direct = listeners.pop(channel, None) is not None
    if not listeners:
        _local.pop(group, None)
    if direct and not layer_is_redis():
        return
    members = _memberships.get(group, set())
    members.discard(channel)
    if not members:
        _memberships.pop(group, None)
    if not layer_up():
        return
    try:
        await _call(lambda: _layer().group_discard(group, channel))
    except Exception as exc:
        layer_failed("group_discard", exc)


async def receive(channel: str) -> dict[str, Any]:
    """The layer's receive for a listener's channel, outlasting an outage: while the layer is
    down it waits for the probe to see it back, then receives again."""
    layer = _layer()
    while True:
        while not layer_up():
            await asyncio.sleep(wakeup_poll_s())
        try:
            return await layer.receive(channel)
        except Exception:
            # Down (noted by _answers), or only this connection died: either way, soon again.
            await _answers()
            await asyncio.sleep(wakeup_poll_s())


async def _guarded_send(group: str, event: dict[str, Any]) -> None:
    try:
        await _call(lambda: _layer().group_send(group, event))
    except Exception as exc:
        # The write is committed; a missed wake-up only delays listeners (docs/decisions/0014).
        layer_failed("group_send", exc)
    else:
        if not _probing():
            _layer_back()  # a process without a loop of its own (a worker) sees it here


# Sends under way, by loop and group, each with the event to send once more when it ends (None:
# no commit asked meanwhile). Only the loop itself reads and writes it.
_sending: dict[tuple[asyncio.AbstractEventLoop, str], dict[str, Any] | None] = {}
_send_tasks: set["asyncio.Task[None]"] = set()


def _wake_local(loop: asyncio.AbstractEventLoop | None, group: str, event: dict[str, Any]) -> None:
    """Call the direct listeners of group: at once on loop (the caller's), else on their own.

    A listener whose loop has closed without leaving (a test's) is forgotten."""
    listeners = _local.get(group, {})
    for channel, (listener_loop, wake) in list(listeners.items()):
        if listener_loop is loop:
            wake(event)
            continue
        try:
            listener_loop.call_soon_threadsafe(wake, event)
        except RuntimeError:  # its loop has closed
            listeners.pop(channel, None)


def _layer_muted() -> bool:
    # Listeners here poll the database meanwhile; the probe tells when it is back.
    return not layer_up() and _probing()


def _layer_needed(group: str) -> bool:
    """Whether anyone but this process's direct listeners may hear group through the layer: any
    other process (Redis), or a long poll here."""
    return layer_is_redis() or bool(_memberships.get(group))


def _start_send(loop: asyncio.AbstractEventLoop, group: str, event: dict[str, Any]) -> None:
    """On loop: wake the direct listeners (soon), and send through the layer if anyone else may
    listen; while a send to the group is under way, send once more after it.

    A wake-up is the same whatever commit asked for it (listeners read the database again), so
    a burst of commits costs two sends, not one each: a send through Redis costs the broker
    more CPU than the commit it announces (docs/benchmarks.md). The last send always starts
    after the last commit, so no listener misses one.
    """
    # Two turns of the loop later: the commit's own callers (a group commit's producers) are
    # answered first, and the deliveries' database calls start after their answers are out.
    loop.call_soon(loop.call_soon, _wake_local, loop, group, event)
    if not _layer_needed(group) or _layer_muted():
        return
    key = (loop, group)
    if key in _sending:
        _sending[key] = event
        return
    _sending[key] = None
    task = loop.create_task(_send_coalesced(key, group, event))
    _send_tasks.add(task)
    task.add_done_callback(_send_tasks.discard)


async def _send_coalesced(
    key: tuple[asyncio.AbstractEventLoop, str], group: str, event: dict[str, Any]
) -> None:
    try:
        while True:
            await _guarded_send(group, event)
            again = _sending.get(key)
            if again is None:
                return
            _sending[key] = None
            event = again
    finally:
        _sending.pop(key, None)


def _send(group: str, event: dict[str, Any]) -> None:
    event["origin"] = ORIGIN
    loop = _loop_for_send()
    try:
        if loop is not None:
            # Off the server's loop: hand the wake-ups and the send to it, which owns the
            # layer's queues, without waiting for them.
            loop.call_soon_threadsafe(_start_send, loop, group, event)
            return
        _wake_local(None, group, event)
        if _layer_needed(group) and not _layer_muted():
            async_to_sync(_guarded_send)(group, event)
    except Exception:
        logger.exception("could not publish %s to %s", event.get("type"), group)


def from_here(event: dict[str, Any]) -> bool:
    """Whether event was sent by this process (its direct listeners had it already)."""
    return event.get("origin") == ORIGIN


def publish_on_commit(group: str, event: dict[str, Any]) -> None:
    """Send event to group once the current transaction commits; never on rollback."""
    transaction.on_commit(lambda: _send(group, event))


def messages_appended(topic_id: int, end_offsets: dict[int, int]) -> None:
    """Announce, after commit, that partitions of a topic grew to these end offsets."""
    publish_on_commit(
        topic_group(topic_id),
        {
            "type": MESSAGES_APPENDED,
            "topic_id": topic_id,
            "end_offsets": {str(p): o for p, o in end_offsets.items()},
        },
    )


def messages_returned(topic_id: int) -> None:
    """Announce, after commit (at once outside a transaction), that retries are deliverable."""
    publish_on_commit(topic_group(topic_id), {"type": MESSAGES_RETURNED, "topic_id": topic_id})


async def long_poll(
    attempt: Callable[[], Awaitable[T]],
    is_empty: Callable[[T], bool],
    topic_id_of: Callable[[T], int],
    max_wait_ms: int,
) -> T:
    """Run attempt until it finds something or max_wait_ms passes, waking on appended messages.

    The listener joins the topic's group before the second attempt, so a message committed
    between the two attempts is either seen by it or wakes the wait: none is missed. While the
    layer is down, it re-reads every FERRY_WAKEUP_POLL_MS instead.
    """
    listen_here()
    result = await attempt()
    if not is_empty(result) or max_wait_ms <= 0:
        return result
    layer = _layer()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000
    group = topic_group(topic_id_of(result))
    channel = await layer.new_channel("ferry.poll.")
    _polls.add(channel)
    await join(group, channel)
    try:
        while True:
            result = await attempt()
            remaining = deadline - loop.time()
            if not is_empty(result) or remaining <= 0 or _stopping:
                return result
            if not layer_up():
                await asyncio.sleep(min(wakeup_poll_s(), remaining))
                continue
            try:
                await asyncio.wait_for(layer.receive(channel), timeout=remaining)
            except TimeoutError:
                return await attempt()
            except Exception:
                await _answers()  # down: the loop polls; else only a connection died
                await asyncio.sleep(min(wakeup_poll_s(), max(0.0, deadline - loop.time())))
    finally:
        _polls.discard(channel)
        with contextlib.suppress(Exception):
            await leave(group, channel)


async def stop_waiting() -> int:
    """End this process's waiting long polls now, each with what it finds (a shutdown).

    Every long poll waiting or starting to wait from now on answers at once; returns how many
    were woken.
    """
    global _stopping
    _stopping = True
    channels = list(_polls)
    layer = _layer()
    for channel in channels:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(LAYER_TIMEOUT_S):
                await layer.send(channel, {"type": STOP_WAITING})
    return len(channels)


async def check_layer() -> bool:
    """Whether the channel layer answers now (the health check's question)."""
    return layer_up() and await _answers()
