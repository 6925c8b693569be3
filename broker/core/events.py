"""The only code that talks to the channel layer: group names, events, publish on commit, waits.

See docs/architecture.md#events. Events are wake-ups, not data: a listener that gets one reads
the database again, so a lost or duplicated event costs latency, never correctness.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, cast

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from broker.core import dbthreads

logger = logging.getLogger(__name__)

MESSAGES_APPENDED = "ferry.messages_appended"
# Messages of the topic are deliverable again: retries came due, nacks, redrives, a member left.
MESSAGES_RETURNED = "ferry.messages_returned"

T = TypeVar("T")


class _ChannelLayer(Protocol):
    """What this module uses of a channel layer.

    channels types get_channel_layer() as BaseChannelLayer | None, whose new_channel() takes no
    prefix; the layers settings configure (in-memory, Redis) all take one, and one is always set.
    """

    async def new_channel(self, prefix: str = ...) -> str: ...
    async def receive(self, channel: str) -> dict[str, Any]: ...
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


def _send(group: str, event: dict[str, Any]) -> None:
    layer = cast(_ChannelLayer, get_channel_layer())
    loop = _loop_for_send()
    try:
        if loop is not None:
            # Off the server's loop: hand the send to it, which owns the layer's queues,
            # without waiting for it.
            asyncio.run_coroutine_threadsafe(layer.group_send(group, event), loop)
        else:
            async_to_sync(layer.group_send)(group, event)
    except Exception:
        # The write is committed; a missed wake-up only delays listeners until their timeout.
        logger.exception("could not publish %s to %s", event.get("type"), group)


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
    between the two attempts is either seen by it or wakes the wait: none is missed.
    """
    listen_here()
    result = await attempt()
    if not is_empty(result) or max_wait_ms <= 0:
        return result
    layer = cast(_ChannelLayer, get_channel_layer())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000
    group = topic_group(topic_id_of(result))
    channel = await layer.new_channel("ferry.poll.")
    await layer.group_add(group, channel)
    try:
        while True:
            result = await attempt()
            remaining = deadline - loop.time()
            if not is_empty(result) or remaining <= 0:
                return result
            try:
                await asyncio.wait_for(layer.receive(channel), timeout=remaining)
            except TimeoutError:
                return await attempt()
    finally:
        await layer.group_discard(group, channel)
