"""The console's live socket /ws/console/: a nudge when the broker changed, at most once a second.

See docs/console-ui.md#live-updates. Read-only: it authenticates by the session (staff with the
console's view permission) and sends `{"type": "update", "changed": [...]}`; the page then
re-reads what it shows through its own views, so the socket carries no data a page could not
get anyway.
"""

import asyncio
import contextlib
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from typing_extensions import override

from broker import settings as ferry_settings
from broker.core import activity, dbthreads, outages
from dashboard import access

logger = logging.getLogger(__name__)


def may_view(user: Any) -> bool:
    """Whether the session's user may see the console (the pages' own role check)."""
    return bool(user is not None and user.is_authenticated and access.can_view(user))


class Watcher:
    """One per process: reads the fingerprint every interval while a console page is open.

    However many pages are open, the database sees one small read per interval.
    """

    def __init__(self) -> None:
        self.listeners: set[ConsoleConsumer] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, consumer: "ConsoleConsumer") -> None:
        self.listeners.add(consumer)
        loop = asyncio.get_running_loop()
        # A task of a loop that has ended (a server restart in tests) never finishes: replace it.
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run())

    def discard(self, consumer: "ConsoleConsumer") -> None:
        self.listeners.discard(consumer)

    async def _run(self) -> None:
        interval = float(ferry_settings.get("CONSOLE_LIVE_INTERVAL_SECONDS"))
        last: activity.Fingerprint | None = None
        while self.listeners:
            try:
                current = await dbthreads.run(activity.fingerprint)
            except Exception as exc:
                # A failed read (database restarting) skips one tick; pages keep what they show.
                outages.log_failure(logger, "console live check", exc)
            else:
                changed = current.changed_since(last)
                last = current
                if changed:
                    for consumer in list(self.listeners):
                        await consumer.nudge(changed)
            await asyncio.sleep(interval)


WATCHER = Watcher()


class ConsoleConsumer(AsyncJsonWebsocketConsumer):
    """Tells an open console page when what it shows may have changed."""

    # No channel layer: the Watcher reads the database itself, and with one, a Redis outage
    # ended the page's socket (channels lets a failed layer receive end the application: 1011).
    channel_layer_alias = "ferry.console.no-layer"  # not configured: get_channel_layer() is None

    @override
    async def connect(self) -> None:
        if not await database_sync_to_async(may_view)(self.scope.get("user")):
            # Closing before accept refuses the handshake: the browser sees HTTP 403.
            await self.close()
            return
        await self.accept()
        interval = float(ferry_settings.get("CONSOLE_LIVE_INTERVAL_SECONDS"))
        await self.send_json({"type": "hello", "interval_ms": int(interval * 1000)})
        WATCHER.add(self)

    @override
    async def disconnect(self, code: int) -> None:
        WATCHER.discard(self)

    @override
    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The page only listens; a ping keeps proxies from closing an idle socket.
        if isinstance(content, dict) and content.get("type") == "ping":
            with contextlib.suppress(Exception):  # as in nudge: the socket may be closing
                await self.send_json({"type": "pong"})

    async def nudge(self, changed: tuple[str, ...]) -> None:
        with contextlib.suppress(Exception):
            # A socket closing right now is removed by disconnect(); nothing to do here.
            await self.send_json({"type": "update", "changed": list(changed)})
