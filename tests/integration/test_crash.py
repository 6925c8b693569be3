"""A killed process loses no acknowledged message and leaves no half-stored batch."""

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from broker import models
from tests.integration.conftest import (
    ROOT,
    other_sessions,
    server_env,
    start_daphne,
    wait_for_sessions_to_end,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_produce__acknowledged_messages_survive_sigkill(key_factory, topic_factory):
    topic = topic_factory(partitions=2)
    _, secret = key_factory("produce:*")
    before = other_sessions()
    proc, base = start_daphne()
    url = f"{base}/api/v1"
    acknowledged = []
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=10) as http:
            for i in range(40):
                response = http.post(
                    f"{url}/topics/{topic.name}/messages",
                    json={"messages": [{"value": [i, j], "key": f"k{j}"} for j in range(5)]},
                )
                assert response.status_code == 200
                acknowledged += [(r["partition"], r["offset"]) for r in response.json()["results"]]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_for_sessions_to_end(before)
    stored = set(
        models.Message.objects.filter(partition__topic__name=topic.name).values_list(
            "partition__number", "offset"
        )
    )
    assert set(acknowledged) <= stored
    assert len(acknowledged) == 200


def test_append_messages__killed_producer_leaves_whole_batches(topic_factory):
    topic = topic_factory()
    before = other_sessions()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.concurrency.worker", "produce", topic.name, "100000", "250"],
        cwd=ROOT,
        env=server_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while models.Partition.objects.get(topic__name=topic.name).next_offset < 2000:
        assert time.monotonic() < deadline, "the producer did not get going"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for_sessions_to_end(before)
    partition = models.Partition.objects.get(topic__name=topic.name)
    offsets = list(
        models.Message.objects.filter(partition=partition)
        .order_by("offset")
        .values_list("offset", flat=True)
    )
    # Every batch is one transaction: a kill leaves whole batches, gapless.
    assert offsets == list(range(partition.next_offset))
    assert partition.next_offset % 250 == 0


def test_publish__pipelined_frames_survive_sigkill_whole(key_factory, topic_factory):
    """Publishes sharing commits (group commit): every answered one is stored, none in part."""
    topic = topic_factory(partitions=2)
    _, secret = key_factory("produce:*")
    before = other_sessions()
    proc, base = start_daphne()
    answered: list[dict] = []
    url = base.replace("http://", "ws://") + "/ws/v1/"
    try:
        with connect(url, additional_headers={"Authorization": f"Bearer {secret}"}) as ws:

            def read_answers():
                try:
                    while True:
                        frame = orjson.loads(ws.recv(timeout=10))
                        if frame["type"] == "published":
                            answered.append(frame)
                except (ConnectionClosed, TimeoutError):
                    return  # the server was killed

            reader = threading.Thread(target=read_answers)
            reader.start()
            # Many frames in flight, three messages each; the kill lands mid-stream.
            for i in range(300):
                messages = [{"value": [i, j], "key": f"k{j}"} for j in range(3)]
                frame = {"type": "publish", "ref": i, "topic": topic.name, "messages": messages}
                ws.send(orjson.dumps(frame).decode())
            deadline = time.monotonic() + 10
            while len(answered) < 50:
                assert time.monotonic() < deadline, "no publish was answered"
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
            reader.join(timeout=15)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_for_sessions_to_end(before)
    stored = list(
        models.Message.objects.filter(partition__topic__name=topic.name).values_list(
            "partition__number", "offset", "value"
        )
    )
    places = {(p, o) for p, o, _ in stored}
    for frame in answered:
        assert {(r["partition"], r["offset"]) for r in frame["results"]} <= places
    by_frame: dict[int, int] = {}
    for _, _, value in stored:
        i, _j = orjson.loads(bytes(value))
        by_frame[i] = by_frame.get(i, 0) + 1
    assert set(by_frame.values()) == {3}, "a publish was stored in part"
    assert len(by_frame) >= len(answered) >= 50
