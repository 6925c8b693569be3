import orjson
import pytest

from broker import models
from broker.core import errors, log, scheduling
from broker.core.records import NewMessage


def delayed(value, **kw):
    return NewMessage(orjson.dumps(value), **kw)


def make_due():
    models.ScheduledMessage.objects.update(due_ms=0)


def end_offsets(topic_name):
    return list(
        models.Partition.objects.filter(topic__name=topic_name)
        .order_by("number")
        .values_list("next_offset", flat=True)
    )


def test_append_messages__delayed_is_stored_but_invisible(topic_factory, console):
    topic = topic_factory()
    [result] = log.append_messages(console, topic.name, [delayed("later", delay_ms=60_000)])
    assert (result.partition, result.offset, result.duplicate) == (None, None, False)
    assert result.scheduled_id is not None
    assert result.deliver_at_ms is not None
    assert result.deliver_at_ms > log.now_ms() + 50_000
    assert end_offsets(topic.name) == [0]
    assert scheduling.release_due() == 0


def test_release_due__appends_with_key_tag_headers(topic_factory, console):
    topic = topic_factory(partitions=4)
    log.append_messages(
        console,
        topic.name,
        [delayed({"n": 1}, key="k", tag="t", headers={"h": "v"}, delay_ms=50_000)],
    )
    make_due()
    assert scheduling.release_due() == 1
    [message] = [
        m for p in range(4) for m in log.read_messages(console, topic.name, p, None, 10).messages
    ]
    assert (message.key, message.tag, message.headers) == ("k", "t", {"h": "v"})
    assert orjson.loads(message.value) == {"n": 1}
    assert not models.ScheduledMessage.objects.exists()
    assert scheduling.release_due() == 0


def test_append_messages__mixed_batch_keeps_order(topic_factory, console):
    topic = topic_factory()
    results = log.append_messages(
        console, topic.name, [delayed(1), delayed(2, delay_level=3), delayed(3)]
    )
    assert [(r.offset, r.scheduled_id is not None) for r in results] == [
        (0, False),
        (None, True),
        (1, False),
    ]


@pytest.mark.parametrize(
    ("fields", "ok"),
    [
        ({"delay_level": 1}, True),
        ({"delay_level": 18}, True),
        ({"delay_level": 0}, False),
        ({"delay_level": 19}, False),
        ({"delay_ms": -1}, False),
        ({"delay_ms": 1, "delay_level": 1}, False),
        ({"delay_ms": 10**13}, False),
        ({"deliver_at_ms": 1}, True),  # in the past: due at once
        ({"deliver_at_ms": -1}, False),
    ],
)
def test_append_messages__delay_validation(topic_factory, console, fields, ok):
    topic = topic_factory()
    if ok:
        log.append_messages(console, topic.name, [delayed(1, **fields)])
    else:
        with pytest.raises(errors.InvalidMessage):
            log.append_messages(console, topic.name, [delayed(0), delayed(1, **fields)])
        assert end_offsets(topic.name) == [0]
        assert not models.ScheduledMessage.objects.exists()


def test_due_ms__levels_are_rocketmq():
    now = 1_000_000
    assert log.due_ms(NewMessage(b"1", delay_level=1), now) == now + 1000
    assert log.due_ms(NewMessage(b"1", delay_level=18), now) == now + 7_200_000


def test_append_messages__delayed_id_is_idempotent(topic_factory, console):
    topic = topic_factory()
    first = log.append_messages(console, topic.name, [delayed(1, client_id="a", delay_ms=9000)])
    again = log.append_messages(console, topic.name, [delayed(1, client_id="a", delay_ms=9000)])
    assert again[0].duplicate
    assert again[0].scheduled_id == first[0].scheduled_id
    assert models.ScheduledMessage.objects.count() == 1
    make_due()
    scheduling.release_due()
    after = log.append_messages(console, topic.name, [delayed(1, client_id="a", delay_ms=9000)])
    assert (after[0].partition, after[0].offset, after[0].duplicate) == (0, 0, True)
    assert not models.ScheduledMessage.objects.exists()


def test_list_scheduled__soonest_first_and_paged(topic_factory, console):
    topic = topic_factory()
    log.append_messages(
        console, topic.name, [delayed(i, delay_ms=10_000 * (5 - i)) for i in range(5)]
    )
    listed = scheduling.list_scheduled(console, topic.name, limit=2)
    assert [orjson.loads(s.value) for s in listed] == [4, 3]
    rest = scheduling.list_scheduled(console, topic.name, limit=10, after_id=listed[-1].id)
    assert [orjson.loads(s.value) for s in rest] == [2, 1, 0]


def test_cancel_scheduled__then_gone(topic_factory, console, key_factory):
    topic = topic_factory(name="orders")
    [result] = log.append_messages(console, topic.name, [delayed(1, delay_ms=60_000)])
    assert result.scheduled_id is not None
    reader, _ = key_factory("consume:orders")
    with pytest.raises(errors.ScheduledNotFound):
        scheduling.cancel_scheduled(reader, result.scheduled_id)
    info = scheduling.cancel_scheduled(console, result.scheduled_id)
    assert info.topic == "orders"
    with pytest.raises(errors.ScheduledNotFound):
        scheduling.cancel_scheduled(console, result.scheduled_id)
    make_due()
    assert scheduling.release_due() == 0


def test_release_due__full_topic_waits_and_others_flow(topic_factory, console):
    full = topic_factory(capacity=1)
    other = topic_factory()
    log.append_messages(console, full.name, [delayed(0)])
    log.append_messages(console, full.name, [delayed(1, delay_ms=5000)])
    log.append_messages(console, other.name, [delayed(2, delay_ms=5000)])
    make_due()
    assert scheduling.release_due() == 1
    assert end_offsets(other.name) == [1]
    waiting = models.ScheduledMessage.objects.get()
    assert waiting.due_ms > log.now_ms()


def test_release_due__in_batches(topic_factory, console):
    topic = topic_factory(partitions=2)
    log.append_messages(console, topic.name, [delayed(i, delay_ms=5000) for i in range(25)])
    make_due()
    assert scheduling.release_due(batch_size=10) == 25
    assert sum(end_offsets(topic.name)) == 25


def test_append_messages__delayed_id_repeated_in_one_batch(topic_factory, console):
    topic = topic_factory()
    first, again = log.append_messages(
        console,
        topic.name,
        [delayed(1, client_id="a", delay_ms=9000), delayed(2, client_id="a", delay_ms=9000)],
    )
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.scheduled_id == first.scheduled_id
    assert models.ScheduledMessage.objects.count() == 1


def _schedule(principal, topic_name, *delays_ms):
    results = log.append_messages(
        principal, topic_name, [delayed(i, delay_ms=d) for i, d in enumerate(delays_ms)]
    )
    return [r.scheduled_id for r in results]


def test_list_all_scheduled__visible_topics_soonest_first(topic_factory, console, key_factory):
    a, b = topic_factory(name="a.one"), topic_factory(name="b.two")
    _schedule(console, a.name, 30_000, 10_000)
    _schedule(console, b.name, 20_000)
    every = scheduling.list_all_scheduled(console)
    assert [(s.topic, s.value) for s in every] == [
        ("a.one", b"1"),
        ("b.two", b"0"),
        ("a.one", b"0"),
    ]
    page = scheduling.list_all_scheduled(console, limit=2)
    rest = scheduling.list_all_scheduled(console, limit=2, after_id=page[-1].id)
    assert [s.id for s in page + rest] == [s.id for s in every]
    assert [s.topic for s in scheduling.list_all_scheduled(console, "b.two")] == ["b.two"]
    principal, _ = key_factory("consume:a.*")
    assert {s.topic for s in scheduling.list_all_scheduled(principal)} == {"a.one"}
    assert scheduling.count_scheduled(principal) == 2
    assert scheduling.count_scheduled(console) == 3
    with pytest.raises(errors.PermissionDenied):
        scheduling.list_all_scheduled(principal, "b.two")
    with pytest.raises(errors.InvalidRequest):
        scheduling.list_all_scheduled(console, limit=0)


def test_due_histogram__buckets_to_latest(topic_factory, console, monkeypatch):
    topic = topic_factory()
    assert scheduling.due_histogram(console) == []
    ids = _schedule(console, topic.name, 1, 2, 3, 4, 5)
    for sid, due in zip(ids, (5, 1_000_000, 1_000_100, 1_000_500, 1_000_999), strict=True):
        models.ScheduledMessage.objects.filter(id=sid).update(due_ms=due)  # 5: overdue
    monkeypatch.setattr(log, "now_ms", lambda: 1_000_000)
    histogram = scheduling.due_histogram(console, buckets=4)
    assert histogram == [(1_000_000, 3), (1_000_250, 0), (1_000_500, 1), (1_000_750, 1)]
    with pytest.raises(errors.InvalidRequest):
        scheduling.due_histogram(console, buckets=0)


def test_deliver_now__released_on_next_tick(topic_factory, console, key_factory):
    topic = topic_factory()
    (sid,) = _schedule(console, topic.name, 3_600_000)
    consumer, _ = key_factory(f"consume:{topic.name}")
    with pytest.raises(errors.ScheduledNotFound):
        scheduling.deliver_now(consumer, sid)
    info = scheduling.deliver_now(console, sid)
    assert info.deliver_at_ms <= log.now_ms()
    assert scheduling.release_due() == 1
    assert end_offsets(topic.name) == [1]
    with pytest.raises(errors.ScheduledNotFound):
        scheduling.deliver_now(console, sid)


def test_reschedule_scheduled__bounded(topic_factory, console):
    topic = topic_factory()
    (sid,) = _schedule(console, topic.name, 60_000)
    later = log.now_ms() + 120_000
    assert scheduling.reschedule_scheduled(console, sid, later).deliver_at_ms == later
    for bad in (-1, log.now_ms() + 10**12):
        with pytest.raises(errors.InvalidRequest):
            scheduling.reschedule_scheduled(console, sid, bad)
    assert models.ScheduledMessage.objects.get().due_ms == later
    with pytest.raises(errors.ScheduledNotFound):
        scheduling.reschedule_scheduled(console, sid + 1, later)
