"""Graceful shutdown of a real Daphne (docs/operations.md#shutdown).

On SIGTERM or SIGINT (Ctrl-C on `make run`, whose scripts/run execs Daphne) a server stops
accepting, lets requests in flight finish, ends long polls with what they find, closes
WebSockets with 4503 after their members left (their messages go to the rest of the group at
once), leaves open transactions to the check-back, and exits within
FERRY_SHUTDOWN_TIMEOUT_SECONDS.
"""

import http.client
import signal
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from broker import models
from broker.core import log
from ferry_client import CheckBackServer
from tests.integration.conftest import ROOT, start_daphne, stop
from tests.integration.test_websocket import open_ws, recv_type, send, subscribe

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def start_slow_produce(url: str, secret: str, topic: str) -> tuple[socket.socket, bytes]:
    """A produce whose headers and half its body are sent: a request in flight. Returns the
    socket and the rest of the body."""
    body = orjson.dumps({"messages": [{"value": "slow"}]})
    head = (
        f"POST /api/v1/topics/{topic}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(address(url), timeout=10)
    half = len(body) // 2
    sock.sendall(head + body[:half])
    return sock, body[half:]


def read_response(reader: Any) -> tuple[int, dict[str, Any], Any]:
    """One HTTP/1.1 response from a connection's buffered reader (sock.makefile("rb")): its
    status, its JSON body and its headers."""
    status = int(reader.readline().split()[1])
    headers = http.client.parse_headers(reader)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int(reader.readline().strip(), 16):
            body += reader.read(size)
            reader.readline()
        reader.readline()
    else:
        body = reader.read(int(headers["content-length"]))
    return status, orjson.loads(body), headers


def refuses_connections(url: str, within_s: float = 5) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(address(url), timeout=1).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_shutdown__request_in_flight_finishes_and_new_connections_are_refused(
    signum, key_factory, topic_factory
):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne()
    try:
        sock, rest = start_slow_produce(url, secret, topic)
        with sock:
            time.sleep(0.3)  # the headers are in: the request is in flight
            started = time.monotonic()
            server.send_signal(signum)
            assert refuses_connections(url)
            assert server.poll() is None  # still draining: the produce is not done
            # The rest of its body, and a second request on the same (kept-alive) connection.
            sock.sendall(rest + b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            reader = sock.makefile("rb")
            status, body, headers = read_response(reader)
            later_status, later, _ = read_response(reader)
            reader.close()
        assert status == 200, body
        assert body["results"][0]["offset"] == 0
        # Its answer tells the client (or a load balancer) to send the next request elsewhere.
        assert headers["connection"] == "close"
        # Begun after the signal: refused with the documented body, nothing done.
        assert later_status == 503, later
        assert later["error"]["code"] == "unavailable"
        assert later["error"]["detail"]["shutting_down"] is True
        assert server.wait(timeout=15) == 0
        assert time.monotonic() - started < 5
    finally:
        stop(server)
    assert models.Message.objects.filter(partition__topic__name=topic).count() == 1


def test_shutdown__long_poll_answers_at_once(key_factory, topic_factory):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne()
    answers: list[httpx.Response] = []

    def poll() -> None:
        answers.append(
            httpx.get(
                f"{url}/api/v1/topics/{topic}/partitions/0/messages",
                params={"offset": 0, "max_wait_ms": 25000},
                headers={"Authorization": f"Bearer {secret}"},
                timeout=30,
            )
        )

    poller = threading.Thread(target=poll)
    try:
        poller.start()
        time.sleep(0.5)  # waiting for messages
        started = time.monotonic()
        server.terminate()
        poller.join(10)
        assert server.wait(timeout=15) == 0
        elapsed = time.monotonic() - started
    finally:
        stop(server)
        poller.join(30)
    (answer,) = answers
    assert answer.status_code == 200
    assert answer.json()["messages"] == []
    assert elapsed < 3, elapsed


def test_shutdown__exits_within_the_timeout(key_factory, topic_factory):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne(FERRY_SHUTDOWN_TIMEOUT_SECONDS="1.5")
    try:
        sock, _rest = start_slow_produce(url, secret, topic)
        with sock:
            time.sleep(0.3)
            started = time.monotonic()
            server.terminate()
            server.wait(timeout=15)  # the body never comes: given up at the timeout
            elapsed = time.monotonic() - started
    finally:
        stop(server)
    assert 1.4 < elapsed < 4, elapsed
    assert not models.Message.objects.exists()


def test_shutdown__a_second_signal_exits_at_once(key_factory, topic_factory):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne()
    try:
        sock, _rest = start_slow_produce(url, secret, topic)
        with sock:
            time.sleep(0.3)
            server.send_signal(signal.SIGINT)
            assert refuses_connections(url)  # draining, waiting for the produce's body
            started = time.monotonic()
            server.send_signal(signal.SIGINT)  # Ctrl-C twice
            assert server.wait(timeout=15) != 0
            assert time.monotonic() - started < 1
    finally:
        stop(server)


def test_shutdown__websocket_members_leave_and_their_messages_go_to_the_group(
    broker_url, key_factory, topic_factory
):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    server, url = start_daphne()
    try:
        with open_ws(url, secret) as ws:
            subscribe(ws, topic, group="g")
            send(ws, {"type": "publish", "topic": topic, "messages": [{"value": "m"}]})
            recv_type(ws, "messages")
            server.terminate()
            recv_type(ws, "closing")
            with pytest.raises(ConnectionClosed) as closed:
                recv_type(ws, "never")
        assert server.wait(timeout=15) == 0
    finally:
        stop(server)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4503
    # Another member (on the session's server) gets it now, not after the 30 s ack deadline.
    auth = {"Authorization": f"Bearer {secret}"}
    started = time.monotonic()
    member = httpx.post(
        f"{broker_url}/api/v1/groups/g/members", json={"topic": topic}, headers=auth
    ).json()
    polled = httpx.post(
        f"{broker_url}/api/v1/groups/g/poll",
        json={"topic": topic, "member_id": member["member_id"], "max_wait_ms": 5000},
        headers=auth,
        timeout=10,
    ).json()
    assert [m["value"] for m in polled["messages"]] == ["m"], polled
    assert time.monotonic() - started < 5


def test_shutdown__open_transaction_is_left_to_the_check_back(key_factory, topic_factory):
    topic = topic_factory().name
    _, secret = key_factory("admin:*")
    auth = {"Authorization": f"Bearer {secret}"}
    with CheckBackServer(lambda request: "commit") as checker:
        server, url = start_daphne()
        try:
            tx = httpx.post(
                f"{url}/api/v1/transactions",
                json={"producer_id": "p", "timeout_ms": 60000, "check_url": checker.url},
                headers=auth,
            ).json()["id"]
            httpx.post(
                f"{url}/api/v1/transactions/{tx}/messages",
                json={"topic": topic, "messages": [{"value": 1}, {"value": 2}]},
                headers=auth,
            ).raise_for_status()
            server.terminate()
            assert server.wait(timeout=15) == 0
        finally:
            stop(server)
        assert models.Transaction.objects.get(id=tx).state == "open"
        assert not models.Message.objects.exists()
        # After the restart, once past its timeout, the check-back commits it.
        server, url = start_daphne(FERRY_BACKGROUND_IN_PROCESS="1")
        try:
            models.Transaction.objects.update(deadline_ms=log.now_ms() - 1)
            deadline = time.monotonic() + 20
            while models.Transaction.objects.get(id=tx).state == "open":
                assert time.monotonic() < deadline, "the check-back did not resolve it"
                time.sleep(0.1)
        finally:
            stop(server)
    assert models.Transaction.objects.get(id=tx).state == "committed"
    assert models.Message.objects.filter(partition__topic__name=topic).count() == 2


def test_make_run__execs_daphne_so_ctrl_c_reaches_it():
    assert "\nexec .venv/bin/daphne " in (ROOT / "scripts" / "run").read_text()
