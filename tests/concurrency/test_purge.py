"""Purging a topic and deleting a group while producers append: offsets stay gapless."""

import contextlib
import threading

import orjson
import pytest

from broker import models
from broker.core import errors, groups, keys, log, membership
from broker.core.records import NewMessage
from tests.concurrency.test_offsets import run_threads

pytestmark = pytest.mark.django_db(transaction=True)

PRODUCERS = 3
BATCHES = 15


def test_purge_topic__under_producers_keeps_offsets_gapless(topic_factory):
    topic = topic_factory(partitions=2).name
    assigned: list[tuple[int, int]] = []
    lock = threading.Lock()
    removed: list[int] = []

    def work(n: int) -> None:
        if n == PRODUCERS:
            for _ in range(5):
                removed.append(log.purge_topic(keys.CONSOLE, topic).removed)
            return
        for i in range(BATCHES):
            results = log.append_messages(
                keys.CONSOLE,
                topic,
                [NewMessage(value=orjson.dumps([n, i, j]), partition=j % 2) for j in range(4)],
            )
            with lock:
                assigned.extend((r.partition, r.offset) for r in results)  # type: ignore[misc]

    run_threads(work, PRODUCERS + 1)
    total = PRODUCERS * BATCHES * 4
    for number in (0, 1):
        offsets = sorted(o for p, o in assigned if p == number)
        # Every offset handed out exactly once, none reused after a purge.
        assert offsets == list(range(total // 2))
        p = models.Partition.objects.get(topic__name=topic, number=number)
        stored = sorted(models.Message.objects.filter(partition=p).values_list("offset", flat=True))
        assert p.next_offset == total // 2
        assert stored == list(range(p.start_offset, p.next_offset))
        sizes = models.Message.objects.filter(partition=p).values_list("size_bytes", flat=True)
        assert p.bytes_stored == sum(sizes)
    assert sum(removed) + models.Message.objects.count() == total


def test_delete_group__forced_while_members_poll(topic_factory):
    topic = topic_factory().name
    log.append_messages(keys.CONSOLE, topic, [NewMessage(value=b"1")] * 20)
    membership.join_group(keys.CONSOLE, "g", topic, "m")

    def work(n: int) -> None:
        if n == 0:
            groups.delete_group(keys.CONSOLE, "g", force=True)
            return
        for _ in range(5):
            # A poll racing the delete may be told the group went; it must store nothing.
            with contextlib.suppress(errors.GroupNotFound):
                groups.poll_messages(keys.CONSOLE, "g", topic, 2, True)

    run_threads(work, 3)
    # Polls after the delete make the group anew (auto-created by poll); offsets stay sane.
    for row in models.GroupOffset.objects.select_related("partition"):
        assert 0 <= row.committed_offset <= row.partition.next_offset
