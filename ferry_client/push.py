"""Push mode: a subscription over the WebSocket, resubscribing after a lost connection.

See docs/client.md#push-and-pull and docs/websocket.md. The broker pushes within the
subscription's credit (prefetch) and resumes from the group's committed offset when the
client subscribes again, on the same or another broker URL.
"""

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Callable
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from ferry_client import errors, transport, workers
from ferry_client.records import Delivery, Subscription

logger = logging.getLogger(__name__)

SUB = "ferry-client"
SUBSCRIBE_REF = "subscribe"
UNSUBSCRIBE_REF = "unsubscribe"
# A subscription that ended (or a subscribe refused) with these codes is subscribed again after
# the error's retry_after; any other ends run().
RETRYABLE_CODES = frozenset({"broker_error", "unavailable", "insufficient_storage"})
HEALTHY_SESSION_S = 5.0
# Failures of the connection itself: reconnect (the next URL first).
CONNECTION_ERRORS = (OSError, TimeoutError, websockets.exceptions.WebSocketException)


class Resubscribe(Exception):
    """The broker could not subscribe just now (its database is away): try again later."""

    def __init__(self, error: errors.FerryError) -> None:
        super().__init__(str(error))
        retry_after = error.detail.get("retry_after")
        self.retry_after = float(retry_after) if isinstance(retry_after, int | float) else 0.0


class SocketSettler:
    """Settles over the subscription's own socket (the ack, nack and reject frames)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._refs = 0

    async def settle(self, action: workers.Action, receipts: list[str], error: str) -> None:
        self._refs += 1
        # A ref tells the broker's answer to this frame from the end of the subscription.
        frame: dict[str, Any] = {
            "type": action,
            "ref": f"settle-{self._refs}",
            "sub": SUB,
            "receipts": receipts,
        }
        if action != "ack":
            frame["error"] = error
        await self.ws.send(json.dumps(frame))


class Subscriber:
    """Keeps one subscription alive until `stopping` is set, then leaves the group cleanly."""

    def __init__(
        self,
        endpoints: transport.Endpoints,
        api_key: str,
        subscription: Subscription,
        pool: workers.Pool,
        stopping: asyncio.Event,
        *,
        policy: transport.RetryPolicy,
        timeout: float,
        make_settlements: Callable[[workers.Settler], workers.Settlements],
        on_member: Callable[[str], None],
        tls: ssl.SSLContext,
    ) -> None:
        self.endpoints = endpoints
        self.tls = tls
        self.on_member = on_member
        self.api_key = api_key
        self.subscription = subscription
        self.pool = pool
        self.stopping = stopping
        self.policy = policy
        self.timeout = timeout
        self.make_settlements = make_settlements
        # The broker's id for this member, reused on reconnect (broadcast mode resumes by it).
        self.member_id = subscription.member_id
        # What the broker asked to wait before subscribing again (its error's retry_after).
        self.retry_after = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while not self.stopping.is_set():
            order = self.endpoints.order()
            url = order[failures % len(order)]
            try:
                endpoint = transport.ws_url(url)
                async with websockets.connect(
                    endpoint,
                    additional_headers={"Authorization": f"Bearer {self.api_key}"},
                    # websockets takes a context for wss:// only.
                    ssl=self.tls if endpoint.startswith("wss:") else None,
                    open_timeout=self.timeout,
                    # The broker bounds its frames (FERRY_WS_PUSH_BATCH messages of bounded size).
                    max_size=None,
                ) as ws:
                    await self._subscribe(ws, url)
                    self.endpoints.succeeded(url)
                    began = loop.time()
                    await self._session(ws)
                    # A subscription that lasted resets the backoff; one that keeps ending at
                    # once (a failing broker) backs off like a refused connection.
                    if loop.time() - began >= HEALTHY_SESSION_S:
                        failures = 0
            except CONNECTION_ERRORS as exc:
                # Also a close by the server (4503: it gave up on the connection): resubscribe.
                logger.warning("subscription on %s failed: %r", url, exc)
            except Resubscribe as exc:
                logger.warning("could not subscribe on %s: %s", url, exc)
                self.retry_after = exc.retry_after
            if self.stopping.is_set():
                return
            failures += 1
            delay = max(self.policy.delay(failures, len(order)), self.retry_after)
            self.retry_after = 0.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)

    async def _subscribe(self, ws: ClientConnection, url: str) -> None:
        s = self.subscription
        frame: dict[str, Any] = {
            "type": "subscribe",
            "ref": SUBSCRIBE_REF,
            "sub": SUB,
            "topic": s.topic,
            "group": s.group,
            "prefetch": s.prefetch,
            "from": s.start,
        }
        if self.member_id is not None:
            frame["member_id"] = self.member_id
        if s.filter is not None:
            frame["filter"] = s.filter
        if s.client:
            frame["client"] = s.client
        await ws.send(json.dumps(frame))
        async with asyncio.timeout(self.timeout):
            while True:
                answer = json.loads(await ws.recv())
                if answer.get("type") == "subscribed":
                    self.member_id = answer["member_id"]
                    self.on_member(answer["member_id"])
                    logger.info(
                        "subscribed to %s on %s as %s of %s, partitions %s",
                        s.topic,
                        url,
                        self.member_id,
                        s.group,
                        answer.get("partitions"),
                    )
                    return
                if answer.get("type") == "error":
                    error = errors.FerryError.from_body(answer)
                    if error.code in RETRYABLE_CODES:
                        raise Resubscribe(error)
                    # Refused (unknown topic, no permission, bad filter): retrying cannot help.
                    raise error

    async def _session(self, ws: ClientConnection) -> None:
        settlements = self.make_settlements(SocketSettler(ws))
        flusher = asyncio.create_task(settlements.run())
        reader = asyncio.create_task(self._read(ws, settlements))
        stopper = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # a fatal error frame raises; a lost connection returns
                return
            # Stopping: finish the handlers running now, send their outcomes, then leave the
            # group (what was pushed and not handled goes back to it at once).
            await self.pool.drain()
            await settlements.flush()
            await ws.send(json.dumps({"type": "unsubscribe", "ref": UNSUBSCRIBE_REF, "sub": SUB}))
            await asyncio.wait({reader}, timeout=self.timeout)
        finally:
            settlements.close()
            for task in (flusher, reader, stopper):
                task.cancel()
            await asyncio.gather(flusher, reader, stopper, return_exceptions=True)

    async def _read(self, ws: ClientConnection, settlements: workers.Settlements) -> None:
        """Dispatch the broker's frames until the subscription or the connection ends."""
        async for raw in ws:
            frame = json.loads(raw)
            kind = frame.get("type")
            if kind == "messages":
                for item in frame["items"]:
                    self.pool.submit(Delivery.from_wire(self.subscription.topic, item), settlements)
            elif kind == "error":
                error = errors.FerryError.from_body(frame)
                ended = frame.get("sub") == SUB and frame.get("ref") is None
                if error.code == "unauthenticated" or (ended and error.code not in RETRYABLE_CODES):
                    raise error
                if ended:
                    logger.warning("subscription ended (%s); subscribing again", error)
                    retry_after = error.detail.get("retry_after")
                    if isinstance(retry_after, int | float):
                        self.retry_after = float(retry_after)
                    return
                logger.warning("the broker refused a frame: %s", error)
            elif kind == "closing":
                logger.info("broker shutting down: %s", frame.get("reason"))
                return
            elif kind == "unsubscribed":
                return
            elif kind in {"acked", "nacked", "rejected"} and frame.get("stale"):
                # Redelivered meanwhile (deadline passed): the new delivery will be settled.
                logger.info("%d stale receipts in %s", len(frame["stale"]), kind)
            elif kind == "assigned":
                logger.info("partitions now %s", frame.get("partitions"))
