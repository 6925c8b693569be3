"""scripts/haproxy's own answers are Ferry's JSON error body, never HAProxy's HTML page
(docs/operations.md#load-balancer): 503 `unavailable` with retry_after when no process is up,
502 `broker_error` when a process ends the connection without a whole answer; and a request
that got no answer is sent again, its body waited for."""

import re
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import httpx
import pytest

from ferry_client import FerryError
from tests.integration.conftest import balancer, free_port

pytestmark = pytest.mark.integration


def ferry_error(answer: httpx.Response) -> FerryError:
    assert answer.headers["content-type"] == "application/json", answer.text[:300]
    return FerryError.from_body(answer.json(), answer.status_code)


def test_no_process_up__503_unavailable_that_clients_wait_out():
    with balancer(f"127.0.0.1:{free_port()}") as url:  # nothing listens there
        answer = httpx.post(
            f"{url}/api/v1/topics/t/messages", json={"messages": [{"value": 1}]}, timeout=30
        )
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    error = ferry_error(answer)
    # What ferry_client waits out without counting a retry, as a broker without its database.
    assert error.code == "unavailable"
    assert error.detail == {"dependency": "broker", "retry_after": 1, "source": "load_balancer"}


class FakeProcess(socketserver.BaseRequestHandler):
    """A process that passes HAProxy's health check and hands each other request's body to
    answer(), once it has read the whole request."""

    def handle(self) -> None:
        self.request.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
        if data.startswith(b"GET /api/v1/health "):
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return
        head, _, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        while length is not None and len(body) < int(length[1]):
            chunk = self.request.recv(4096)
            if not chunk:
                return
            body += chunk
        self.answer(body)

    def answer(self, body: bytes) -> None:
        """Nothing: the connection ends unanswered (as a process killed in the middle of a
        request would end it)."""


@contextmanager
def behind_balancer(handler: type[FakeProcess]) -> Iterator[str]:
    """A fake process with this handler, scripts/haproxy in front of it: the balancer's URL."""
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as fake:
        fake.daemon_threads = True
        threading.Thread(target=fake.serve_forever, daemon=True).start()
        try:
            with balancer(f"127.0.0.1:{fake.server_address[1]}") as url:
                yield url
        finally:
            fake.shutdown()


def test_a_process_that_ends_without_an_answer__502_broker_error():
    with behind_balancer(FakeProcess) as url:
        answer = httpx.get(f"{url}/api/v1/topics", timeout=30)
    assert answer.status_code == 502
    error = ferry_error(answer)
    assert error.code == "broker_error"
    assert error.detail == {"source": "load_balancer"}
    assert "Retrying is safe with message ids" in error.message


class ClosesTheFirstRequest(FakeProcess):
    """A process that ends the first request it is sent unanswered, as a stopping Daphne ends
    a kept-alive connection as the request goes out, and answers each one after it."""

    seen: ClassVar[list[bytes]] = []

    def answer(self, body: bytes) -> None:
        self.seen.append(body)
        if len(self.seen) > 1:
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")


def test_a_request_whose_body_comes_after_its_head__sent_again_when_unanswered():
    """HAProxy retries a request that got no answer only when it had the whole request before
    it sent any (a copy to send again); `option http-buffer-request` waits for the body. httpx
    and most clients write the head and the body apart, so a produce's body often comes later."""
    ClosesTheFirstRequest.seen = []
    with behind_balancer(ClosesTheFirstRequest) as url:
        host, port = url.removeprefix("http://").split(":")
        body = b'{"messages": [{"value": 1}]}'
        with socket.create_connection((host, int(port)), timeout=30) as client:
            client.sendall(
                b"POST /api/v1/topics/t/messages HTTP/1.1\r\nHost: broker\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)
            )
            time.sleep(0.3)  # the head reaches HAProxy alone
            client.sendall(body)
            answer = client.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert ClosesTheFirstRequest.seen == [body, body]
