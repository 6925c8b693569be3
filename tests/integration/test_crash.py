"""A killed process loses no acknowledged message and leaves no half-stored batch."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from broker import models
from tests.integration.conftest import ROOT, server_env, start_daphne

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_produce__acknowledged_messages_survive_sigkill(key_factory, topic_factory):
    topic = topic_factory(partitions=2)
    _, secret = key_factory("produce:*")
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
    stored = set(
        models.Message.objects.filter(partition__topic__name=topic.name).values_list(
            "partition__number", "offset"
        )
    )
    assert set(acknowledged) <= stored
    assert len(acknowledged) == 200


def test_append_messages__killed_producer_leaves_whole_batches(topic_factory):
    topic = topic_factory()
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
    partition = models.Partition.objects.get(topic__name=topic.name)
    offsets = list(
        models.Message.objects.filter(partition=partition)
        .order_by("offset")
        .values_list("offset", flat=True)
    )
    # Every batch is one transaction: a kill leaves whole batches, gapless.
    assert offsets == list(range(partition.next_offset))
    assert partition.next_offset % 250 == 0
