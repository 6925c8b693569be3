"""A killed process loses no acknowledged message and leaves no half-stored batch."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from django.db import connection

from broker import models
from tests.integration.conftest import ROOT, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def start_server():
    port = free_port()
    env = dict(os.environ, FERRY_TEST_DB_NAME=str(connection.settings_dict["NAME"]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "mqsite.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api/v1"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("daphne did not start")


def test_produce__acknowledged_messages_survive_sigkill(key_factory, topic_factory):
    topic = topic_factory(partitions=2)
    _, secret = key_factory("produce:*")
    proc, url = start_server()
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
    stored = set(
        models.Message.objects.filter(partition__topic__name=topic.name).values_list(
            "partition__number", "offset"
        )
    )
    assert set(acknowledged) <= stored
    assert len(acknowledged) == 200


def test_append_messages__killed_producer_leaves_whole_batches(topic_factory):
    topic = topic_factory()
    env = dict(os.environ, FERRY_TEST_DB_NAME=str(connection.settings_dict["NAME"]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.concurrency.worker", "produce", topic.name, "100000", "250"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while models.Partition.objects.get(topic__name=topic.name).next_offset < 2000:
        assert time.monotonic() < deadline, "the producer did not get going"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partition = models.Partition.objects.get(topic__name=topic.name)
    offsets = list(
        models.Message.objects.filter(partition=partition)
        .order_by("offset")
        .values_list("offset", flat=True)
    )
    # Every batch is one transaction: a kill leaves whole batches, gapless.
    assert offsets == list(range(partition.next_offset))
    assert partition.next_offset % 250 == 0
