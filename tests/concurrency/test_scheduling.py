"""Delayed messages are released exactly once by concurrent schedulers and across restarts."""

import threading

import orjson
import pytest

from broker import models
from broker.core import keys, log, scheduling
from broker.core.records import NewMessage
from tests.concurrency.test_offsets import assert_gapless, collect, run_threads, start_workers

pytestmark = pytest.mark.django_db(transaction=True)


def schedule(topic_name, count):
    for start in range(0, count, 100):
        log.append_messages(
            keys.CONSOLE,
            topic_name,
            [
                NewMessage(orjson.dumps(i), delay_ms=60_000, client_id=f"m{i}")
                for i in range(start, min(count, start + 100))
            ],
        )
    models.ScheduledMessage.objects.update(due_ms=0)


def released_values(topic_name):
    rows = models.Message.objects.filter(partition__topic__name=topic_name)
    return sorted(orjson.loads(bytes(v)) for v in rows.values_list("value", flat=True))


def test_release_due__two_schedulers_release_each_message_once(topic_factory):
    topic = topic_factory(partitions=3)
    schedule(topic.name, 600)
    released = []
    lock = threading.Lock()

    def scheduler(n):
        for _ in range(6):
            count = scheduling.release_due(batch_size=25)
            with lock:
                released.append(count)

    procs = start_workers(("release", "25", "6"))
    run_threads(scheduler, 2)
    released += [n for out in collect(procs) for n in out]
    assert sum(released) == 600
    assert released_values(topic.name) == list(range(600))
    assert not models.ScheduledMessage.objects.exists()
    assert_gapless(topic.name)


def test_release_due__after_a_restart_in_another_process(topic_factory):
    topic = topic_factory()
    schedule(topic.name, 50)
    # This process stops without releasing; a new scheduler process finds the messages.
    [rounds] = collect(start_workers(("release", "1000", "2")))
    assert rounds == [50, 0]
    assert released_values(topic.name) == list(range(50))
