"""How a real Daphne serves Ferry: keys out of its log, ALLOWED_HOSTS everywhere, timeouts.

See mqsite/serving.py and docs/architecture.md#serving.
"""

import asyncio
import concurrent.futures
import contextlib
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from tests.integration.conftest import start_daphne, stop

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Short bounds, so the test waits seconds; the defaults are in broker/settings.py.
HEADER_S, BODY_S, IDLE_S = 1.0, 2.0, 2.0
# Daphne checks its timeouts every 2 s; a socket's close takes a moment more.
CHECK_S = 2.5


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker) -> Iterator[tuple[str, Path]]:
    """A Daphne with short timeouts; its URL and the file its output (access log) goes to."""
    with django_db_blocker.unblock():
        proc, url = start_daphne(
            FERRY_HTTP_HEADER_TIMEOUT_SECONDS=str(HEADER_S),
            FERRY_HTTP_BODY_TIMEOUT_SECONDS=str(BODY_S),
            FERRY_HTTP_IDLE_TIMEOUT_SECONDS=str(IDLE_S),
            PYTHONUNBUFFERED="1",
        )
    try:
        yield url, log_of(url)
    finally:
        stop(proc)


def log_of(url: str) -> Path:
    import os
    import tempfile

    port = url.rsplit(":", 1)[1]
    return Path(os.environ.get("FERRY_TEST_DIR", tempfile.gettempdir())) / f"daphne-{port}.log"


def ws_url(url: str, path: str = "/ws/v1/") -> str:
    return url.replace("http://", "ws://") + path


async def ws_session(address: str, auth: str | None = None, **options) -> None:
    async with websockets.connect(address, open_timeout=10, **options) as ws:
        if auth is not None:
            await ws.send(orjson.dumps({"type": "auth", "token": auth}).decode())
            assert orjson.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "authenticated"
        await ws.send('{"type": "ping"}')
        assert orjson.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "pong"


def test_access_log__no_api_key_in_any_line(server, key_factory):
    url, log = server
    _, secret = key_factory("admin:*")
    bearer = {"Authorization": f"Bearer {secret}"}
    # Every way a key travels: the header (REST and WebSocket), the WebSocket's token query
    # parameter, and a key put in a page's query string by hand (the old example-page prefill).
    assert httpx.get(f"{url}/api/v1/topics", headers=bearer).status_code == 200
    assert httpx.get(f"{url}/api/v1/topics", params={"token": secret}).status_code == 401
    assert httpx.get(f"{url}/examples/subscribe/", params={"token": secret}).status_code == 200
    asyncio.run(ws_session(ws_url(url, f"/ws/v1/?token={secret}")))
    asyncio.run(ws_session(ws_url(url), additional_headers=bearer))
    asyncio.run(ws_session(ws_url(url), auth=secret))
    time.sleep(0.5)
    text = log.read_text()
    assert "GET /examples/subscribe/?token=[redacted]" in text
    assert "WSCONNECT /ws/v1/" in text
    assert secret not in text
    assert secret.removeprefix("fry_") not in text


def test_hosts__api_and_websocket_refuse_a_host_not_allowed(server, key_factory):
    url, _ = server
    _, secret = key_factory("admin:*")
    bearer = {"Authorization": f"Bearer {secret}"}
    port = url.rsplit(":", 1)[1]
    for host in ("127.0.0.1", f"localhost:{port}", f"[::1]:{port}"):
        assert (
            httpx.get(f"{url}/api/v1/topics", headers={**bearer, "Host": host}).status_code == 200
        )
    refused = httpx.get(f"{url}/api/v1/topics", headers={**bearer, "Host": "rebound.example"})
    assert refused.status_code == 400
    assert refused.headers["content-type"] == "application/json"
    assert refused.json()["error"]["code"] == "invalid_host"
    assert httpx.get(f"{url}/login/", headers={"Host": "rebound.example"}).status_code == 400
    with pytest.raises(InvalidStatus) as refused_ws:
        asyncio.run(
            ws_session(
                ws_url(url), additional_headers={**bearer, "Host": f"rebound.example:{port}"}
            )
        )
    assert refused_ws.value.response.status_code == 403
    asyncio.run(ws_session(ws_url(url), additional_headers=bearer))


def raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    return s


def closed_after(s: socket.socket, started: float) -> tuple[float, bytes]:
    """Read until the server closes; how long after started it did, and what it sent."""
    got = b""
    with s:
        while chunk := s.recv(65536):
            got += chunk
    return time.monotonic() - started, got


def test_timeouts__stalled_and_idle_clients_are_closed(server):
    url, _ = server
    started = time.monotonic()
    half_headers = raw(url)
    half_headers.sendall(b"POST /api/v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    half_body = raw(url)
    half_body.sendall(
        b"POST /api/v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"name": '
    )
    idle = raw(url)
    idle.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        closes = [pool.submit(closed_after, s, started) for s in (half_headers, half_body, idle)]
        # Stalled clients do not hold the server: others are served meanwhile, at once.
        t0 = time.monotonic()
        assert httpx.get(f"{url}/api/v1/health", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 1
        # One byte at a time resets the idle timeout, not the header bound: 408, then closed.
        trickle = raw(url)
        trickle_started = time.monotonic()
        with contextlib.suppress(OSError):
            for byte in b"GET /api/v1/health HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                if select.select([trickle], [], [], 0.2)[0]:
                    break  # the server answered: stop sending, read what it said
                trickle.sendall(bytes([byte]))
        waited, answer = closed_after(trickle, trickle_started)
        assert waited < HEADER_S + CHECK_S
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"request_timeout" in answer
        # Silent mid-request: closed by the header or body bound, or the idle timeout first.
        (headers_s, _), (body_s, _), (idle_s, answered) = (c.result(30) for c in closes)
    assert headers_s < HEADER_S + CHECK_S
    assert body_s < BODY_S + CHECK_S
    assert answered.startswith(b"HTTP/1.1 200")  # answered, then closed once idle
    assert idle_s < IDLE_S + CHECK_S
