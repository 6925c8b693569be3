"""WebSocket limits and close codes against a real Daphne (docs/websocket.md#limits).

Channels' in-memory communicator enforces neither Daphne's frame limit nor Autobahn's rules on
close codes, so these run against a Daphne process started as scripts/run starts it.
"""

import base64
import os
import socket
import struct
import time

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from broker import consumers, models
from broker import settings as ferry_settings
from broker.core import keys
from tests.integration.conftest import server_log, start_daphne, stop
from tests.integration.test_delivery import wait_until
from tests.integration.test_websocket import open_ws, recv_type, send, subscribe, ws_url

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# A small limit keeps the frames quick to build; the rules are the same at 16 MiB.
FRAME_BYTES = 256 * 1024
CEILING = (FRAME_BYTES - ferry_settings.PUSH_FRAME_OVERHEAD_BYTES) * 3 // 4


@pytest.fixture(scope="module")
def small_frames_url(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        proc, url = start_daphne(FERRY_WS_MAX_FRAME_BYTES=str(FRAME_BYTES))
    try:
        yield url
    finally:
        stop(proc)


def wait_for_members_to_leave(timeout=10):
    """The server leaves the group after the socket closes: let it finish before the flush."""
    deadline = time.monotonic() + timeout
    while models.GroupMember.objects.exists():
        assert time.monotonic() < deadline, "the subscription did not leave its group"
        time.sleep(0.05)


def closed_code(ws, timeout=10):
    deadline = time.monotonic() + timeout
    with pytest.raises(ConnectionClosed) as closed:  # noqa: PT012
        while time.monotonic() < deadline:
            ws.recv(timeout=max(0.01, deadline - time.monotonic()))
    assert closed.value.rcvd is not None, "closed without a close frame"
    return closed.value.rcvd.code


def test_push__a_full_prefetch_is_cut_into_frames_within_the_limit(
    small_frames_url, key_factory, topic_factory
):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    count = 2000
    response = httpx.post(
        f"{small_frames_url}/api/v1/topics/{topic}/messages",
        headers={"Authorization": f"Bearer {secret}"},
        json={"messages": [{"value": "x" * 250} for _ in range(count)]},
        timeout=30,
    )
    assert response.status_code == 200, response.text[:500]
    with connect(
        ws_url(small_frames_url),
        additional_headers={"Authorization": f"Bearer {secret}"},
        max_size=FRAME_BYTES,
    ) as ws:
        subscribe(ws, topic, prefetch=count)
        offsets: list[int] = []
        frames = 0
        while len(offsets) < count:
            raw = ws.recv(timeout=10)
            assert isinstance(raw, str)
            assert len(raw.encode()) <= FRAME_BYTES
            frame = orjson.loads(raw)
            assert frame["type"] == "messages", frame
            frames += 1
            offsets += [m["offset"] for m in frame["items"]]
    wait_for_members_to_leave()
    assert offsets == list(range(count))
    assert frames > 1


def test_push__a_message_of_the_largest_max_message_bytes_is_delivered(
    small_frames_url, key_factory, topic_factory
):
    _, secret = key_factory("admin:*")
    auth = {"Authorization": f"Bearer {secret}"}
    too_big = httpx.post(
        f"{small_frames_url}/api/v1/topics",
        headers=auth,
        json={"name": "big-refused", "max_message_bytes": CEILING + 1},
    )
    assert too_big.status_code == 400, too_big.text
    assert too_big.json()["error"]["detail"]["field"] == "max_message_bytes"
    topic = topic_factory(max_message_bytes=CEILING).name
    key = "k" * 1024
    value = bytes(range(256)) * ((CEILING - len(key)) // 256)
    value += b"\xff" * (CEILING - len(key) - len(value))
    with open_ws(small_frames_url, secret) as producer:
        send(
            producer,
            {
                "type": "publish",
                "ref": 1,
                "topic": topic,
                "messages": [{"value_b64": base64.b64encode(value).decode(), "key": key}],
            },
        )
        assert recv_type(producer, "published")["results"][0]["offset"] == 0
    with connect(ws_url(small_frames_url), additional_headers=auth, max_size=FRAME_BYTES) as ws:
        subscribe(ws, topic)
        (item,) = recv_type(ws, "messages")["items"]
    wait_for_members_to_leave()
    assert base64.b64decode(item["value_b64"]) == value
    assert item["key"] == key


def test_frame_too_large__error_frame_then_close_4413(small_frames_url, key_factory):
    _, secret = key_factory("admin:*")
    with open_ws(small_frames_url, secret) as ws:
        send(ws, {"type": "ping", "ref": 1})
        recv_type(ws, "pong")
        ws.send('{"type": "ping", "pad": "' + "x" * FRAME_BYTES + '"}')
        error = recv_type(ws, "error")
        code = closed_code(ws)
    assert error["error"]["code"] == "frame_too_large"
    assert error["error"]["detail"]["limit"] == FRAME_BYTES
    assert code == consumers.CLOSE_TOO_BIG == 4413


def test_frame_at_the_limit__is_read(small_frames_url, key_factory):
    _, secret = key_factory("admin:*")
    with open_ws(small_frames_url, secret) as ws:
        frame = '{"type": "ping", "ref": 1, "pad": ""}'
        frame = frame.replace('""', '"' + "x" * (FRAME_BYTES - len(frame)) + '"')
        assert len(frame) == FRAME_BYTES
        ws.send(frame)
        # Read as a frame (not refused for its size): pad is not a field of ping.
        assert recv_type(ws, "error")["error"]["code"] == "invalid_frame"


def test_bad_key__close_4401(broker_url):
    with open_ws(broker_url, "fry_not-a-key") as ws:
        error = recv_type(ws, "error")
        code = closed_code(ws)
    assert error["error"]["code"] == "unauthenticated"
    assert code == consumers.CLOSE_UNAUTHENTICATED == 4401


@pytest.mark.parametrize("how", ["header", "auth frame"])
def test_revoked_key__closes_open_sockets_within_a_second(
    broker_url, key_factory, topic_factory, how
):
    topic = topic_factory().name
    principal, secret = key_factory("admin:*")
    with open_ws(broker_url, secret) if how == "header" else connect(ws_url(broker_url)) as ws:
        if how == "auth frame":
            send(ws, {"type": "auth", "token": secret})
            recv_type(ws, "authenticated")
        subscribe(ws, topic)
        send(ws, {"type": "publish", "topic": topic, "messages": [{"value": 1}]})
        recv_type(ws, "messages")
        # Revoked by another process (this one): the server's key cache may hold it a second.
        keys.revoke_api_key(keys.CONSOLE, principal.name)
        revoked = time.monotonic()
        error = recv_type(ws, "error", timeout=5)
        code = closed_code(ws, timeout=5)
        elapsed = time.monotonic() - revoked
    assert error["error"]["code"] == "unauthenticated"
    assert code == consumers.CLOSE_UNAUTHENTICATED
    assert elapsed < 2.5, elapsed
    wait_for_members_to_leave()
    # Its unsettled message went back to the group.
    assert models.InFlight.objects.get().state == "retry_wait"


def test_unsubscribe__always_answers_on_a_real_server(broker_url, key_factory, topic_factory):
    """Issue 9, item 12: about one unsubscribe in 5-10 never answered on PostgreSQL."""
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    with open_ws(broker_url, secret) as ws:
        for n in range(40):
            subscribe(ws, topic)
            # A publish and a credit wake the push task as unsubscribe cancels it.
            send(ws, {"type": "publish", "topic": topic, "messages": [{"value": n}]})
            send(ws, {"type": "credit", "sub": "s", "n": 1})
            send(ws, {"type": "unsubscribe", "ref": n, "sub": "s"})
            assert recv_type(ws, "unsubscribed", timeout=5)["ref"] == n
    wait_for_members_to_leave()


def _client_frame(opcode: int, payload: bytes) -> bytes:
    """One masked client frame (RFC 6455 5.2), payloads under 64 KiB."""
    mask = os.urandom(4)
    size = (
        bytes([0x80 | len(payload)])
        if len(payload) < 126
        else b"\xfe" + struct.pack("!H", len(payload))
    )
    return (
        bytes([0x80 | opcode]) + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    )


def _delivered() -> int:
    runs = models.InFlight.objects.filter(state="delivered")
    return sum(r.last_offset - r.offset + 1 for r in runs)


def test_push_into_a_closing_socket__no_traceback_and_the_messages_go_back(
    key_factory, topic_factory
):
    """A push that meets a socket in its close handshake ends the subscription quietly.

    Autobahn calls a socket closed from the client's close frame on and refuses to send; Daphne
    tells the application only once the TCP connection is gone. A client that reads nothing
    keeps the server's unsent pushes in the buffers, so the connection outlives the close
    frame, and a message published then is pushed into that gap. A CI run logged "push task of
    subscription s failed" with a traceback for it.
    """
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne()
    log = server_log(url)
    try:
        # 16 MiB: more than the two ends' socket buffers on loopback hold (4 MiB and a few KiB).
        for _ in range(4):
            answer = httpx.post(
                f"{url}/api/v1/topics/{topic}/messages",
                headers={"Authorization": f"Bearer {secret}"},
                json={"messages": [{"value": "x" * (256 * 1024)}] * 16},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text[:500]
        with socket.socket() as raw:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.settimeout(10)
            raw.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
            raw.sendall(
                b"GET /ws/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)) + b"\r\n"
                b"Authorization: Bearer " + secret.encode() + b"\r\n\r\n"
            )
            head = b""
            while not head.endswith(b"\r\n\r\n"):  # the answer's head, and not a byte more
                byte = raw.recv(1)
                assert byte, f"the server closed during the handshake: {head!r}"
                head += byte
            assert head.startswith(b"HTTP/1.1 101"), head
            subscribe_frame = {"type": "subscribe", "sub": "s", "topic": topic, "group": "g"}
            raw.sendall(_client_frame(0x1, orjson.dumps(subscribe_frame)))
            wait_until(lambda: _delivered() == 64, "the backlog pushed")
            raw.sendall(_client_frame(0x8, struct.pack("!H", 1000)))
            time.sleep(0.5)  # the server reads the close frame; nothing it sends can leave
            answer = httpx.post(
                f"{url}/api/v1/topics/{topic}/messages",
                headers={"Authorization": f"Bearer {secret}"},
                json={"messages": [{"value": "late"}]},
                timeout=10,
            )
            assert answer.status_code == 200, answer.text
            wait_until(lambda: _delivered() == 65, "the late message pushed")
            time.sleep(0.5)  # what the push task logs, it has logged
            # A reset, not a close: a clean close would wait for the unsent pushes.
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        wait_for_members_to_leave()
    finally:
        stop(server)
    written = log.read_text(errors="replace")
    assert "Traceback" not in written, written[written.find("Traceback") - 300 :][:3000]
    assert "WSDISCONNECT" in written
    assert _delivered() == 0  # all 65 back with the group
