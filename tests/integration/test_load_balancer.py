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


class NamesItself(FakeProcess):
    """A process that answers each request with its own port."""

    def answer(self, body: bytes) -> None:
        name = str(port_of(self.server)).encode()
        self.request.sendall(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (len(name), name)
        )


def port_of(server: socketserver.BaseServer) -> int:
    address = server.server_address
    assert isinstance(address, tuple)
    return int(address[1])


@contextmanager
def processes(count: int) -> Iterator[list[socketserver.ThreadingTCPServer]]:
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    started: list[socketserver.ThreadingTCPServer] = []
    try:
        for _ in range(count):
            fake = socketserver.ThreadingTCPServer(("127.0.0.1", 0), NamesItself)
            fake.daemon_threads = True
            threading.Thread(target=fake.serve_forever, daemon=True).start()
            started.append(fake)
        yield started
    finally:
        for fake in started:
            fake.shutdown()
            fake.server_close()


def test_a_partitions_produces_go_to_one_process__and_to_another_when_it_is_down():
    """docs/operations.md#load-balancer: POST …/partitions/{p}/messages, or the topic's URL
    with the Ferry-Partition-Hint header, picks its process by the topic and p, so that one
    process appends to a partition; a topic's partitions spread over the processes, and a
    process that goes down hands its partitions to the others."""
    with processes(4) as fakes:
        addresses = [f"127.0.0.1:{port_of(fake)}" for fake in fakes]
        with balancer(*addresses) as url, httpx.Client(base_url=url, timeout=30) as client:

            def process_of(topic: str, partition: int) -> str:
                answer = client.post(
                    f"/api/v1/topics/{topic}/partitions/{partition}/messages", content=b"{}"
                )
                assert answer.status_code == 200, answer.text[:300]
                return answer.text

            for topic in ("orders", "payments"):
                picked = [{process_of(topic, p) for _ in range(4)} for p in range(4)]
                assert all(len(each) == 1 for each in picked), picked
                assert len({each.pop() for each in picked}) == 4
            # A keyed produce to the topic's URL naming its partition in the hint header
            # (ferry_client's route_by_partition, docs/client.md#partitions) goes to that
            # partition's process.
            for p in range(4):
                hinted = {
                    client.post(
                        "/api/v1/topics/orders/messages",
                        content=b"{}",
                        headers={"Ferry-Partition-Hint": str(p)},
                    ).text
                    for _ in range(4)
                }
                assert hinted == {process_of("orders", p)}
            # Not pinned: other requests are spread (leastconn, one at a time: round robin),
            # and so is a hint that is not a partition number.
            for headers in ({}, {"Ferry-Partition-Hint": "two"}):
                plain = {
                    client.post(
                        "/api/v1/topics/orders/messages", content=b"{}", headers=headers
                    ).text
                    for _ in range(8)
                }
                assert len(plain) > 1, headers

            gone = process_of("orders", 0)
            stopped = next(f for f in fakes if str(port_of(f)) == gone)
            stopped.shutdown()
            stopped.server_close()
            # Moved at its first refused connection (observe layer4, on-error mark-down): each
            # produce to partition 0 then goes to one other process, the same each time.
            deadline = time.monotonic() + 20
            recent: list[str] = []
            while len(recent) < 5 or len(set(recent[-5:])) > 1:
                assert time.monotonic() < deadline, f"partition 0 did not move: {recent[-5:]}"
                recent.append(process_of("orders", 0))
                time.sleep(0.2)
            assert recent[-1] != gone
