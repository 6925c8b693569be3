"""WebSocket limits and close codes against a real Daphne (docs/websocket.md#limits).

Channels' in-memory communicator enforces neither Daphne's frame limit nor Autobahn's rules on
close codes, so these run against a Daphne process started as scripts/run starts it.
"""

import base64
import time

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from broker import consumers, models
from broker import settings as ferry_settings
from broker.core import keys
from tests.integration.conftest import start_daphne, stop
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
