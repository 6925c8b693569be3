import pytest

from broker import models
from broker.core import errors, groups, keys, log, membership, topics
from broker.core.records import NewMessage


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


@pytest.mark.parametrize("name", ["", "bad name", "a/b", "x" * 201, "ü", ".", "..", "..."])
def test_create_topic__bad_name(db, console, name):
    with pytest.raises(errors.InvalidTopicName):
        topics.create_topic(console, name)
    assert not models.Topic.objects.exists()


@pytest.mark.parametrize("name", [".a", "a..", "..b.", "-", "_"])
def test_create_topic__dots_with_other_characters_are_fine(db, console, name):
    assert topics.create_topic(console, name).name == name


def test_group_and_member_names__not_dots_alone(topic_factory, console):
    topic = topic_factory().name
    with pytest.raises(errors.InvalidRequest):
        membership.validate_group_name("..")
    with pytest.raises(errors.InvalidRequest):
        membership.join_group(console, "g", topic, "..")


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
    grown = membership.alter_topic(console, topic.name, partitions=4)
    assert [p.number for p in grown.partitions] == [0, 1, 2, 3]
    with pytest.raises(errors.InvalidPartitionCount):
        membership.alter_topic(console, topic.name, partitions=3)


def test_alter_topic__limits_and_clear(topic_factory, console):
    topic = topic_factory(capacity=10)
    info = membership.alter_topic(
        console, topic.name, retention_ms=5000, overflow_policy="drop_oldest"
    )
    assert (info.retention_ms, info.capacity, info.overflow_policy) == (5000, 10, "drop_oldest")
    assert membership.alter_topic(console, topic.name, capacity=None).capacity is None
    with pytest.raises(errors.TopicNotFound):
        membership.alter_topic(console, "missing", partitions=2)


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


def _produce(topic, n, partition):
    log.append_messages(
        keys.CONSOLE, topic, [NewMessage(value=b'"x"', partition=partition) for _ in range(n)]
    )


def test_topic_info__bytes_and_counts(topic_factory, console):
    topic = topic_factory(partitions=2)
    _produce(topic.name, 3, 0)
    _produce(topic.name, 1, 1)
    info = topics.get_topic(console, topic.name)
    size = models.Message.objects.all()[0].size_bytes
    assert [(p.message_count, p.bytes_stored) for p in info.partitions] == [
        (3, 3 * size),
        (1, size),
    ]
    assert (info.message_count, info.bytes_stored) == (4, 4 * size)


def test_purge_topic__all(topic_factory, console):
    topic = topic_factory(partitions=2)
    _produce(topic.name, 3, 0)
    _produce(topic.name, 2, 1)
    result = log.purge_topic(console, topic.name)
    assert result.removed == 5
    assert [(p.start_offset, p.end_offset, p.bytes_stored) for p in result.partitions] == [
        (3, 3, 0),
        (2, 2, 0),
    ]
    assert not models.Message.objects.exists()
    _produce(topic.name, 1, 0)
    assert models.Message.objects.get().offset == 3


def test_purge_topic__up_to_offsets(topic_factory, console):
    topic = topic_factory(partitions=2)
    _produce(topic.name, 5, 0)
    _produce(topic.name, 2, 1)
    size = models.Message.objects.all()[0].size_bytes
    result = log.purge_topic(console, topic.name, {0: 3})
    assert result.removed == 3
    assert [(p.start_offset, p.end_offset, p.bytes_stored) for p in result.partitions] == [
        (3, 5, 2 * size),
        (0, 2, 2 * size),
    ]
    # Below the start already: nothing more goes.
    assert log.purge_topic(console, topic.name, {0: 1}).removed == 0


def test_purge_topic__group_behind_reads_from_new_start(topic_factory, console):
    topic = topic_factory()
    _produce(topic.name, 4, 0)
    groups.commit_offsets(console, "g", topic.name, {0: 1})
    log.purge_topic(console, topic.name, {0: 3})
    lag = groups.describe_group(console, "g").topics[0].partitions[0]
    assert (lag.committed_offset, lag.lag) == (3, 1)
    polled = groups.poll_messages(console, "g", topic.name, 10, False)
    assert [m.offset for m in polled.messages] == [3]


@pytest.mark.parametrize(
    ("up_to", "error"),
    [
        ({0: 9}, errors.OffsetOutOfRange),
        ({0: 1, 5: 0}, errors.PartitionNotFound),
        ({0: -1}, errors.InvalidRequest),
    ],
)
def test_purge_topic__bad_input_removes_nothing(topic_factory, console, up_to, error):
    topic = topic_factory()
    _produce(topic.name, 3, 0)
    with pytest.raises(error):
        log.purge_topic(console, topic.name, up_to)
    assert models.Message.objects.count() == 3
    assert models.Partition.objects.get().start_offset == 0


def test_purge_topic__needs_admin_and_topic(topic_factory, key_factory, console):
    topic = topic_factory()
    principal, _ = key_factory("produce:*", "consume:*")
    with pytest.raises(errors.PermissionDenied):
        log.purge_topic(principal, topic.name)
    with pytest.raises(errors.TopicNotFound):
        log.purge_topic(console, "missing")
