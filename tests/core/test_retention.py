import orjson

from broker import models
from broker.core import log, retention, topics
from broker.core.records import NewMessage


def msg(value=None, **kw):
    return NewMessage(value=orjson.dumps(value), **kw)


def test_apply_retention__by_time(topic_factory, console):
    topic = topic_factory(retention_ms=60_000)
    log.append_messages(console, topic.name, [msg(i) for i in range(4)])
    models.Message.objects.filter(offset__lt=2).update(timestamp_ms=1)
    assert retention.apply_retention() == 2
    part = topics.get_topic(console, topic.name).partitions[0]
    assert (part.start_offset, part.end_offset) == (2, 4)


def test_apply_retention__by_size(topic_factory, console):
    topic = topic_factory(retention_bytes=30)
    log.append_messages(console, topic.name, [NewMessage(value=b"x" * 10) for _ in range(5)])
    assert retention.apply_retention() == 2
    part = models.Partition.objects.get(topic__name=topic.name)
    assert (part.start_offset, part.next_offset, part.bytes_stored) == (2, 5, 30)


def test_apply_retention__offsets_never_reused(topic_factory, console):
    topic = topic_factory(retention_ms=1)
    log.append_messages(console, topic.name, [msg(1), msg(2)])
    models.Message.objects.update(timestamp_ms=1)
    retention.apply_retention()
    results = log.append_messages(console, topic.name, [msg(3)])
    assert results[0].offset == 2


def test_purge_produced_ids__old_only(topic_factory, console):
    topic = topic_factory()
    log.append_messages(
        console, topic.name, [NewMessage(value=b"1", client_id=c) for c in ("a", "b")]
    )
    models.ProducedId.objects.filter(client_id="a").update(created_ms=0)
    assert retention.purge_produced_ids() == 1
    assert list(models.ProducedId.objects.values_list("client_id", flat=True)) == ["b"]
