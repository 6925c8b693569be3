"""How the site is served: ALLOWED_HOSTS on every path, and Daphne's timeouts and access log.

See docs/architecture.md#serving. allowed_hosts() wraps the ASGI application; hook_daphne()
adjusts Daphne from inside the application's import (as broker/consumers.py does for frame
limits), so `daphne mqsite.asgi:application` gets them however it is started.
"""

import asyncio
import logging
import re
import sys
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from django.conf import settings
from django.http.request import split_domain_port, validate_host

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover (a platform without its wheel)
    from websockets.utils import apply_mask

from broker import settings as ferry_settings

logger = logging.getLogger(__name__)

AsgiApp = Callable[[Any, Any, Any], Coroutine[Any, Any, None]]
API_PREFIX = "/api/"


def _host(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"host":
            return str(value.decode("latin-1"))
    return None


def host_allowed(host: str) -> bool:
    """Whether Django's ALLOWED_HOSTS (as request.get_host() reads it) accepts this Host."""
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


def allowed_hosts(app: AsgiApp) -> AsgiApp:
    """Refuse a Host header ALLOWED_HOSTS does not name, on every HTTP path and WebSocket.

    Django checks the Host only where a view or CommonMiddleware calls request.get_host(); the
    API and the WebSockets have neither, so a page on another origin could reach a broker on
    loopback through DNS rebinding. A request without a Host header (no browser sends one) is
    let through, as it names no other site.
    """

    async def checked(scope: dict[str, Any], receive: Any, send: Any) -> None:
        host = _host(scope) if scope["type"] in ("http", "websocket") else None
        if host is None or host_allowed(host):
            await app(scope, receive, send)
        elif scope["type"] == "http":
            await _refuse_http(scope, send, host)
        else:
            # Closing before accepting refuses the handshake (Daphne answers 403).
            await receive()
            await send({"type": "websocket.close", "code": 1008})

    return checked


async def _refuse_http(scope: dict[str, Any], send: Any, host: str) -> None:
    if scope["path"].startswith(API_PREFIX):
        body = orjson.dumps(
            {
                "error": {
                    "code": "invalid_host",
                    "message": f"Host {host[:200]!r} is not served here (ALLOWED_HOSTS).",
                    "detail": {"host": host[:200]},
                }
            }
        )
        content_type = b"application/json"
    else:
        body, content_type = b"Bad Request (400)", b"text/plain; charset=utf-8"
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# API keys in an access log line (a URL's query string): Ferry's keys start with fry_.
_KEY_IN_URL = re.compile(
    r"fry_[A-Za-z0-9_\-]+|((?:^|[?&])(?:token|access_token|api_key)=)[^&\s\"]*"
)


def redact(line: str) -> str:
    """line without API keys: a fry_ key, or any token= query value, becomes [redacted]."""
    return _KEY_IN_URL.sub(lambda m: (m.group(1) or "") + "[redacted]", line)


def under_daphne() -> bool:
    """Whether Daphne's server is loaded (its CLI imports it before the application; the
    daphne app in INSTALLED_APPS does too, so tests' processes answer yes)."""
    return "daphne.server" in sys.modules


def started_by_daphne() -> bool:
    """Whether this process is a server started by `daphne` (or `python -m daphne`)."""
    return "daphne.cli" in sys.modules


def hook_daphne() -> None:
    """Under Daphne: keys out of the access log, timeouts for clients that stall, no form parsing,
    and less work a WebSocket frame and a database call (_plain_frame_logs,
    _unmask_with_websockets, _thread_locals_without_exceptions).

    - The access log (NCSA lines Daphne writes for each request) has query-string keys redacted.
    - FERRY_HTTP_IDLE_TIMEOUT_SECONDS: a connection silent that long (before or between
      requests, keep-alive included) is closed (Twisted's idle timeout, 60 s by default).
    - FERRY_HTTP_HEADER_TIMEOUT_SECONDS: a request's line and headers must all arrive within
      this of its first byte, and FERRY_HTTP_BODY_TIMEOUT_SECONDS its body too; else the
      client gets 408 and the connection is closed. A client trickling one byte at a time is
      held no longer than that, whatever the idle timeout.
    """
    if not under_daphne():
        return
    from daphne import access, http_protocol, server  # type: ignore[import-untyped]

    idle_s = float(ferry_settings.get("HTTP_IDLE_TIMEOUT_SECONDS"))
    header_s = float(ferry_settings.get("HTTP_HEADER_TIMEOUT_SECONDS"))
    body_s = float(ferry_settings.get("HTTP_BODY_TIMEOUT_SECONDS"))
    # Channel -> [monotonic time its request began arriving, whether its headers are in].
    receiving: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()

    write_entry = access.AccessLogGenerator.write_entry

    def redacted_entry(self: Any, host: Any, date: Any, request: str, *args: Any, **kw: Any) -> Any:
        return write_entry(self, host, date, redact(request), *args, **kw)

    access.AccessLogGenerator.write_entry = redacted_entry

    build_protocol = http_protocol.HTTPFactory.buildProtocol

    def build_timed_protocol(self: Any, addr: Any) -> Any:
        protocol = build_protocol(self, addr)
        protocol.timeOut = idle_s
        # Twisted wraps the HTTP/1.1 channel in a protocol that may switch to HTTP/2.
        channel = getattr(protocol, "_channel", protocol)
        data_received = channel.dataReceived
        all_headers_received = channel.allHeadersReceived
        connection_lost = channel.connectionLost

        def timed_data(data: bytes) -> None:
            if not channel._handlingRequest and channel not in receiving:
                receiving[channel] = [time.monotonic(), False]
            data_received(data)

        def headers_in() -> None:
            if channel in receiving:
                receiving[channel][1] = True
            all_headers_received()

        def lost(reason: Any) -> None:
            receiving.pop(channel, None)
            connection_lost(reason)

        channel.dataReceived = timed_data
        channel.allHeadersReceived = headers_in
        channel.connectionLost = lost
        return protocol

    http_protocol.HTTPFactory.buildProtocol = build_timed_protocol

    process = http_protocol.WebRequest.process

    def process_received(self: Any) -> Any:
        # The whole request is in: what happens next is the application's (--http-timeout).
        receiving.pop(self.channel, None)
        return process(self)

    http_protocol.WebRequest.process = process_received

    timeout_checker = server.Server.timeout_checker

    def check_receiving(self: Any) -> None:
        now = time.monotonic()
        for channel, (since, headers) in list(receiving.items()):
            limit = body_s if headers else header_s
            if now - since > limit:
                receiving.pop(channel, None)
                _time_out(channel, "body" if headers else "headers", limit)
        timeout_checker(self)

    server.Server.timeout_checker = check_receiving
    _skip_form_parsing()
    _plain_frame_logs()
    _unmask_with_websockets()
    _thread_locals_without_exceptions()


def _skip_form_parsing() -> None:
    """Under Daphne, do not let Twisted parse a POST's Content-Type as a form.

    Twisted's Request parses the Content-Type of every POST with the email package, to fill
    request.args for form bodies, which Daphne never reads: it cost a tenth of the server CPU
    of a single-message produce (docs/benchmarks.md#the-per-message-path).
    """
    from daphne.http_protocol import WebRequest  # type: ignore[import-untyped]

    init = WebRequest.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    WebRequest.__init__ = __init__


def _unstyled(value: Any, *args: Any, **kwargs: Any) -> Any:
    return value


def _plain_frame_logs() -> None:
    """Under Daphne, do not style a debug line for every WebSocket frame autobahn sends or reads.

    autobahn's sendData and dataReceived build the arguments of a debug log line on every
    write and read, whether or not debug is logged: its type and peer, styled in colour with
    click (there because Celery needs it). That is three or four click.style calls each, about
    3 µs, a few percent of the event loop when subscribers take 100-message pushes or
    producers publish one message a frame (docs/benchmarks.md). Its log lines keep their words,
    without the colour.
    """
    from autobahn.twisted import websocket
    from autobahn.websocket import protocol

    # Module globals, which sendData and dataReceived look up at each call.
    for module in (protocol, websocket):
        vars(module).update(hltype=_unstyled, hlval=_unstyled)


class _Unmasker:
    """A client frame's payload unmasked by the `websockets` library's C function.

    autobahn's own masker (a CFFI object, native by default) is built afresh for every frame a
    client sends, with three foreign allocations, and copies the payload twice on the way
    through: 5 % of the event loop when producers publish one message a frame
    (docs/benchmarks.md). This one keeps autobahn's interface: process() takes the payload in
    pieces as they arrive, pointer() counts what it took.
    """

    __slots__ = ("_mask", "_taken")

    def __init__(self, mask: bytes, length: int | None = None) -> None:
        self._mask = bytes(mask)
        self._taken = 0

    def pointer(self) -> int:
        return self._taken

    def reset(self) -> None:
        self._taken = 0

    def process(self, data: bytes) -> bytes:
        # A piece that starts within a 4-byte group starts with the mask turned that far.
        turn = self._taken & 3
        mask = self._mask[turn:] + self._mask[:turn] if turn else self._mask
        self._taken += len(data)
        return apply_mask(data, mask)


def _unmask_with_websockets() -> None:
    """Under Daphne, unmask client frames with _Unmasker."""
    from autobahn.websocket import protocol

    # The module global processData looks up for each frame.
    protocol.create_xor_masker = _Unmasker


def _storage_of(local: Any) -> Any:
    """asgiref's _ThreadCriticalLocal._get_storage, asking for the running loop without an
    exception when there is none."""
    if asyncio._get_running_loop() is None:
        return local._storage  # a thread without a running event loop
    try:
        return local._storage.cvar
    except AttributeError:
        from asgiref.local import _CVar

        local._storage.cvar = _CVar()
        return local._storage.cvar


def _thread_locals_without_exceptions() -> None:
    """Under Daphne, find a thread's database connection without raising an exception.

    Django keeps its connections in asgiref's thread-critical Local, which asks
    asyncio.get_running_loop() at every lookup. Off an event loop, where every database call
    runs (the writer thread, and the loop's own short calls, which hide the loop from Django),
    that raises and catches a RuntimeError: 1.2 of the 3 µs a lookup costs, and Django looks
    the connection up dozens of times a transaction (docs/benchmarks.md). The same answer,
    asked of asyncio._get_running_loop(), which returns None instead.
    """
    from asgiref import local

    local._ThreadCriticalLocal._get_storage = _storage_of  # type: ignore[method-assign]


def _time_out(channel: Any, part: str, limit_s: float) -> None:
    """Answer 408 to a request that did not arrive in time, and close its connection."""
    logger.info("closing a connection: its request %s took over %g s", part, limit_s)
    body = orjson.dumps(
        {
            "error": {
                "code": "request_timeout",
                "message": f"The request's {part} did not arrive within {limit_s:g} s.",
                "detail": {"timeout_s": limit_s},
            }
        }
    )
    transport = channel.transport
    if transport is None:
        return
    transport.write(
        b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    transport.loseConnection()
