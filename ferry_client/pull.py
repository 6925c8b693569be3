"""Pull mode: a group member over REST that long-polls, settles by receipt, and leaves.

See docs/client.md#push-and-pull and docs/api.md (members, poll, ack). A poll counts as the
member's heartbeat; while the handlers are busy and nothing is polled, it heartbeats itself.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ferry_client import errors, records, transport, workers
from ferry_client.records import Delivery, Subscription

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RestSettler:
    """Settles over REST: POST /groups/{group}/ack, /nack, /reject."""

    def __init__(self, rest: transport.AsyncTransport, group: str) -> None:
        self.rest = rest
        self.group = group

    async def settle(self, action: workers.Action, receipts: list[str], error: str) -> None:
        body: dict[str, Any] = {"receipts": receipts}
        if action != "ack":
            body["error"] = error
        # Settling twice is harmless (the second time the receipts are stale): retry freely.
        await self.rest.request("POST", f"/groups/{self.group}/{action}", json=body)


class Poller:
    """Joins the group, polls while the handlers have room, and leaves when stopping."""

    def __init__(
        self,
        rest: transport.AsyncTransport,
        subscription: Subscription,
        pool: workers.Pool,
        stopping: asyncio.Event,
        *,
        make_settlements: Callable[[workers.Settler], workers.Settlements],
        on_member: Callable[[str], None],
    ) -> None:
        self.rest = rest
        self.on_member = on_member
        self.subscription = subscription
        self.pool = pool
        self.stopping = stopping
        self.make_settlements = make_settlements
        # Chosen here, not by the broker, so a join retried after a timeout is the same member.
        self.member_id = subscription.member_id or records.new_id()
        self.heartbeat_s = 3.0

    async def run(self) -> None:
        await self._until_stopped(self._join())
        if self.stopping.is_set():
            return
        settlements = self.make_settlements(RestSettler(self.rest, self.subscription.group))
        flusher = asyncio.create_task(settlements.run())
        try:
            while not self.stopping.is_set():
                await self._round(settlements)
            await self.pool.drain()
            await settlements.flush()
        finally:
            settlements.close()
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
            await self._leave()

    async def _round(self, settlements: workers.Settlements) -> None:
        room = self.subscription.prefetch - self.pool.pending
        if room <= 0:
            # The handlers are busy: wait for one to finish, heartbeating meanwhile.
            try:
                await asyncio.wait_for(self.pool.changed(), self.heartbeat_s)
            except TimeoutError:
                await self._call(self._heartbeat())
            return
        body = await self._call(self._poll(room))
        for item in (body or {}).get("messages", ()):
            self.pool.submit(Delivery.from_wire(self.subscription.topic, item), settlements)

    async def _call(self, call: Coroutine[Any, Any, T]) -> T | None:
        """Run a request until it ends or stopping; rejoin if expired; wait out an outage."""
        try:
            return await self._until_stopped(call)
        except errors.BrokerUnavailable as exc:
            logger.warning("broker unavailable: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.rest.policy.max_backoff_s)
        except errors.FerryError as exc:
            if exc.code != "member_not_found":
                raise
            # Silent past the session timeout (a long pause): join again under the same id.
            logger.warning("membership expired; joining %s again", self.subscription.group)
            await self._until_stopped(self._join())
        return None

    async def _until_stopped(self, call: Coroutine[Any, Any, T]) -> T | None:
        """The call's result, or None if stopping came first (the call is cancelled)."""
        task = asyncio.ensure_future(call)
        stopper = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        return task.result()

    async def _join(self) -> None:
        s = self.subscription
        body: dict[str, Any] = {"topic": s.topic, "member_id": self.member_id}
        if s.filter is not None:
            body["filter"] = s.filter
        if s.client:
            body["client"] = s.client
        while True:
            try:
                member = await self.rest.request("POST", f"/groups/{s.group}/members", json=body)
            except errors.BrokerUnavailable as exc:
                logger.warning("could not join %s: %s", s.group, exc)
                await asyncio.sleep(self.rest.policy.max_backoff_s)
                continue
            break
        self.heartbeat_s = member["heartbeat_interval_ms"] / 1000
        self.on_member(self.member_id)
        logger.info("joined %s as %s, partitions %s", s.group, self.member_id, member["partitions"])

    async def _poll(self, room: int) -> Any:
        wait_ms = int(self.heartbeat_s * 1000)
        return await self.rest.request(
            "POST",
            f"/groups/{self.subscription.group}/poll",
            json={
                "topic": self.subscription.topic,
                "member_id": self.member_id,
                "max_messages": min(room, 10_000),
                "max_wait_ms": wait_ms,
            },
            timeout=self.rest.timeout + wait_ms / 1000,
        )

    async def _heartbeat(self) -> Any:
        return await self.rest.request(
            "POST", f"/groups/{self.subscription.group}/members/{self.member_id}/heartbeat"
        )

    async def _leave(self) -> None:
        # Leaving hands what was polled and not settled back to the group at once.
        with contextlib.suppress(errors.FerryError):
            await self.rest.request(
                "DELETE",
                f"/groups/{self.subscription.group}/members/{self.member_id}",
                idempotent=False,
            )
