"""Production wiring with a real Redis: the channel layer across Daphne processes, and Celery."""

import subprocess
import sys
import threading
import time

import httpx
import orjson
import pytest
from celery import Celery

from broker import models
from broker.core import log
from broker.core.records import NewMessage
from tests.integration.conftest import ROOT, server_env, start_daphne, stop

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
WAIT_S = 30


def wait_until(condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_long_poll__woken_by_a_produce_on_another_process(redis_url, key_factory, topic_factory):
    topic = topic_factory()
    _, secret = key_factory("admin:*")
    headers = {"Authorization": f"Bearer {secret}"}
    a, url_a = start_daphne(REDIS_URL=redis_url)
    b, url_b = start_daphne(REDIS_URL=redis_url)
    try:

        def produce_on_a():
            time.sleep(0.7)
            httpx.post(
                f"{url_a}/api/v1/topics/{topic.name}/messages",
                json={"messages": [{"value": "from A"}]},
                headers=headers,
            ).raise_for_status()

        producer = threading.Thread(target=produce_on_a)
        producer.start()
        started = time.monotonic()
        response = httpx.get(
            f"{url_b}/api/v1/topics/{topic.name}/partitions/0/messages",
            params={"offset": 0, "max_wait_ms": 15_000},
            headers=headers,
            timeout=30,
        )
        elapsed = time.monotonic() - started
        producer.join()
    finally:
        stop(a)
        stop(b)
    assert [m["value"] for m in response.json()["messages"]] == ["from A"]
    # Woken by A's commit through Redis, long before B's own 15 s deadline.
    assert 0.6 < elapsed < 5, elapsed


def test_long_poll__times_out_then_wakes_again_on_redis(redis_url, key_factory, topic_factory):
    """A long poll that ran out of time leaves the Redis layer fit for the next one."""
    topic = topic_factory()
    _, secret = key_factory("admin:*")
    headers = {"Authorization": f"Bearer {secret}"}
    server, url = start_daphne(REDIS_URL=redis_url)
    fetch_url = f"{url}/api/v1/topics/{topic.name}/partitions/0/messages"
    try:
        started = time.monotonic()
        empty = httpx.get(fetch_url, params={"offset": 0, "max_wait_ms": 500}, headers=headers)
        assert empty.json()["messages"] == []
        assert time.monotonic() - started >= 0.45

        def produce_later():
            time.sleep(0.5)
            httpx.post(
                f"{url}/api/v1/topics/{topic.name}/messages",
                json={"messages": [{"value": 1}]},
                headers=headers,
            ).raise_for_status()

        producer = threading.Thread(target=produce_later)
        producer.start()
        started = time.monotonic()
        woken = httpx.get(
            fetch_url, params={"offset": 0, "max_wait_ms": 15_000}, headers=headers, timeout=30
        )
        elapsed = time.monotonic() - started
        producer.join()
    finally:
        stop(server)
    assert [m["value"] for m in woken.json()["messages"]] == [1]
    assert elapsed < 5, elapsed


def start_worker(redis_url, schedule_dir, *args, **env):
    """A Celery worker (with -B, also beat) on this run's database and Redis."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "mqsite",
            "worker",
            "--pool=solo",
            "--loglevel=WARNING",
            "-s",
            str(schedule_dir / "beat-schedule"),
            *args,
        ],
        cwd=ROOT,
        env=server_env(REDIS_URL=redis_url, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_celery_beat__runs_the_periodic_table(redis_url, topic_factory, console, tmp_path):
    topic = topic_factory(retention_ms=1000)
    log.append_messages(console, topic.name, [NewMessage(orjson.dumps(i)) for i in range(5)])
    models.Message.objects.update(timestamp_ms=1)
    worker = start_worker(redis_url, tmp_path, "-B", FERRY_RETENTION_INTERVAL_SECONDS="0.5")
    try:
        wait_until(
            lambda: models.Partition.objects.get(topic__name=topic.name).start_offset == 5,
            "beat to schedule apply_retention on the worker",
        )
    finally:
        stop(worker)
    assert not models.Message.objects.filter(partition__topic__name=topic.name).exists()


def test_celery_worker__runs_a_task_sent_through_redis(redis_url, topic_factory, console, tmp_path):
    topic = topic_factory()
    log.append_messages(console, topic.name, [NewMessage(b"1", client_id="old")])
    models.ProducedId.objects.update(created_ms=0)
    worker = start_worker(redis_url, tmp_path)
    sender = Celery(broker=redis_url)
    try:
        sender.send_task("broker.run_periodic_job", args=("purge_produced_ids",))
        wait_until(
            lambda: not models.ProducedId.objects.exists(), "the worker to purge produced ids"
        )
    finally:
        sender.close()
        stop(worker)
