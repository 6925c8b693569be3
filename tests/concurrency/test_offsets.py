"""Offsets stay contiguous and unique under concurrent producers: threads and processes."""

import os
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest
from django.db import connection, connections

from broker import models
from broker.core import groups, keys, log
from broker.core.records import NewMessage

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


def run_threads(target, count):
    failures = []

    def wrapped(n):
        try:
            target(n)
        except Exception as exc:  # pragma: no cover - surfaced by the assert below
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrapped, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures


def start_workers(*argv_list):
    env = dict(os.environ, FERRY_TEST_DB_NAME=str(connection.settings_dict["NAME"]))
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.concurrency.worker", *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for argv in argv_list
    ]


def collect(procs):
    """Each process's JSON output; every process is reaped even when one failed."""
    try:
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err.decode()
            outputs.append(orjson.loads(out))
        return outputs
    finally:
        for p in procs:
            if p.returncode is None:
                try:
                    p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()


def assert_gapless(topic_name):
    offsets = defaultdict(list)
    rows = models.Message.objects.filter(partition__topic__name=topic_name)
    for number, offset in rows.values_list("partition__number", "offset"):
        offsets[number].append(offset)
    for number, found in offsets.items():
        assert sorted(found) == list(range(len(found))), f"partition {number} has gaps"
    for p in models.Partition.objects.filter(topic__name=topic_name):
        assert p.next_offset == len(offsets[p.number])
    return {n: len(v) for n, v in offsets.items()}


def test_append_messages__threads_and_processes_gapless(topic_factory):
    topic = topic_factory(partitions=3)

    def producer(n):
        for b in range(10):
            log.append_messages(
                keys.CONSOLE,
                topic.name,
                [NewMessage(value=orjson.dumps([n, b, i]), partition=i % 3) for i in range(9)],
            )

    procs = start_workers(*[("produce", topic.name, "10", "30") for _ in range(2)])
    run_threads(producer, 4)
    stored = collect(procs)
    counts = assert_gapless(topic.name)
    assert sum(counts.values()) == 4 * 10 * 9 + 2 * 10 * 30
    returned = [(p, o) for out in stored for p, o, _ in out]
    assert len(set(returned)) == len(returned), "two producers were given the same offset"


def test_append_messages__each_answer_names_its_own_message_and_timestamps_follow_offsets(
    topic_factory,
):
    """Producers in threads and processes, batches over every partition: the place each is told
    holds its own message, and within a partition timestamps never go back as offsets grow (a
    batch is stamped under its partitions' lock)."""
    topic = topic_factory(partitions=3)
    told = {}
    lock = threading.Lock()

    def producer(n):
        for b in range(8):
            batch = [NewMessage(value=orjson.dumps([n, b, i])) for i in range(25)]
            results = log.append_messages(keys.CONSOLE, topic.name, batch)
            with lock:
                for message, r in zip(batch, results, strict=True):
                    told[(r.partition, r.offset)] = message.value

    procs = start_workers(*[("produce", topic.name, "8", "25") for _ in range(2)])
    run_threads(producer, 3)
    collect(procs)
    assert sum(assert_gapless(topic.name).values()) == 5 * 8 * 25
    rows = models.Message.objects.filter(partition__topic__name=topic.name).order_by(
        "partition__number", "offset"
    )
    stamps = defaultdict(list)
    for number, offset, value, stamp in rows.values_list(
        "partition__number", "offset", "value", "timestamp_ms"
    ):
        if (number, offset) in told:
            assert bytes(value) == told[(number, offset)]
        stamps[number].append(stamp)
    assert len(told) == 3 * 8 * 25
    for number, found in stamps.items():
        assert found == sorted(found), f"partition {number}: a timestamp went back"


def test_append_messages__concurrent_retries_store_once(topic_factory):
    topic = topic_factory(partitions=4)
    procs = start_workers(*[("produce", topic.name, "5", "20", "order-") for _ in range(2)])

    def producer(n):
        for b in range(5):
            log.append_messages(
                keys.CONSOLE,
                topic.name,
                [NewMessage(value=b"1", client_id=f"order-{b}-{i}") for i in range(20)],
            )

    run_threads(producer, 3)
    outputs = collect(procs)
    assert models.Message.objects.filter(partition__topic__name=topic.name).count() == 100
    assert_gapless(topic.name)
    # Every producer was told the same place for the same id.
    by_place = Counter((p, o) for out in outputs for p, o, _ in out)
    assert len(by_place) == 100


def test_poll_messages__auto_commit_never_delivers_twice(topic_factory):
    topic = topic_factory(partitions=2)
    log.append_messages(
        keys.CONSOLE, topic.name, [NewMessage(value=b"1", partition=i % 2) for i in range(120)]
    )
    received: list[tuple[int, ...]] = []
    lock = threading.Lock()

    def poller(n):
        for _ in range(10):
            result = groups.poll_messages(keys.CONSOLE, "g", topic.name, 7, auto_commit=True)
            with lock:
                received.extend((m.partition, m.offset) for m in result.messages)

    procs = start_workers(("poll", topic.name, "g", "10"))
    run_threads(poller, 3)
    received += [tuple(x) for out in collect(procs) for x in out]
    assert len(received) == len(set(received)) == 120
