"""The WebSocket edge under /ws/v1/: subscribe, push within credit, settle, publish.

See docs/websocket.md. Each subscription is a group member: it joins on subscribe, leaves on
unsubscribe or disconnect (its unsettled messages go back to the group at once), and its push
task delivers through the same core calls as a REST member poll, woken by the channel layer
when messages are appended or come back for redelivery.
"""

import asyncio
import contextlib
import dataclasses
import functools
import logging
import sys
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs

import orjson
from autobahn.exception import Disconnected
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from pydantic import ValidationError
from typing_extensions import override

from broker import frames, schemas, wire
from broker import settings as ferry_settings
from broker.core import (
    dbthreads,
    delivery,
    errors,
    events,
    groupcommit,
    keys,
    log,
    membership,
    outages,
    transactions,
)
from broker.core.records import (
    AckAndDelivery,
    Delivery,
    DeliveryResult,
    MemberInfo,
    NewMessage,
    Principal,
    SettleResult,
    TransactionInfo,
)
from broker.subscriptions import HeldAcks, Subscription

T = TypeVar("T")
logger = logging.getLogger(__name__)

# Close codes (docs/websocket.md#close-codes). Autobahn, under Daphne, lets an application send
# only 1000 or 3000-4999, so RFC 6455's 1009 and 1001 become ours in the 4000 range, each the
# HTTP status of the same meaning plus 4000.
CLOSE_TOO_BIG = 4413
CLOSE_GOING_AWAY = 4503
CLOSE_UNAUTHENTICATED = 4401
# The server gives up on a connection: its database is away (4503 as well), or a bug (4500).
CLOSE_INTERNAL_ERROR = 4500


class SocketClosed(Exception):
    """A frame was sent after the close handshake began, before Daphne knew the socket is gone."""


class FrameTooLarge(errors.BrokerError):
    """The frame is larger than the server accepts."""

    code = "frame_too_large"


def frame_too_large(size: int, limit: int) -> FrameTooLarge:
    return FrameTooLarge(
        f"The frame is {size} bytes; this server accepts at most {limit}.", size=size, limit=limit
    )


class PushTooLarge(errors.BrokerError):
    """A delivered message does not fit one frame; it stays in flight (settle it by receipt)."""

    code = "push_too_large"


class UnknownFrame(errors.InvalidRequest):
    """The frame's type is not one this server knows."""

    code = "unknown_frame"


class InvalidFrame(errors.InvalidRequest):
    """The frame is not valid."""

    code = "invalid_frame"


class SubscriptionNotFound(errors.BrokerError):
    """No subscription of this connection has that id."""

    code = "subscription_not_found"
    template = "No subscription {sub!r} on this connection."


async def wait_for_event(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until event is set or timeout_s passes; a cancellation always propagates.

    Not asyncio.wait_for: on Python 3.11 it returns normally when the task is cancelled just as
    the event is set (CPython gh-86296), and a push task cancelled by unsubscribe then went on
    pushing and heartbeating, and unsubscribe waited for it forever (issue 9, item 12).
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()


def _token(scope: Any) -> str | None:
    """A bearer key from the Authorization header, else the token query parameter (browsers)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token:
                return token.strip()
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return query.get("token", [None])[0]


def _log_failed(
    message: str, *args: object, exc: BaseException, bug: int = logging.WARNING
) -> None:
    """Log what failed: a bug at level bug, with its traceback; an outage as one warning line
    that names it, not a traceback (docs/operations.md). message's arguments name exc."""
    if outages.classify(exc) is None:
        logger.log(bug, message, *args, exc_info=exc)
    else:
        logger.warning(message, *args)


def _failure(exc: BaseException, what: str) -> errors.BrokerError:
    """What an unexpected failure means for the client: an outage's own error (logged in one
    line, as the REST API does), else unavailable (a bug: logged with its traceback)."""
    outage = outages.classify(exc)
    if outage is not None:
        logger.warning("%s: %s (%s)", what, outage.code, exc)
        return outage
    logger.error("%s failed", what, exc_info=exc)
    return errors.Unavailable(
        "The broker could not do that just now; try again.", retry_after=outages.retry_after_s()
    )


def _error(exc: errors.BrokerError, ref: frames.Ref = None, sub: str | None = None) -> bytes:
    frame: dict[str, Any] = {
        "type": "error",
        "error": {"code": exc.code, "message": exc.message, "detail": exc.detail},
        "ref": ref,
    }
    if sub is not None:
        frame["sub"] = sub
    return orjson.dumps(frame)


# Open connections, for a graceful shutdown (mqsite/shutdown.py calls close_all).
_live: "weakref.WeakSet[BrokerConsumer]" = weakref.WeakSet()
_closing_all = False
CLOSE_WAIT_S = 2
# How often an open connection checks that its key still authenticates: a revoked key loses
# its sockets within this plus FERRY_AUTH_CACHE_SECONDS (docs/websocket.md#close-codes).
KEY_CHECK_INTERVAL_S = 0.5
# Publish frames of one connection being committed at once; more wait their turn.
MAX_PUBLISHES_IN_FLIGHT = 256
# Messages read ahead for a subscriber (FERRY_WS_READ_AHEAD) and not pushed within this long
# go back to the group (delivery.release_messages): its acks stopped coming.
READ_AHEAD_LINGER_S = 1.0


def hook_daphne() -> None:
    """Under Daphne, answer a client frame over its size limit as this consumer does.

    Autobahn checks Daphne's --websocket-max-message-size (which scripts/run sets to
    FERRY_WS_MAX_FRAME_BYTES) before the frame reaches the application, and by default drops
    the TCP connection: the client sees 1006 and no reason. Here it gets the `error` frame
    (`frame_too_large`) and close 4413, as docs/websocket.md says; the rest of the frame is
    read and discarded while the closing handshake runs.
    """
    if "daphne.server" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketProtocol  # type: ignore[import-untyped]

    def max_message_size_exceeded(self: Any, size: int, limit: int, reason: str) -> None:
        self.failedByMe = True  # autobahn: ignore the rest of this message
        if self.state == self.STATE_OPEN:
            logger.info("closing a WebSocket: %s", reason)
            self.sendMessage(_error(frame_too_large(size, limit)), isBinary=False)
            self.sendClose(code=CLOSE_TOO_BIG, reason="frame too large")

    WebSocketProtocol._max_message_size_exceeded = max_message_size_exceeded


async def close_all(timeout_s: float) -> None:
    """Close every open connection for a shutdown (close_for_shutdown), within timeout_s.

    A connection whose handshake was under way meanwhile is closed as it opens (connect).
    """
    global _closing_all
    _closing_all = True
    consumers = list(_live)
    if consumers:
        await asyncio.wait(
            [asyncio.ensure_future(c.close_for_shutdown()) for c in consumers],
            timeout=max(0.01, timeout_s),
        )


class BrokerConsumer(AsyncWebsocketConsumer):
    """One WebSocket connection: its key, its subscriptions, and their push tasks."""

    principal: Principal | None
    token: str | None
    key_check: "asyncio.Task[None] | None"
    subs: dict[str, Subscription]
    closed: asyncio.Event
    publishing: "set[asyncio.Task[None]]"
    # Held acks settled alone when their time is up (Subscription.held_ack).
    background: "set[asyncio.Task[None]]"

    async def close_for_shutdown(self) -> None:
        """Say goodbye, hand unsettled messages back to their groups, close with 1001."""
        with contextlib.suppress(Exception):
            await self._send_frame({"type": "closing", "reason": "server shutting down"})
        try:
            await self._leave_all()
        except Exception as exc:
            _log_failed(
                "could not leave the groups of a closing connection (%s)",
                exc,
                exc=exc,
                bug=logging.ERROR,
            )
        with contextlib.suppress(Exception):
            await self.close(code=CLOSE_GOING_AWAY)
        # Twisted drops unwritten data when the reactor stops: wait for the client's close.
        await wait_for_event(self.closed, CLOSE_WAIT_S)

    @override
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """channels' AsyncConsumer.__call__, except that nothing outlives the connection.

        The layer's receive goes through events.receive, which outlasts a Redis outage; in
        channels' own, its error ended the application (Daphne closed with 1011) without
        disconnect(), and the push tasks went on heartbeating for members of closed connections,
        holding their partitions for good (issue 17). Whatever ends the connection now ends
        its subscriptions too.
        """
        self.scope = scope
        layer = get_channel_layer(self.channel_layer_alias)
        assert layer is not None, "mqsite/settings.py always configures a layer"  # noqa: S101
        self.channel_layer = layer
        self.channel_name = await layer.new_channel()
        self.channel_receive = functools.partial(events.receive, self.channel_name)
        self.base_send = send
        try:
            if events.layer_is_redis():
                await await_many_dispatch([receive, self.channel_receive], self.dispatch)
            else:
                # The in-memory layer brings this consumer nothing: this process's wake-ups
                # come straight from the commits (events.join), and no other process has one.
                # Frames alone, without channels' wait on two receives per frame.
                while True:
                    await self.dispatch(await receive())
        except StopConsumer:
            pass
        except Exception as exc:
            _log_failed("WebSocket connection failed (%s)", exc, exc=exc, bug=logging.ERROR)
            code = CLOSE_GOING_AWAY if outages.classify(exc) else CLOSE_INTERNAL_ERROR
            with contextlib.suppress(Exception):
                await self.close(code=code)
        finally:
            # Shielded: a cancelled application (Daphne's close timeout) still ends its members.
            await asyncio.shield(self._end())

    @override
    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' dispatch first closes stale database connections with a hop to the sync
        # thread, on every frame and event; this consumer reaches the database only through
        # broker/core/dbthreads.py, whose threads look after their own connections.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        with contextlib.suppress(SocketClosed):
            # The socket is closing: the answer is dropped, and the disconnect comes next.
            await handler(message)

    @override
    async def connect(self) -> None:
        self.principal = None
        self.token = None
        self.key_check = None
        self.subs = {}
        self.closed = asyncio.Event()
        self.publishing = set()
        self.background = set()
        events.listen_here()
        _live.add(self)
        await self.accept()
        if _closing_all:
            await self.close_for_shutdown()
            return
        token = _token(self.scope)
        if token is None:
            return
        try:
            self.principal = await dbthreads.run(keys.authenticate, token)
        except errors.BrokerError as exc:
            await self._send_raw(_error(exc))
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self._watch_key(token)

    @override
    async def disconnect(self, code: int) -> None:
        await self._end()

    async def _end(self) -> None:
        """The connection is over: stop its tasks first (no member heartbeats past its
        connection), then leave the groups, each on its own (if a leave cannot be written, the
        member, no longer heartbeating, expires after the group's session timeout)."""
        _live.discard(self)
        closed = getattr(self, "closed", None)
        if closed is not None:
            closed.set()
        check = getattr(self, "key_check", None)
        if check is not None:
            check.cancel()
        await self._leave_all()

    def _watch_key(self, token: str) -> None:
        self.token = token
        if self.key_check is None:
            self.key_check = asyncio.create_task(self._check_key())

    async def _check_key(self) -> None:
        """Close the connection (4401) once its key no longer authenticates: revoked."""
        while not self.closed.is_set():
            await asyncio.sleep(KEY_CHECK_INTERVAL_S)
            token = self.token
            if keys.cached_principal(token) is not None:
                continue
            try:
                await dbthreads.run(keys.authenticate, token)
            except errors.Unauthenticated:
                if token != self.token:
                    continue  # an auth frame switched keys meanwhile
                logger.info("closing a WebSocket: its key %r was revoked", self._key_name())
                with contextlib.suppress(Exception):
                    await self._send_raw(_error(errors.Unauthenticated("The API key was revoked.")))
                    await self.close(code=CLOSE_UNAUTHENTICATED)
                return
            except Exception as exc:
                # The database is away: the next check tries again.
                _log_failed("could not check a WebSocket's key (%s)", exc, exc=exc)

    def _key_name(self) -> str | None:
        return self.principal.name if self.principal is not None else None

    async def _leave_all(self) -> None:
        subs, self.subs = getattr(self, "subs", {}), {}
        for s in subs.values():
            if s.task is not None:
                s.task.cancel()
        for s in subs.values():
            # Acked is acked, also when the socket closed before the ack's push: else the
            # leave would hand its messages to the rest of the group again.
            await self._settle_held(s, reply=False)
            await self._stop(s)

    async def _stop(self, s: Subscription) -> None:
        """End a subscription that is no longer in self.subs: its push task, then its member.

        Never raises: a failure to leave leaves a member that no longer heartbeats, which the
        group expires after its session timeout.
        """
        if s.task is not None:
            s.task.cancel()
            # asyncio.wait: the push task's end (cancelled, or failed) is not this task's; a
            # cancellation of this task itself still propagates.
            await asyncio.wait([s.task])
        s.drop_ahead()  # the leave hands them back with the rest of the member's messages
        await self._leave(s)

    async def _send_raw(self, data: bytes) -> None:
        try:
            await self.send(text_data=data.decode())
        except Disconnected as exc:
            # Autobahn's socket is closed from the close frame on; Daphne drops frames only
            # once the TCP connection is gone, and tells this consumer (disconnect) after that.
            raise SocketClosed from exc

    async def _send_frame(self, frame: dict[str, Any]) -> None:
        await self._send_raw(orjson.dumps(frame))

    @override
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        data: str | bytes = text_data if text_data is not None else (bytes_data or b"")
        limit = ferry_settings.get("WS_MAX_FRAME_BYTES")
        # A text frame's UTF-8 size is at most four bytes a character: encode only near the limit.
        near = isinstance(data, bytes) or len(data) * 4 > limit
        size = len(data.encode() if isinstance(data, str) else data) if near else 0
        if size > limit:
            # Under Daphne, hook_daphne() answers the same before the frame reaches us.
            await self._send_raw(_error(frame_too_large(size, limit)))
            await self.close(code=CLOSE_TOO_BIG)
            return
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            await self._send_raw(_error(errors.MalformedJson(f"The frame is not JSON: {exc}")))
            return
        ref = raw.get("ref") if isinstance(raw, dict) else None
        if not isinstance(ref, str | int) or isinstance(ref, bool):
            ref = None
        sub = raw.get("sub") if isinstance(raw, dict) else None
        try:
            frame = self._parse(raw)
            if frame.type != "auth" and self.principal is None:
                raise errors.Unauthenticated(
                    "Send an auth frame first (or connect with an Authorization header)."
                )
            if frame.type == "publish":
                # Publishes run beside the next frames, so that a producer may keep several in
                # flight and they share commits (core/groupcommit.py); they are committed in
                # the order they arrived.
                await self._spawn_publish(frame)
                return
            await HANDLERS[frame.type](self, frame)
        except SocketClosed:
            raise
        except errors.BrokerError as exc:
            await self._send_raw(_error(exc, ref, sub if isinstance(sub, str) else None))
        except Exception as exc:
            # The database went away or a bug: say so and keep the connection usable.
            kind = raw.get("type") if isinstance(raw, dict) else None
            failure = _failure(exc, f"frame {kind!r}")
            await self._send_raw(_error(failure, ref, sub if isinstance(sub, str) else None))

    async def _spawn_publish(self, frame: frames.PublishFrame) -> None:
        while len(self.publishing) >= MAX_PUBLISHES_IN_FLIGHT:
            await asyncio.wait(self.publishing, return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.create_task(self._publish(frame))
        self.publishing.add(task)
        task.add_done_callback(self.publishing.discard)

    async def _publish(self, frame: frames.PublishFrame) -> None:
        try:
            await self.on_publish(frame)
            return
        except SocketClosed:
            return  # a task of its own: nobody else would hear of a socket that closed
        except errors.BrokerError as exc:
            refusal = _error(exc, frame.ref)
        except Exception as exc:
            refusal = _error(_failure(exc, "publish"), frame.ref)
        with contextlib.suppress(SocketClosed):
            await self._send_raw(refusal)

    @staticmethod
    def _parse(raw: Any) -> Any:
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise InvalidFrame('A frame is a JSON object with a "type".')
        if raw["type"] not in frames.TYPES:
            raise UnknownFrame(f"Unknown frame type {raw['type']!r}.", type=raw["type"])
        try:
            return frames.client_frame.validate_python(raw)
        except ValidationError as exc:
            details = exc.errors(include_url=False, include_context=False, include_input=False)
            raise InvalidFrame(
                f"Invalid {raw['type']} frame: "
                + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in details),
                errors=[{"loc": list(e["loc"]), "msg": e["msg"]} for e in details],
            ) from None

    # Frame handlers: parse is done; one core call each, then a reply frame.

    async def on_auth(self, frame: frames.AuthFrame) -> None:
        self.principal = await dbthreads.run(keys.authenticate, frame.token)
        self._watch_key(frame.token)
        await self._send_frame(
            {"type": "authenticated", "ref": frame.ref, "key": self.principal.name}
        )

    async def on_ping(self, frame: frames.PingFrame) -> None:
        await self._send_frame({"type": "pong", "ref": frame.ref, "time_ms": log.now_ms()})

    async def on_subscribe(self, frame: frames.SubscribeFrame) -> None:
        if frame.sub in self.subs:
            raise errors.InvalidRequest(f"Subscription {frame.sub!r} exists on this connection.")
        principal = self._principal()
        info: MemberInfo = await dbthreads.run(
            functools.partial(
                membership.join_group,
                principal,
                frame.group,
                frame.topic,
                frame.member_id,
                filter=frame.filter.to_spec() if frame.filter is not None else None,
                start="earliest" if frame.start == "committed" else frame.start,
                start_timestamp_ms=frame.timestamp_ms,
                client=frame.client or "",
                host=self._host(),
            )
        )
        s = Subscription(
            sub=frame.sub,
            group=info.group,
            topic=info.topic,
            topic_id=info.topic_id,
            member_id=info.member_id,
            generation=info.generation,
            partitions=info.partitions,
            credit=frame.prefetch,
            window=frame.prefetch,
            last_beat=asyncio.get_running_loop().time(),
            client=frame.client or "",
        )
        self.subs[s.sub] = s
        await events.join(events.topic_group(s.topic_id), self.channel_name, self._woken)
        await self._send_frame(
            {
                "type": "subscribed",
                "ref": frame.ref,
                "sub": s.sub,
                "group": s.group,
                "topic": s.topic,
                "member_id": s.member_id,
                "mode": info.mode,
                "generation": s.generation,
                "partitions": list(s.partitions),
                "heartbeat_interval_ms": info.heartbeat_interval_ms,
            }
        )
        s.task = asyncio.create_task(self._pump(s))

    async def on_unsubscribe(self, frame: frames.UnsubscribeFrame) -> None:
        s = self._sub(frame.sub)
        await self._settle_held(s)
        del self.subs[s.sub]
        await self._stop(s)
        await self._send_frame({"type": "unsubscribed", "ref": frame.ref, "sub": s.sub})

    async def _settle(
        self, frame: Any, name: str, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        s = self._sub(frame.sub)
        if name != "extended":
            s.presume(frame.receipts)  # settled from now on
        # Settlements are applied in the order they came: a held ack first.
        await self._settle_held(s)
        settle = functools.partial(
            call, self._principal(), s.group, frame.receipts, *args, **kwargs
        )
        result = await _write(len(frame.receipts) if name == "acked" else None, settle)
        if name != "extended":
            # Settled messages open the window again (back-pressure).
            s.credit += result.settled
            if name != "acked" or not s.drained or s.ahead:
                s.wake.set()
        await self._send_frame(_settled(name, frame.ref, s.sub, result))

    async def on_ack(self, frame: frames.AckFrame) -> None:
        """Ack, then push the credit the ack freed at once, from the same database call.

        Only when the subscriber waits for it: its credit is used up (messages are waiting for
        it) and it holds at most as many unsettled messages as the ack frees. A subscriber with
        many in hand is busy; its acks only settle, and the push task delivers the credit of
        several acks at once, in larger frames (as a subscriber that fell behind needs, to
        catch up). One with credit left has had all there was: an append wakes its push task;
        one whose push task is delivering gets its freed credit from that task's next round.
        Whatever the ack frees (a batch of 100 or 1,000 receipts too), the settlement and the
        delivery are one transaction (at most FERRY_WS_PUSH_BATCH messages pushed from it): a
        batch consumer's acks went 15-25 % further for the same CPU (docs/benchmarks.md).

        For a subscriber with a small window (_read_ahead_for) that call also reads up to
        FERRY_WS_READ_AHEAD messages more (Subscription.ahead): while they last, each ack is
        answered by the next of them at once, and held (FERRY_WS_ACK_HOLD_MS) to be settled
        with the next read, so that such a subscriber costs a database call per hold, not per
        message.
        """
        s = self._sub(frame.sub)
        hold_ms = ferry_settings.get("WS_ACK_HOLD_MS")
        presumed = s.presume(frame.receipts)
        if (s.ahead or s.reading) and hold_ms > 0:
            await self._hold_ack(s, frame, hold_ms, presumed)
            s.credit += presumed
            await self._push_ahead(s)
            return
        free = s.credit + len(frame.receipts)
        if s.credit > 0 or s.pushing > 0 or s.window - free > free:
            if hold_ms > 0 and (s.credit > 0 or s.pushing > 0):
                await self._hold_ack(s, frame, hold_ms)
                return
            await self._settle(frame, "acked", delivery.ack_messages)
            return
        together = await self._with_held(s, frame)
        batch = ferry_settings.get("WS_PUSH_BATCH")
        reserved = max(0, min(s.credit, batch))
        s.credit -= reserved
        # The credit the held acks gave already is not theirs to give again.
        credit = reserved - together.presumed
        ahead = self._read_ahead_for(s, hold_ms)
        try:
            result = await self._ack_then_deliver(
                s, together.receipts, credit + max(0, ahead), batch
            )
        except errors.BrokerError:
            s.credit += reserved
            s.wake.set()
            if len(together.acks) == 1:
                raise
            await self._settle_each(s, together, reply=True)
            return
        except BaseException as exc:
            s.credit += reserved - together.presumed
            s.wake.set()
            if isinstance(exc, Exception) and len(together.acks) > 1:
                # The database is away (or a bug): the held frames get the error this one gets.
                await self._refuse(s, HeldAcks(together.acks[:-1]), _failure(exc, "ack"))
            raise
        acked, delivered = result.acked, result.delivered
        got = delivered.deliveries if delivered is not None else ()
        # What the subscriber may have now; the rest was read ahead.
        free = max(0, credit + acked.settled)
        pushed = got[:free]
        s.credit += credit + acked.settled - len(pushed)
        await self._answer(s, together, acked)
        if delivered is None:
            if s.credit > 0:
                s.wake.set()  # the push task delivers, or meets what stopped this delivery
            return
        s.last_beat = asyncio.get_running_loop().time()
        if len(got) > len(pushed):
            self._read_ahead(s, got[len(pushed) :])
        if pushed:
            if ahead > 0:
                s.lend(pushed)
            await self._push(s, pushed)
        # A wake-up from the layer while this ran waits for this handler (channels dispatches
        # one message at a time), then finds the credit left. The push task looks again at once
        # only for a rebalance to learn, or when more may be waiting already.
        more = len(got) >= batch or delivered.filtered or delivered.expired
        if delivered.generation != s.generation:
            s.seen_generation = delivered.generation
            s.wake.set()
        elif s.credit > 0 and more:
            s.wake.set()

    async def _ack_then_deliver(
        self, s: Subscription, receipts: list[str], credit: int, batch: int
    ) -> AckAndDelivery:
        """delivery.ack_and_deliver for s, on a database thread (or the loop's, if short)."""
        return await _write(
            max(len(receipts), credit),
            delivery.ack_and_deliver,
            self._principal(),
            s.group,
            receipts,
            s.topic,
            s.member_id,
            credit,
            batch,
        )

    async def _with_held(self, s: Subscription, frame: frames.AckFrame) -> HeldAcks:
        """frame, with the subscription's held acks before it when they fit in one call."""
        held = s.take_held_ack()
        if held is None:
            await self._settle_held(s)  # waits for a settlement under way
            return HeldAcks([(frame, 0)])
        if not held.fits(frame):
            await self._settle_ack(s, held, reply=True)
            return HeldAcks([(frame, 0)])
        held.acks.append((frame, 0))
        return held

    async def _answer(self, s: Subscription, acks: HeldAcks, result: SettleResult) -> None:
        for f, share in acks.answers(result):
            await self._send_frame(_settled("acked", f.ref, s.sub, share))

    async def _refuse(self, s: Subscription, acks: HeldAcks, failure: errors.BrokerError) -> None:
        """Answer each ack frame with failure; never raises (the socket may be closing)."""
        for f, _ in acks.acks:
            with contextlib.suppress(Exception):
                await self._send_raw(_error(failure, f.ref, s.sub))

    async def _settle_each(self, s: Subscription, held: HeldAcks, reply: bool) -> None:
        """Settle held ack frames one by one: one frame's receipts may be what a call for all
        of them refused."""
        for one in held.alone():
            await self._settle_ack(s, one, reply)

    @staticmethod
    def _read_ahead_for(s: Subscription, hold_ms: int) -> int:
        """How many messages to read ahead for s: FERRY_WS_READ_AHEAD for a subscriber with a
        window no larger (a batch consumer's ack frees enough for a frame of its own), none
        without held acks (they settle the acks the read-ahead answers)."""
        ahead = ferry_settings.get("WS_READ_AHEAD")
        return ahead if hold_ms > 0 and 0 < s.window <= ahead else 0

    def _read_ahead(self, s: Subscription, deliveries: Sequence[Delivery]) -> None:
        """Keep deliveries for the subscriber's next acks (_arm_ahead_timer)."""
        s.ahead.extend(deliveries)
        s.drained = False
        if s.ahead_timer is None:
            self._arm_ahead_timer(s)

    def _arm_ahead_timer(self, s: Subscription) -> None:
        """Hand back the read-ahead if what is in it now is still there after
        READ_AHEAD_LINGER_S, or a quarter of the time to its deadline if that is shorter, so
        that a message read ahead still has most of its time when it is pushed. A subscriber
        that acks on takes these first (in order) and keeps what was read for it since."""
        left_ms = min(d.deadline_ms for d in s.ahead) - log.now_ms()
        linger = min(READ_AHEAD_LINGER_S, max(0.0, left_ms / 4000))
        s.ahead_old, s.ahead_taken = len(s.ahead), 0
        s.ahead_timer = asyncio.get_running_loop().call_later(linger, self._ahead_due, s)

    async def _push_ahead(self, s: Subscription, wake: bool = True) -> None:
        """Push what the credit lets through from the read-ahead; past it, the push task reads
        (woken unless it is the caller)."""
        taken = s.take_ahead(max(0, s.credit))
        s.credit -= len(taken)
        if taken:
            s.lend(taken)
            await self._push(s, taken)
        if wake and s.credit > 0 and not s.ahead and not s.reading:
            s.drained = False
            s.wake.set()

    def _ahead_due(self, s: Subscription) -> None:
        """If some of the read-ahead waited too long for acks, it all goes back to the group (the
        younger too, so that it comes back in order); else it gets a new timer."""
        s.ahead_timer = None
        if s.ahead_taken >= s.ahead_old:
            if s.ahead:
                self._arm_ahead_timer(s)
            return
        left = s.take_ahead()
        if left:
            self._in_background(self._release(s, left))

    async def _release(self, s: Subscription, deliveries: list[Delivery]) -> None:
        """Hand messages read ahead back to the group; never raises (if the database is away,
        they come back when their ack deadline passes, as unacked messages do)."""
        try:
            await dbthreads.run(
                delivery.release_messages,
                self._principal(),
                s.group,
                [d.receipt for d in deliveries],
            )
        except Exception as exc:
            _log_failed(
                "could not hand back %d messages read ahead for %s of %s (%s); they come back "
                "after their ack deadline",
                len(deliveries),
                s.member_id,
                s.group,
                exc,
                exc=exc,
            )

    async def _hold_ack(
        self, s: Subscription, frame: frames.AckFrame, hold_ms: int, presumed: int = 0
    ) -> None:
        """Keep an ack for the subscription's next push, which settles it in the same database
        call; settled alone after hold_ms if no push comes first.

        Only for a subscriber whose push task does not wait on this ack's credit (credit left,
        or a push under way), or one answered from the read-ahead (presumed: the credit it gave
        already). A subscriber that acks each message as messages keep coming then costs one
        database call per message, not two (docs/benchmarks.md), or one per read-ahead. Acks
        held together are settled in one call, within hold_ms of the first, and each frame
        gets its own answer.
        """
        held = s.held_ack
        if held is not None and held.fits(frame):
            held.acks.append((frame, presumed))
            return
        await self._settle_held(s)
        s.held_ack = HeldAcks([(frame, presumed)])
        s.held_timer = asyncio.get_running_loop().call_later(hold_ms / 1000, self._held_ack_due, s)

    def _held_ack_due(self, s: Subscription) -> None:
        """The hold is up and no push took the ack: settle it alone, or, while messages read
        ahead last, with a read that tops them up (the next acks find them there)."""
        s.held_timer = None
        held = s.take_held_ack()
        if held is not None:
            settle = self._settle_and_read_ahead if s.ahead and not s.reading else self._settle_ack
            self._in_background(settle(s, held, reply=True))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run work beside the frames; the next settlement waits for it (_settle_held)."""
        task = asyncio.get_running_loop().create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _settle_and_read_ahead(self, s: Subscription, held: HeldAcks, reply: bool) -> None:
        """Settle held acks, and read ahead as many messages as the read-ahead lacks, in one
        database call; never raises (the acks are then settled alone, as _settle_ack does)."""
        size = self._read_ahead_for(s, ferry_settings.get("WS_ACK_HOLD_MS"))
        want = max(0, size - len(s.ahead))
        s.reading = True
        try:
            both = await self._ack_then_deliver(
                s, held.receipts, want - held.presumed, ferry_settings.get("WS_PUSH_BATCH")
            )
            s.credit += both.acked.settled - held.presumed
            delivered = both.delivered
            if delivered is not None and delivered.deliveries:
                # There for the next acks before anything awaits.
                self._read_ahead(s, delivered.deliveries)
        except Exception:
            s.reading = False
            await self._settle_ack(s, held, reply)
            return
        finally:
            s.reading = False
        if reply:
            with contextlib.suppress(Exception):
                await self._answer(s, held, both.acked)
        if delivered is None:
            s.wake.set()  # the push task meets what stopped this read
            return
        if delivered.generation != s.generation:
            s.seen_generation = delivered.generation
            s.wake.set()
        with contextlib.suppress(Exception):
            await self._push_ahead(s)

    async def _settle_held(self, s: Subscription, reply: bool = True) -> None:
        """Settle the held ack of s alone, if it has one, and answer it; return once no held
        ack of this connection is being settled any more (by a push of s, or by a timer), so
        that what comes next is applied after it."""
        held = s.take_held_ack()
        if held is not None:
            await self._settle_ack(s, held, reply)
            return
        if s.acking is not None:
            await s.acking.wait()
        if self.background:
            await asyncio.wait(list(self.background))

    async def _settle_ack(self, s: Subscription, held: HeldAcks, reply: bool) -> None:
        """Settle held acks alone and answer them; never raises (an error is answered as the
        ack's own would have been)."""
        try:
            result = await _write(
                len(held.receipts), delivery.ack_messages, self._principal(), s.group, held.receipts
            )
        except Exception as exc:
            if isinstance(exc, errors.BrokerError) and len(held.acks) > 1:
                await self._settle_each(s, held, reply)
                return
            s.credit -= held.presumed
            if reply:
                failure = exc if isinstance(exc, errors.BrokerError) else _failure(exc, "ack")
                await self._refuse(s, held, failure)
            return
        s.credit += result.settled - held.presumed
        if not s.drained or s.ahead:
            s.wake.set()
        if reply:
            # Settled whatever happens to the answer (the socket may be closing).
            with contextlib.suppress(Exception):
                await self._answer(s, held, result)

    async def on_nack(self, frame: frames.NackFrame) -> None:
        await self._settle(
            frame, "nacked", delivery.nack_messages, error=frame.error, delay_ms=frame.delay_ms
        )

    async def on_reject(self, frame: frames.RejectFrame) -> None:
        await self._settle(frame, "rejected", delivery.reject_messages, error=frame.error)

    async def on_extend(self, frame: frames.ExtendFrame) -> None:
        await self._settle(frame, "extended", delivery.extend_deadlines, frame.extend_ms)

    async def on_credit(self, frame: frames.CreditFrame) -> None:
        s = self._sub(frame.sub)
        s.credit += frame.n
        s.window += frame.n
        s.wake.set()
        await self._send_frame(
            {"type": "credited", "ref": frame.ref, "sub": s.sub, "credit": s.credit}
        )

    async def on_publish(self, frame: frames.PublishFrame) -> None:
        results = await groupcommit.append_messages(
            self._principal(), frame.topic, frame.to_new_messages()
        )
        await self._send_frame(
            {
                "type": "published",
                "ref": frame.ref,
                "results": [wire.append_out(r) for r in results],
            }
        )

    # Transactions: one core call each, on a database thread; answered in the order received.

    async def on_begin(self, frame: frames.BeginFrame) -> None:
        info = await transactions.call_async(
            transactions.begin_transaction,
            self._principal(),
            frame.producer_id,
            frame.timeout_ms,
            frame.check_url,
            frame.topic,
            _first_messages(frame),
        )
        await self._send_frame({"type": "begun", "ref": frame.ref, "transaction": _txn_out(info)})

    async def on_add(self, frame: frames.AddFrame) -> None:
        info = await transactions.call_async(
            transactions.add_messages,
            self._principal(),
            frame.transaction,
            frame.topic,
            frame.to_new_messages(),
        )
        await self._send_frame({"type": "added", "ref": frame.ref, "transaction": _txn_out(info)})

    async def on_commit(self, frame: frames.CommitFrame) -> None:
        result = await transactions.call_async(
            transactions.commit_transaction, self._principal(), frame.transaction
        )
        await self._send_frame(
            {
                "type": "committed",
                "ref": frame.ref,
                "transaction": _txn_out(result.transaction),
                "results": [{"topic": t, **wire.append_out(r)} for t, r in result.results],
            }
        )

    async def on_rollback(self, frame: frames.RollbackFrame) -> None:
        info = await dbthreads.run(
            transactions.rollback_transaction, self._principal(), frame.transaction
        )
        await self._send_frame(
            {"type": "rolled_back", "ref": frame.ref, "transaction": _txn_out(info)}
        )

    def _host(self) -> str:
        """Where this connection comes from, as the members' `host` shows it."""
        client = self.scope.get("client")
        return f"websocket {client[0]}" if client else "websocket"

    def _principal(self) -> Principal:
        if self.principal is None:
            raise errors.Unauthenticated()
        return self.principal

    def _sub(self, sub: str) -> Subscription:
        s = self.subs.get(sub)
        if s is None:
            raise SubscriptionNotFound(sub=sub)
        return s

    # Channel-layer events: wake-ups only; the push task reads the database itself.

    async def ferry_messages_appended(self, event: dict[str, Any]) -> None:
        if not events.from_here(event):
            self._wake(event["topic_id"])

    async def ferry_messages_returned(self, event: dict[str, Any]) -> None:
        if not events.from_here(event):
            self._wake(event["topic_id"])

    def _woken(self, event: dict[str, Any]) -> None:
        """This process's events, straight from the commit (events.join)."""
        self._wake(event["topic_id"])

    def _wake(self, topic_id: int) -> None:
        for s in self.subs.values():
            if s.topic_id == topic_id:
                s.drained = False
                s.wake.set()

    # The push task of one subscription.

    async def _pump(self, s: Subscription) -> None:
        try:
            await self._push_loop(s)
        except asyncio.CancelledError:
            raise
        except SocketClosed:
            # The client closed while messages were on their way. The disconnect, next,
            # settles its acks and hands the rest back (_leave_all); if it never comes (a
            # client that stops reading holds the connection), this task's heartbeats have
            # ended, and the group expires the member after its session timeout.
            pass
        except errors.BrokerError as exc:
            # The topic went away or the key lost its permission: the subscription ends.
            self.subs.pop(s.sub, None)
            with contextlib.suppress(SocketClosed):
                await self._send_raw(_error(exc, sub=s.sub))
            await self._leave(s)
        except Exception as exc:
            # The database is away (or a bug): the subscription ends, its member leaves or
            # expires, and the client subscribes again after retry_after.
            failure = _failure(exc, f"push task of subscription {s.sub}")
            self.subs.pop(s.sub, None)
            with contextlib.suppress(Exception):
                await self._send_raw(_error(failure, sub=s.sub))
            await self._leave(s)

    async def _leave(self, s: Subscription) -> None:
        """An ended subscription leaves its group at once: its messages go back to the others.

        Before, its member stayed, holding up to prefetch messages in flight until the socket
        closed (issue 9, item 1). Never raises: a member that cannot leave no longer
        heartbeats, and its group expires it after the session timeout.
        """
        if self.principal is not None:
            try:
                await dbthreads.run(membership.leave_group, self.principal, s.group, s.member_id)
            except errors.BrokerError:
                pass  # gone already, or the key may no longer see it: expiry takes it
            except Exception as exc:
                _log_failed(
                    "member %s of %s (subscription %s) could not leave (%s); it expires after "
                    "the session timeout",
                    s.member_id,
                    s.group,
                    s.sub,
                    exc,
                    exc=exc,
                )
        if not any(other.topic_id == s.topic_id for other in self.subs.values()):
            await events.leave(events.topic_group(s.topic_id), self.channel_name)

    async def _push_loop(self, s: Subscription) -> None:
        loop = asyncio.get_running_loop()
        principal = self._principal()
        batch = ferry_settings.get("WS_PUSH_BATCH")
        closed = self.closed
        while not closed.is_set():
            interval = ferry_settings.get("HEARTBEAT_INTERVAL_MS") / 1000
            s.wake.clear()
            if s.ahead:
                await self._push_ahead(s, wake=False)
            # Acks held while messages read ahead wait are settled with the next read, and a
            # read under way for the read-ahead pushes what it brings (and wakes this task).
            if not s.reading and (s.credit > 0 or (s.held_ack is not None and not s.ahead)):
                s.drained = False
                # Taken before the call, so that an ack's delivery meanwhile cannot use it too.
                reserved = min(s.credit, batch)
                s.credit -= reserved
                s.pushing = reserved
                # What this round may push: its credit, and what a held ack settles.
                room = reserved
                held = s.take_held_ack()
                if held is not None:
                    found = await self._ack_and_push(s, held, reserved, batch)
                    if found is None:
                        continue  # no delivery (the ack's error was answered): a round alone
                    result, room = found
                else:
                    try:
                        result = await _write(
                            reserved,
                            delivery.deliver_messages,
                            principal,
                            s.group,
                            s.topic,
                            s.member_id,
                            reserved,
                        )
                    except errors.MemberNotFound:
                        s.credit, s.pushing = s.credit + reserved, 0
                        await self._rejoin(s)
                        continue
                    except BaseException:
                        s.credit, s.pushing = s.credit + reserved, 0
                        raise
                    s.credit, s.pushing = s.credit + reserved - len(result.deliveries), 0
                s.last_beat = loop.time()
                if result.generation != s.generation:
                    await self._heartbeat(s)
                if result.deliveries:
                    if self._read_ahead_for(s, ferry_settings.get("WS_ACK_HOLD_MS")):
                        s.lend(result.deliveries)  # their acks may be answered from the read-ahead
                    await self._push(s, result.deliveries)
                if len(result.deliveries) >= room or result.filtered or result.expired:
                    # The credit ran out before the messages did, or the filter skipped a long
                    # run: keep going. Else everything there was is out: what is appended from
                    # now on sets the wake-up (cleared before this round's read).
                    continue
                # Unless a wake-up came meanwhile, or an ordered partition waits on an ack.
                s.drained = not result.held_back and not s.wake.is_set()
            elif s.seen_generation > s.generation or loop.time() - s.last_beat >= interval:
                await self._heartbeat(s)
            # Wait for a wake-up (messages appended or returned, an ack, a credit frame), or
            # until the next heartbeat is due; while the layer is down, read again soon.
            wait_s = max(0.05, interval - (loop.time() - s.last_beat))
            if not events.layer_up():
                wait_s = min(wait_s, events.wakeup_poll_s())
            await wait_for_event(s.wake, wait_s)

    async def _ack_and_push(
        self, s: Subscription, held: HeldAcks, reserved: int, batch: int
    ) -> tuple[DeliveryResult, int] | None:
        """The push task's delivery with a held ack settled in the same call; answers the ack.

        reserved: the credit the push task took. Returns the delivery and how many it could
        have pushed, or None when there was none: the ack failed (its error is answered, as
        its own frame's would have been, and the subscription goes on), or the ack was settled
        but the delivery met an error, which the push task's next round, alone, meets again.
        """
        s.acking = acking = asyncio.Event()
        try:
            return await self._ack_and_deliver(s, held, reserved, batch)
        finally:
            s.acking = None
            acking.set()

    async def _ack_and_deliver(
        self, s: Subscription, held: HeldAcks, reserved: int, batch: int
    ) -> tuple[DeliveryResult, int] | None:
        # The credit the held acks gave already is not theirs to give again.
        credit = reserved - held.presumed
        try:
            both = await self._ack_then_deliver(s, held.receipts, credit, batch)
        except errors.BrokerError as exc:
            s.credit, s.pushing = s.credit + reserved, 0
            if len(held.acks) > 1:
                await self._settle_each(s, held, reply=True)
                return None
            s.credit -= held.presumed
            await self._send_raw(_error(exc, held.acks[0][0].ref, s.sub))
            return None
        except BaseException as exc:
            s.credit, s.pushing = s.credit + reserved - held.presumed, 0
            if isinstance(exc, Exception):
                # The database is away (or a bug): answered as the acks' own error, and the
                # push task fails as its delivery alone would have.
                await self._refuse(s, held, _failure(exc, "ack"))
            raise
        pushed = both.delivered.deliveries if both.delivered is not None else ()
        s.credit, s.pushing = s.credit + credit + both.acked.settled - len(pushed), 0
        await self._answer(s, held, both.acked)
        if both.delivered is None:
            return None
        return both.delivered, min(batch, credit + both.acked.settled)

    async def _push(self, s: Subscription, deliveries: Sequence[Delivery]) -> None:
        """Send deliveries in `messages` frames of at most FERRY_WS_MAX_FRAME_BYTES each."""
        limit = ferry_settings.get("WS_MAX_FRAME_BYTES")
        rendered = wire.deliveries_out(deliveries)
        whole = orjson.dumps({"type": "messages", "sub": s.sub, "items": rendered})
        if len(whole) <= limit:  # all in one frame, rendered in one call
            await self._send_raw(whole)
            return
        head = b'{"type":"messages","sub":' + orjson.dumps(s.sub) + b',"items":['
        tail = b"]}"
        items: list[bytes] = []
        size = len(head) + len(tail)
        for d, out in zip(deliveries, rendered, strict=True):
            item = orjson.dumps(out)
            if len(head) + len(item) + len(tail) > limit:
                # Only a message whose headers JSON-escape to several times their size can get
                # here (max_message_bytes_ceiling leaves room for the rest): say which one.
                exc = PushTooLarge(
                    partition=d.message.partition,
                    offset=d.message.offset,
                    receipt=d.receipt or None,
                    size=len(item),
                    limit=limit,
                )
                await self._send_raw(_error(exc, sub=s.sub))
                continue
            if items and size + 1 + len(item) > limit:
                await self._send_raw(head + b",".join(items) + tail)
                items, size = [], len(head) + len(tail)
            size += len(item) + (1 if items else 0)
            items.append(item)
        if items:
            await self._send_raw(head + b",".join(items) + tail)

    async def _heartbeat(self, s: Subscription) -> None:
        try:
            info = await dbthreads.run(
                membership.heartbeat, self._principal(), s.group, s.member_id
            )
        except errors.MemberNotFound:
            await self._rejoin(s)
            return
        s.last_beat = asyncio.get_running_loop().time()
        await self._assigned(s, info)

    async def _rejoin(self, s: Subscription) -> None:
        # Expired (the process stalled past the session timeout): join again under the same id.
        # What it read ahead went back to the group with the rest of its messages.
        s.drop_ahead()
        info = await dbthreads.run(
            functools.partial(
                membership.join_group,
                self._principal(),
                s.group,
                s.topic,
                s.member_id,
                client=s.client,
                host=self._host(),
            )
        )
        await self._assigned(s, info)

    async def _assigned(self, s: Subscription, info: MemberInfo) -> None:
        s.seen_generation = 0  # learnt (a group made again starts its generations over)
        if (info.generation, info.partitions) == (s.generation, s.partitions):
            return
        s.drained = False  # partitions it has not read yet
        s.generation, s.partitions = info.generation, info.partitions
        await self._send_frame(
            {
                "type": "assigned",
                "sub": s.sub,
                "generation": s.generation,
                "partitions": list(s.partitions),
            }
        )


async def _write(size: int | None, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a database thread, or on the loop's own (dbthreads.run_here) when it settles
    or delivers at most FERRY_WS_LOOP_CALL_MESSAGES messages (size; None: not a push or ack): a
    larger call would hold the loop too long."""
    limit = ferry_settings.get("WS_LOOP_CALL_MESSAGES")
    if size is not None and limit > 0 and size <= limit:
        return await dbthreads.run_here(fn, *args)
    return await dbthreads.run(fn, *args)


def _settled(name: str, ref: frames.Ref, sub: str, result: SettleResult) -> dict[str, Any]:
    """The answer to a settlement frame (acked, nacked, rejected, extended)."""
    return {
        "type": name,
        "ref": ref,
        "sub": sub,
        "settled": result.settled,
        "stale": list(result.stale),
        "dead_lettered": result.dead_lettered,
    }


def _first_messages(frame: frames.BeginFrame) -> list[NewMessage]:
    """A begin frame's messages as the core's; a bad one is an invalid_frame error."""
    try:
        return schemas.new_messages(frame.messages or [])
    except ValueError as exc:
        raise InvalidFrame(f"Invalid begin frame: {exc}") from None


def _txn_out(info: TransactionInfo) -> dict[str, Any]:
    """A transaction as REST's TransactionOut has it."""
    out = dataclasses.asdict(info)
    out["topics"] = list(info.topics)
    out["check_url"] = info.check_url or None
    return out


Handler = Callable[[BrokerConsumer, Any], Awaitable[None]]
HANDLERS: dict[str, Handler] = {
    "auth": BrokerConsumer.on_auth,
    "ping": BrokerConsumer.on_ping,
    "subscribe": BrokerConsumer.on_subscribe,
    "unsubscribe": BrokerConsumer.on_unsubscribe,
    "ack": BrokerConsumer.on_ack,
    "nack": BrokerConsumer.on_nack,
    "reject": BrokerConsumer.on_reject,
    "extend": BrokerConsumer.on_extend,
    "credit": BrokerConsumer.on_credit,
    "publish": BrokerConsumer.on_publish,
    "begin": BrokerConsumer.on_begin,
    "add": BrokerConsumer.on_add,
    "commit": BrokerConsumer.on_commit,
    "rollback": BrokerConsumer.on_rollback,
}
assert set(HANDLERS) == frames.TYPES, "every client frame type has one handler"  # noqa: S101
