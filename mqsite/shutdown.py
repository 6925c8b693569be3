"""How a server stops: on SIGTERM or SIGINT it drains within FERRY_SHUTDOWN_TIMEOUT_SECONDS.

See docs/operations.md#shutdown. Under Daphne, the reactor's "before shutdown" step (Daphne's
Server.kill_all_applications, which cancelled every application at once and, in daphne 4.2,
failed with a KeyError) becomes drain():

1. it stops listening: new connections are refused;
2. a request begun on a kept-alive connection from now on gets 503 `unavailable` (Connection:
   close), and idle kept-alive connections are closed; requests begun before, their bodies
   still arriving included, are served, with Connection: close when their answer has not
   begun (so a load balancer sends its next request elsewhere, not here to be refused);
3. waiting long polls answer now with what they find (core/events.py stop_waiting);
4. each WebSocket gets `closing`, its members leave their groups, so their unacked messages are
   deliverable to the rest of the group at once, and it closes with 4503 (broker/consumers.py);
5. requests in flight finish, until the timeout;
6. the background jobs and the heartbeat stop after their round.

Whatever is still running at the timeout is cancelled, and the process exits. Open transactions
are left alone: the check-back resolves them (docs/transactions.md). A second signal exits at
once. REST members are not told: they expire after their session timeout.
"""

import asyncio
import contextlib
import logging
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import orjson

from broker import background, consumers
from broker import settings as ferry_settings
from broker.core import events
from mqsite import serving

logger = logging.getLogger(__name__)

POLL_S = 0.05
# Daphne's HTTP channels (the protocol each connection has until a WebSocket upgrade), and the
# ports it listens on.
_channels: "weakref.WeakSet[Any]" = weakref.WeakSet()
_ports: list[Any] = []
_stopping = False


def stopping() -> bool:
    """Whether this process is shutting down."""
    return _stopping


def timeout_s() -> float:
    return float(ferry_settings.get("SHUTDOWN_TIMEOUT_SECONDS"))


def hook_daphne() -> None:
    """Under Daphne, make the reactor's shutdown the graceful drain() (see the module's doc)."""
    if not serving.under_daphne():
        return
    from daphne import http_protocol, server  # type: ignore[import-untyped]
    from twisted.web import http as twisted_http

    listen_success = server.Server.listen_success

    def remember_port(self: Any, port: Any) -> Any:
        _ports.append(port)
        return listen_success(self, port)

    server.Server.listen_success = remember_port

    build_protocol = http_protocol.HTTPFactory.buildProtocol

    def tracked_protocol(self: Any, addr: Any) -> Any:
        protocol = build_protocol(self, addr)
        _channels.add(protocol)
        return protocol

    http_protocol.HTTPFactory.buildProtocol = tracked_protocol

    init = http_protocol.WebRequest.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # Twisted makes a request at its first line: one begun while stopping is refused.
        self.begun_while_stopping = _stopping
        init(self, *args, **kwargs)

    http_protocol.WebRequest.__init__ = __init__
    process = http_protocol.WebRequest.process

    def process_unless_stopping(self: Any) -> Any:
        if self.begun_while_stopping:
            return _refuse(self)
        return process(self)

    http_protocol.WebRequest.process = process_unless_stopping
    check_persistence = twisted_http.HTTPChannel.checkPersistence

    def close_after_if_stopping(self: Any, request: Any, version: bytes) -> bool:
        # A request whose headers end after the drain began: its answer says Connection: close.
        persistent = check_persistence(self, request, version)
        if _stopping:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
        return bool(persistent)

    channel = twisted_http.HTTPChannel
    channel.checkPersistence = close_after_if_stopping  # type: ignore[method-assign]
    server.Server.kill_all_applications = _graceful_stop


def _graceful_stop(server: Any) -> Any:
    """The reactor's "before shutdown" step: drain(), then cancel what is left."""
    from twisted.internet import defer

    drained = defer.Deferred.fromFuture(asyncio.ensure_future(drain(server)))
    drained.addErrback(lambda failure: logger.error("shutdown: %s", failure.getErrorMessage()))
    drained.addCallback(lambda _: _cancel_remaining(server))
    return drained


async def drain(server: Any) -> None:
    """Stop accepting, end long polls, close WebSockets, let requests finish: within the timeout."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    loop = asyncio.get_running_loop()
    limit_s = timeout_s()
    deadline = loop.time() + limit_s
    _exit_on_second_signal()
    logger.warning("shutting down: draining for at most %g s", limit_s)
    for port in _ports:
        with contextlib.suppress(Exception):
            port.stopListening()
    # Once: a request whose headers end from now on is seen to by close_after_if_stopping.
    _close_after_their_answers()
    await events.stop_waiting()
    websockets = asyncio.ensure_future(consumers.close_all(limit_s))
    while loop.time() < deadline:
        _close_idle_connections()
        if websockets.done() and not _requests_in_flight(server):
            break
        await asyncio.sleep(POLL_S)
    left = _requests_in_flight(server)
    if left:
        logger.warning("shutdown: %d requests still running after %g s; cancelled", left, limit_s)
    await asyncio.to_thread(background.stop, max(0.0, deadline - loop.time()))


def _requests_in_flight(server: Any) -> int:
    from daphne.http_protocol import WebRequest  # type: ignore[import-untyped]

    return sum(
        1
        for protocol, details in list(server.connections.items())
        if isinstance(protocol, WebRequest) and "disconnected" not in details
    )


def _http_channels() -> Iterator[Any]:
    """The HTTP channel of each open connection not upgraded to a WebSocket."""
    for protocol in list(_channels):
        channel = getattr(protocol, "_channel", protocol)
        transport = channel.transport
        if transport is None:
            continue
        # After a WebSocket upgrade the connection's transport drives another protocol: leave
        # it (consumers.close_all ends it).
        driving = getattr(transport, "wrappedProtocol", getattr(transport, "protocol", None))
        if driving is protocol:
            yield channel


def _close_idle_connections() -> None:
    """Close HTTP connections with no request begun and unanswered (kept alive, idle)."""
    for channel in _http_channels():
        # requests: begun (from their first line) and not yet answered.
        if not channel.requests and not channel._handlingRequest:
            channel.transport.loseConnection()


def _close_after_their_answers() -> None:
    """Answers not begun of requests in flight say Connection: close: a client or a load balancer
    then sends its next request on a new connection (elsewhere), not here to be refused."""
    for channel in _http_channels():
        for request in channel.requests:
            if not request.startedWriting:
                request.setHeader(b"connection", b"close")


def _refuse(request: Any) -> None:
    """Answer a request that arrived after the shutdown began: 503 `unavailable`, then close."""
    retry_after = int(ferry_settings.get("RETRY_AFTER_SECONDS"))
    body = orjson.dumps(
        {
            "error": {
                "code": "unavailable",
                "message": "This broker process is shutting down; retry (on another process, "
                f"or after the restart) after {retry_after} s.",
                "detail": {"retry_after": retry_after, "shutting_down": True},
            }
        }
    )
    request.setResponseCode(503)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"retry-after", str(retry_after).encode())
    request.setHeader(b"content-length", str(len(body)).encode())
    request.setHeader(b"connection", b"close")
    request.write(body)
    request.finish()


def _cancel_remaining(server: Any) -> Any:
    """Daphne's kill_all_applications, minus its KeyError: cancel what is left, wait for it."""
    from twisted.internet import defer

    running = [
        details["application_instance"]
        for details in list(server.connections.values())
        if "application_instance" in details and not details["application_instance"].done()
    ]
    for application in running:
        application.cancel()
    if not running:
        return None
    waited = defer.Deferred.fromFuture(asyncio.gather(*running, return_exceptions=True))
    waited.addErrback(lambda _: None)
    return waited


def _exit_on_second_signal() -> None:
    """While draining, a second SIGTERM or SIGINT (Ctrl-C twice) exits at once."""
    if threading.current_thread() is not threading.main_thread():
        return

    def exit_now(signum: int, frame: Any) -> None:
        os.write(2, b"Ferry: second signal, stopping at once\n")
        os._exit(1)

    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(Exception):
            signal.signal(signum, exit_now)
