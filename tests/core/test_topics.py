import pytest

from broker import models
from broker.core import errors, topics


def test_create_topic__defaults(db, console):
    info = topics.create_topic(console, "orders", 3)
    assert (info.partition_count, info.max_message_bytes, info.overflow_policy) == (
        3,
        1024 * 1024,
        "reject",
    )
    assert [(p.number, p.start_offset, p.end_offset) for p in info.partitions] == [
        (0, 0, 0),
        (1, 0, 0),
        (2, 0, 0),
    ]


@pytest.mark.parametrize("name", ["", "bad name", "a/b", "x" * 201, "ü"])
def test_create_topic__bad_name(db, console, name):
    with pytest.raises(errors.InvalidTopicName):
        topics.create_topic(console, name)
    assert not models.Topic.objects.exists()


def test_create_topic__bad_options(db, console):
    with pytest.raises(errors.InvalidPartitionCount):
        topics.create_topic(console, "t", 0)
    with pytest.raises(errors.InvalidRequest):
        topics.create_topic(console, "t", 1, capacity=0)
    with pytest.raises(errors.InvalidRequest):
        topics.create_topic(console, "t", 1, overflow_policy="explode")
    assert not models.Topic.objects.exists()


def test_create_topic__exists(topic_factory, console):
    topic_factory(name="dup")
    with pytest.raises(errors.TopicExists):
        topics.create_topic(console, "dup")


def test_create_topic__needs_admin(db, key_factory):
    producer, _ = key_factory("produce:*")
    with pytest.raises(errors.PermissionDenied):
        topics.create_topic(producer, "t")
    admin, _ = key_factory("admin:team.*")
    assert topics.create_topic(admin, "team.a").name == "team.a"


def test_alter_topic__grow_not_shrink(topic_factory, console):
    topic = topic_factory(partitions=2)
    grown = topics.alter_topic(console, topic.name, partitions=4)
    assert [p.number for p in grown.partitions] == [0, 1, 2, 3]
    with pytest.raises(errors.InvalidPartitionCount):
        topics.alter_topic(console, topic.name, partitions=3)


def test_alter_topic__limits_and_clear(topic_factory, console):
    topic = topic_factory(capacity=10)
    info = topics.alter_topic(console, topic.name, retention_ms=5000, overflow_policy="drop_oldest")
    assert (info.retention_ms, info.capacity, info.overflow_policy) == (5000, 10, "drop_oldest")
    assert topics.alter_topic(console, topic.name, capacity=None).capacity is None
    with pytest.raises(errors.TopicNotFound):
        topics.alter_topic(console, "missing", partitions=2)


def test_delete_topic__removes_everything(topic_factory, console):
    topic = topic_factory()
    topics.delete_topic(console, topic.name)
    assert not models.Partition.objects.exists()
    with pytest.raises(errors.TopicNotFound):
        topics.delete_topic(console, topic.name)
    with pytest.raises(errors.TopicNotFound):
        topics.get_topic(console, topic.name)


def test_list_topics__filtered_by_permission(topic_factory, key_factory, console):
    topic_factory(name="orders.eu")
    topic_factory(name="billing")
    reader, _ = key_factory("consume:orders.*")
    assert [t.name for t in topics.list_topics(reader)] == ["orders.eu"]
    assert [t.name for t in topics.list_topics(console)] == ["billing", "orders.eu"]
