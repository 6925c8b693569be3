"""What a process keeps of its own appends (log/recent.py), and deliveries that take it."""

import orjson
import pytest

from broker import models
from broker.core import bulk, delivery, log, membership
from broker.core.log import recent
from broker.core.records import NewMessage


@pytest.fixture(autouse=True)
def nothing_kept():
    recent.clear()
    yield
    recent.clear()


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """Run what an append leaves for its commit (the test's transaction never commits)."""

    def append(console, topic, messages):
        with django_capture_on_commit_callbacks(execute=True):
            return log.append_messages(console, topic, messages)

    return append


def messages(count, start=0, **fields):
    return [NewMessage(orjson.dumps(i), **fields) for i in range(start, start + count)]


def partition_of(topic):
    return models.Partition.objects.get(topic__name=topic, number=0)


def offsets(kept):
    assert kept is not None
    return [m.offset for m in kept]


def created_at(topic):
    return models.Topic.objects.get(name=topic).created_at


def taken_from_memory(monkeypatch):
    """The calls log.read_locked answered from memory, and those that read the database."""
    counts = {"kept": 0, "read": 0}
    take, read = recent.take, log.read.read_partition

    def counted_take(*args):
        found = take(*args)
        counts["kept"] += found is not None
        return found

    def counted_read(*args):
        counts["read"] += 1
        return read(*args)

    monkeypatch.setattr(recent, "take", counted_take)
    monkeypatch.setattr(log.read, "read_partition", counted_read)
    return counts


def test_delivery_of_appended_messages__taken_as_the_database_holds_them(
    topic_factory, console, committed, monkeypatch
):
    topic = topic_factory().name
    varied = [
        NewMessage(b"\x00\xff", is_json=False, key="k", tag="t", client_id="c-1"),
        NewMessage(b'{"a": 1}', key="k2"),
    ]
    committed(console, topic, varied + messages(8))
    membership.join_group(console, "g", topic, "m")
    counts = taken_from_memory(monkeypatch)
    got = delivery.deliver_messages(console, "g", topic, "m", 100).deliveries
    assert counts == {"kept": 1, "read": 0}
    p = partition_of(topic)
    stored = log.read_partition(p.id, 0, 0, 100)
    assert [d.message for d in got] == stored
    assert [type(v) for d in got for v in d.message] == [type(v) for m in stored for v in m]


def test_rolled_back_append__nothing_kept(
    topic_factory, console, django_capture_on_commit_callbacks
):
    topic = topic_factory().name
    with django_capture_on_commit_callbacks(execute=False):
        log.append_messages(console, topic, messages(3))
    assert recent.kept_bytes() == 0
    assert recent.kept_end(partition_of(topic).id, 0) is None


def test_another_topic_created_at__not_served(topic_factory, console, committed):
    topic = topic_factory().name
    committed(console, topic, messages(3))
    p, stamp = partition_of(topic), created_at(topic)
    assert recent.take(p.id, stamp, 0, 3) is not None
    other = stamp.replace(microsecond=(stamp.microsecond + 1) % 1_000_000)
    assert recent.take(p.id, other, 0, 3) is None


def test_take__from_a_kept_start_up_to_what_is_kept(topic_factory, console, committed, settings):
    topic = topic_factory()
    settings.FERRY_MESSAGE_CACHE_MB = 0
    log.append_messages(console, topic.name, messages(5))  # not kept
    settings.FERRY_MESSAGE_CACHE_MB = 64
    committed(console, topic.name, messages(5, start=5))
    p, stamp = partition_of(topic.name), created_at(topic.name)
    assert recent.take(p.id, stamp, 4, 10) is None
    assert offsets(recent.take(p.id, stamp, 5, 100)) == [5, 6, 7, 8, 9]
    assert offsets(recent.take(p.id, stamp, 6, 8)) == [6, 7]
    assert recent.kept_end(p.id, 5) == 10
    assert recent.kept_end(p.id, 10) is None


def test_delivery__kept_part_then_the_rest_from_the_database(
    topic_factory, console, committed, settings, monkeypatch
):
    topic = topic_factory().name
    committed(console, topic, messages(5))
    settings.FERRY_MESSAGE_CACHE_MB = 0
    log.append_messages(console, topic, messages(5, start=5))  # another process's, say
    settings.FERRY_MESSAGE_CACHE_MB = 64
    committed(console, topic, messages(5, start=10))
    membership.join_group(console, "g", topic, "m")
    counts = taken_from_memory(monkeypatch)
    got = delivery.deliver_messages(console, "g", topic, "m", 100).deliveries
    assert [d.message.offset for d in got] == list(range(15))
    assert [orjson.loads(d.message.value) for d in got] == list(range(15))
    # Nothing kept from 0 (the gap at 5 started a run of its own at 10): the database's.
    assert counts == {"kept": 0, "read": 1}


def test_gap_in_appends__a_new_run_from_after_it(topic_factory, console, committed, settings):
    topic = topic_factory()
    committed(console, topic.name, messages(3))
    settings.FERRY_MESSAGE_CACHE_MB = 0
    log.append_messages(console, topic.name, messages(2, start=3))
    settings.FERRY_MESSAGE_CACHE_MB = 64
    committed(console, topic.name, messages(2, start=5))
    p, stamp = partition_of(topic.name), created_at(topic.name)
    assert recent.take(p.id, stamp, 0, 3) is None
    assert offsets(recent.take(p.id, stamp, 5, 7)) == [5, 6]


def test_purged_messages__not_delivered(topic_factory, console, committed):
    topic = topic_factory().name
    committed(console, topic, messages(6))
    log.purge_topic(console, topic)
    committed(console, topic, messages(2, start=6))
    membership.join_group(console, "g", topic, "m")
    got = delivery.deliver_messages(console, "g", topic, "m", 100).deliveries
    assert [d.message.offset for d in got] == [6, 7]


def test_headers__kept_on_sqlite_only(topic_factory, console, committed):
    topic = topic_factory()
    committed(console, topic.name, messages(2, headers={"b": "1", "a": "2"}))
    p = partition_of(topic.name)
    kept = recent.take(p.id, created_at(topic.name), 0, 2)
    if bulk.vendor() == "postgresql":
        # jsonb gives them back in its own form: read from the database.
        assert kept is None
    else:
        assert kept == log.read_partition(p.id, 0, 0, 2)


def test_memory_bound__the_oldest_half_of_the_longest_unappended_partition_shed(
    topic_factory, console, committed, settings
):
    first, second = topic_factory(), topic_factory()
    committed(console, first.name, messages(100))
    committed(console, second.name, messages(10))
    per_message = recent.kept_bytes() // 110
    # Room for 130 messages: 40 more to the second topic shed the first's older half.
    settings.FERRY_MESSAGE_CACHE_MB = 130 * per_message / 1024 / 1024
    committed(console, second.name, messages(40, start=10))
    a, b = partition_of(first.name), partition_of(second.name)
    assert recent.kept_end(a.id, 49) is None
    assert recent.kept_end(a.id, 50) == 100
    assert recent.kept_end(b.id, 0) == 50
    assert recent.kept_bytes() <= 130 * per_message


def test_read_ahead__only_what_is_not_kept(topic_factory, console, committed, monkeypatch):
    topic = topic_factory().name
    committed(console, topic, messages(10))
    pid = partition_of(topic).id
    announced = []
    monkeypatch.setattr(bulk, "read_ahead", lambda sql, params: announced.append(params))
    log.read_partition_ahead(pid, 2, 5)
    log.read_partition_ahead(pid, 8, 5)
    log.read_partition_ahead(pid, 10, 5)
    assert announced == [(pid, 10, 13), (pid, 10, 15)]


def test_partitions_interleaved_in_a_batch__each_kept_whole(topic_factory, console, committed):
    topic = topic_factory(partitions=2).name
    committed(console, topic, [NewMessage(orjson.dumps(i), partition=i % 2) for i in range(6)])
    stamp = created_at(topic)
    for number in (0, 1):
        p = models.Partition.objects.get(topic__name=topic, number=number)
        kept = recent.take(p.id, stamp, 0, 3)
        assert kept == log.read_partition(p.id, number, 0, 3)
        assert [orjson.loads(m.value) for m in kept or []] == [number, number + 2, number + 4]


def test_headers_in_the_middle_of_a_batch__end_a_run_on_postgresql(
    topic_factory, console, committed
):
    topic = topic_factory().name
    batch = messages(2) + messages(1, start=2, headers={"h": "v"}) + messages(2, start=3)
    committed(console, topic, batch)
    p, stamp = partition_of(topic), created_at(topic)
    stored = log.read_partition(p.id, 0, 0, 5)
    if bulk.vendor() == "postgresql":
        assert recent.take(p.id, stamp, 0, 5) is None
        assert recent.take(p.id, stamp, 3, 5) == stored[3:]
    else:
        assert recent.take(p.id, stamp, 0, 5) == stored
