import time

import orjson
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from broker import models
from broker.core import bulk, errors, keys, log, membership, topics
from broker.core.log import append
from broker.core.records import NewMessage


def msg(value=None, **kw):
    return NewMessage(value=orjson.dumps(value), **kw)


def end_offsets(topic_name):
    return [p.end_offset for p in topics.get_topic(keys.CONSOLE, topic_name).partitions]


def test_append_messages__offsets_contiguous_per_partition(topic_factory, console):
    topic = topic_factory(partitions=2)
    results = log.append_messages(console, topic.name, [msg(i, partition=i % 2) for i in range(6)])
    assert [(r.partition, r.offset) for r in results] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
        (0, 2),
        (1, 2),
    ]
    assert end_offsets(topic.name) == [3, 3]


def test_append_messages__same_key_same_partition(topic_factory, console):
    topic = topic_factory(partitions=8)
    results = log.append_messages(console, topic.name, [msg(i, key="user-7") for i in range(5)])
    assert len({r.partition for r in results}) == 1
    assert [r.offset for r in results] == [0, 1, 2, 3, 4]


def test_append_messages__duplicate_id_returns_original(topic_factory, console):
    topic = topic_factory(partitions=3)
    first = log.append_messages(
        console, topic.name, [NewMessage(value=b'"a"', client_id="order-1")]
    )
    again = log.append_messages(
        console, topic.name, [NewMessage(value=b'"a"', client_id="order-1")]
    )
    assert again[0].duplicate
    assert (again[0].partition, again[0].offset) == (first[0].partition, first[0].offset)
    assert sum(end_offsets(topic.name)) == 1


def test_append_messages__duplicate_inside_one_batch(topic_factory, console):
    topic = topic_factory()
    results = log.append_messages(
        console,
        topic.name,
        [NewMessage(value=b"1", client_id="a"), NewMessage(value=b"2", client_id="a")],
    )
    assert [(r.offset, r.duplicate) for r in results] == [(0, False), (0, True)]
    assert end_offsets(topic.name) == [1]


def test_append_messages__id_after_dedup_window_is_new(topic_factory, console, settings):
    topic = topic_factory()
    log.append_messages(console, topic.name, [NewMessage(value=b"1", client_id="a")])
    models.ProducedId.objects.update(created_ms=0)
    again = log.append_messages(console, topic.name, [NewMessage(value=b"1", client_id="a")])
    assert (again[0].offset, again[0].duplicate) == (1, False)
    assert list(models.ProducedId.objects.values_list("offset", flat=True)) == [1]


def stored_ids_read(queries):
    return [
        q["sql"] for q in queries if "FROM broker_producedid" in q["sql"] and "SELECT" in q["sql"]
    ]


def test_append_messages__new_ids_are_stored_without_a_lookup(topic_factory, console):
    """A lookup would cost PostgreSQL a probe of the unique index an id, which the insert's own
    check makes again, and the batch a round trip."""
    topic = topic_factory(partitions=2)
    batch = [NewMessage(value=b"1", client_id=f"id-{i}") for i in range(5)]
    with CaptureQueriesContext(connection) as queries:
        results = log.append_messages(console, topic.name, batch)
    assert not stored_ids_read(queries.captured_queries)
    assert not any(r.duplicate for r in results)
    stored = models.ProducedId.objects.values_list("client_id", "partition_number", "offset")
    assert sorted(stored) == sorted(
        (f"id-{i}", r.partition, r.offset) for i, r in enumerate(results)
    )


def test_append_messages__a_stored_id_is_looked_up_for_a_while(topic_factory, console, monkeypatch):
    """A retry met stores nothing twice; the next batches look their ids up first, as retries
    come in bursts, until LOOK_UP_IDS_FOR_SECONDS pass."""
    topic = topic_factory(partitions=2)
    first = log.append_messages(console, topic.name, [NewMessage(value=b"1", client_id="a")])
    again = log.append_messages(
        console,
        topic.name,
        [NewMessage(value=b"0", client_id="new"), NewMessage(value=b"1", client_id="a")],
    )
    assert again[1] == first[0]._replace(duplicate=True)
    assert not again[0].duplicate
    assert sum(end_offsets(topic.name)) == 2
    assert not log.unseen_ids_likely()
    with CaptureQueriesContext(connection) as queries:
        log.append_messages(console, topic.name, [NewMessage(value=b"2", client_id="b")])
    assert stored_ids_read(queries.captured_queries)
    left = append._look_up_ids_until - time.monotonic()
    assert 0 < left <= append.LOOK_UP_IDS_FOR_SECONDS
    monkeypatch.setattr(append, "_look_up_ids_until", time.monotonic())  # they passed
    assert log.unseen_ids_likely()
    with CaptureQueriesContext(connection) as queries:
        log.append_messages(console, topic.name, [NewMessage(value=b"3", client_id="c")])
    assert not stored_ids_read(queries.captured_queries)
    assert models.ProducedId.objects.count() == 4


def test_append_messages__a_stored_id_among_many(topic_factory, console):
    """From bulk.PG_COPY_MIN_ROWS ids on, PostgreSQL stores them with a COPY, which a stored id
    fails at once instead of the COMMIT."""
    topic = topic_factory(partitions=2)
    count = bulk.PG_COPY_MIN_ROWS + 50
    [first] = log.append_messages(console, topic.name, [NewMessage(value=b"x", client_id="x-7")])
    batch = [NewMessage(value=b"x", client_id=f"x-{i}") for i in range(count)]
    results = log.append_messages(console, topic.name, batch)
    assert [i for i, r in enumerate(results) if r.duplicate] == [7]
    assert results[7] == first._replace(duplicate=True)
    assert sum(end_offsets(topic.name)) == count
    assert models.ProducedId.objects.count() == count


def test_append_messages__bad_message_stores_nothing(topic_factory, console):
    topic = topic_factory(partitions=2, max_message_bytes=100)
    batch = [msg("ok"), msg("x" * 200)]
    with pytest.raises(errors.MessageTooLarge) as exc:
        log.append_messages(console, topic.name, batch)
    assert exc.value.detail["index"] == 1
    with pytest.raises(errors.PartitionNotFound):
        log.append_messages(console, topic.name, [msg(1), msg(2, partition=2)])
    assert end_offsets(topic.name) == [0, 0]
    assert not models.Message.objects.exists()


def test_append_messages__size_counts_key_and_headers(topic_factory, console):
    topic = topic_factory(max_message_bytes=10)
    log.append_messages(console, topic.name, [NewMessage(value=b"12345", key="12345")])
    with pytest.raises(errors.MessageTooLarge):
        log.append_messages(
            console, topic.name, [NewMessage(value=b"1", headers={"abcde": "fghij"})]
        )


def test_append_messages__capacity_reject(topic_factory, console):
    topic = topic_factory(capacity=2)
    log.append_messages(console, topic.name, [msg(1), msg(2)])
    with pytest.raises(errors.TopicFull):
        log.append_messages(console, topic.name, [msg(3)])
    assert end_offsets(topic.name) == [2]


def test_append_messages__capacity_drop_oldest(topic_factory, console):
    topic = topic_factory(capacity=3, overflow_policy="drop_oldest")
    log.append_messages(console, topic.name, [msg(i) for i in range(5)])
    part = topics.get_topic(console, topic.name).partitions[0]
    assert (part.start_offset, part.end_offset) == (2, 5)
    assert list(models.Message.objects.order_by("offset").values_list("offset", flat=True)) == [
        2,
        3,
        4,
    ]


def test_append_messages__empty_and_oversize_batch(topic_factory, console, settings):
    topic = topic_factory()
    with pytest.raises(errors.InvalidRequest):
        log.append_messages(console, topic.name, [])
    settings.FERRY_MAX_BATCH_MESSAGES = 3
    with pytest.raises(errors.BatchTooLarge):
        log.append_messages(console, topic.name, [msg(i) for i in range(4)])


def test_append_messages__unknown_topic(db, console):
    with pytest.raises(errors.TopicNotFound):
        log.append_messages(console, "nope", [msg(1)])


def test_append_messages__permission_checked_first(topic_factory, key_factory):
    topic = topic_factory(name="billing")
    principal, _ = key_factory("produce:orders.*")
    with pytest.raises(errors.PermissionDenied):
        log.append_messages(principal, topic.name, [msg(1)])
    with pytest.raises(errors.PermissionDenied):
        log.append_messages(principal, "unknown-topic", [msg(1)])


def test_append_messages__every_field_stored_at_its_offset(topic_factory, console):
    topic = topic_factory(partitions=3)
    batch = [
        NewMessage(value=b"\x00\xff", is_json=False, key="k", tag="t", headers={"h": "v"}),
        msg("a", partition=2, client_id="c-1", timestamp_ms=123),
        msg({"b": [1]}, partition=2),
        msg(None, partition=0, tag="only-tag"),
        msg("c", partition=2),
    ]
    before = log.now_ms()
    results = log.append_messages(console, topic.name, batch)
    after = log.now_ms()
    stored = {
        (m.partition.number, m.offset): m
        for m in models.Message.objects.filter(partition__topic_id=topic.id).select_related(
            "partition"
        )
    }
    assert len(stored) == len(batch) == len(results)
    for n in range(3):
        # In batch order, from each partition's start.
        offsets = [r.offset for r in results if r.partition == n]
        assert offsets == list(range(len(offsets)))
    for r, sent in zip(results, batch, strict=True):
        assert r.partition is not None  # stored, not delayed
        assert r.offset is not None
        m = stored[(r.partition, r.offset)]
        assert (bytes(m.value), m.is_json, m.key, m.tag, m.headers, m.client_id) == (
            sent.value,
            sent.is_json,
            sent.key,
            sent.tag,
            sent.headers,
            sent.client_id,
        )
        assert m.size_bytes == log.message_size(sent)
        if sent.timestamp_ms is not None:
            assert m.timestamp_ms == sent.timestamp_ms
        else:
            # The broker's clock.
            assert before - 1000 <= m.timestamp_ms <= after + 1000
    assert end_offsets(topic.name) == [sum(r.partition == n for r in results) for n in range(3)]


def test_append_messages__a_batch_past_one_insert_stores_each_row_at_its_offset(
    topic_factory, console
):
    """More rows than one INSERT carries on SQLite (bulk.MAX_ROWS_PER_INSERT), and a COPY on
    PostgreSQL: every field of every row at its offset, in batch order per partition."""
    topic = topic_factory(partitions=3)
    log.append_messages(console, topic.name, [msg("first", partition=1)])
    batch = [
        msg(
            i,
            partition=i % 3 if i % 5 else None,
            key=f"k{i}" if i % 5 == 0 else None,
            tag="t" if i % 7 == 0 else None,
            headers={"n": str(i)} if i % 11 == 0 else {},
            timestamp_ms=1_000 + i if i % 13 == 0 else None,
        )
        for i in range(2_345)
    ]
    results = log.append_messages(console, topic.name, batch)
    stored = {
        (number, offset): (bytes(value), key, tag, headers, stamp)
        for number, offset, value, key, tag, headers, stamp in models.Message.objects.filter(
            partition__topic_id=topic.id
        ).values_list(
            "partition__number", "offset", "value", "key", "tag", "headers", "timestamp_ms"
        )
    }
    assert len(stored) == len(batch) + 1
    for n in range(3):
        offsets = [r.offset for r in results if r.partition == n]
        assert offsets == list(range(1 if n == 1 else 0, len(offsets) + (n == 1)))
    for r, sent in zip(results, batch, strict=True):
        assert r.partition is not None
        assert r.offset is not None
        value, key, tag, headers, stamp = stored[(r.partition, r.offset)]
        assert (value, key, tag, headers) == (sent.value, sent.key, sent.tag, sent.headers)
        if sent.timestamp_ms is not None:
            assert stamp == sent.timestamp_ms
    assert end_offsets(topic.name) == [
        sum(r.partition == n for r in results) + (n == 1) for n in range(3)
    ]


def test_append_messages__query_budget(topic_factory, console, django_assert_max_num_queries):
    topic = topic_factory()
    batch = [msg(i) for i in range(500)]
    # topic, partition lock, executemany, partition update (+ savepoint/transaction statements)
    with django_assert_max_num_queries(6):
        log.append_messages(console, topic.name, batch)


def test_append_messages__event_on_commit_only(
    topic_factory, console, django_capture_on_commit_callbacks
):
    topic = topic_factory()
    with django_capture_on_commit_callbacks() as callbacks:
        log.append_messages(console, topic.name, [msg(1)])
    # The messages kept in memory (log/recent.py) and the event.
    assert len(callbacks) == 2
    membership.alter_topic(console, topic.name, capacity=1)
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(errors.TopicFull):
        log.append_messages(console, topic.name, [msg(2)])
    assert callbacks == []


def test_read_messages__range_and_limits(topic_factory, console):
    topic = topic_factory()
    log.append_messages(
        console,
        topic.name,
        [NewMessage(value=b"\x00\xff", is_json=False, key="k", tag="t", headers={"h": "v"})]
        + [msg(i) for i in range(1, 5)],
    )
    result = log.read_messages(console, topic.name, 0, None, 2)
    assert [m.offset for m in result.messages] == [0, 1]
    first = result.messages[0]
    assert (first.value, first.is_json, first.key, first.tag, first.headers) == (
        b"\x00\xff",
        False,
        "k",
        "t",
        {"h": "v"},
    )
    assert (result.next_offset, result.end_offset) == (2, 5)
    tail = log.read_messages(console, topic.name, 0, 5, 10)
    assert (tail.messages, tail.next_offset) == ((), 5)
    with pytest.raises(errors.OffsetOutOfRange):
        log.read_messages(console, topic.name, 0, 6, 10)
    with pytest.raises(errors.PartitionNotFound):
        log.read_messages(console, topic.name, 1, 0, 10)
    with pytest.raises(errors.InvalidRequest):
        log.read_messages(console, topic.name, 0, 0, 0)


def test_read_messages__from_an_offset_in_one_round_trip(topic_factory, console, pipelines):
    """A fetch from a given offset reads its messages with the partition's row (on PostgreSQL
    in one round trip); one from the start offset reads them after it."""
    topic = topic_factory(partitions=2)
    log.append_messages(console, topic.name, [msg(i, partition=1) for i in range(4)])
    pipelines.clear()  # the append's
    result = log.read_messages(console, topic.name, 1, 1, 2)
    assert [m.offset for m in result.messages] == [1, 2]
    assert (result.next_offset, result.start_offset, result.end_offset) == (3, 0, 4)
    assert [m.partition for m in result.messages] == [1, 1]
    if connection.vendor == "postgresql":
        assert [len(p) for p in pipelines] == [2]
    # Partition 0 holds none of them: the read by name finds that partition's own.
    assert log.read_messages(console, topic.name, 0, 0, 10).messages == ()
    assert [m.offset for m in log.read_messages(console, topic.name, 1, None, 10).messages] == [
        0,
        1,
        2,
        3,
    ]
    with pytest.raises(errors.TopicNotFound):
        log.read_messages(console, "no-such-topic", 0, 0, 10)
    # Read before the range check refuses it: an offset at the end of a bigint still fits.
    with pytest.raises(errors.OffsetOutOfRange):
        log.read_messages(console, topic.name, 1, 2**63 - 1, 10)


def test_read_messages__below_start_offset(topic_factory, console):
    topic = topic_factory(capacity=1, overflow_policy="drop_oldest")
    log.append_messages(console, topic.name, [msg(1), msg(2)])
    with pytest.raises(errors.OffsetOutOfRange):
        log.read_messages(console, topic.name, 0, 0, 10)
    assert [m.offset for m in log.read_messages(console, topic.name, 0, None, 10).messages] == [1]


def test_list_offsets__by_timestamp(topic_factory, console):
    topic = topic_factory(partitions=2)
    log.append_messages(console, topic.name, [msg(i, partition=0) for i in range(3)])
    models.Message.objects.filter(offset=0).update(timestamp_ms=1000)
    models.Message.objects.filter(offset=1).update(timestamp_ms=2000)
    models.Message.objects.filter(offset=2).update(timestamp_ms=3000)
    found = {o.partition: o for o in log.list_offsets(console, topic.name, 1500)}
    assert found[0].offset_for_timestamp == 1
    assert found[1].offset_for_timestamp == 0  # empty partition: its end offset
    later = {o.partition: o for o in log.list_offsets(console, topic.name, 9_999_999_999_999)}
    assert later[0].offset_for_timestamp == 3
    plain = log.list_offsets(console, topic.name)
    assert [(o.start_offset, o.end_offset, o.offset_for_timestamp) for o in plain] == [
        (0, 3, None),
        (0, 0, None),
    ]
