import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

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
    with pytest.raises(errors.TopicNotFound):
        topics.delete_topic(console, topic.name)
    with pytest.raises(errors.TopicNotFound):
        topics.get_topic(console, topic.name)
    topics.run_topic_deletions()
    assert not models.Partition.objects.exists()
    assert not models.Topic.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_delete_topic__gone_at_once_rows_in_chunks_and_recreate(settings, console):
    settings.FERRY_DELETION_CHUNK_ROWS = 7
    topics.create_topic(console, "big", 3)
    for partition in range(3):
        _produce("big", 20, partition)
    positions = groups.poll_messages(console, "g", "big", max_messages=60, auto_commit=True)
    assert len(positions.messages) == 60
    deletion = topics.delete_topic(console, "big")
    assert (deletion.name, deletion.messages) == ("big", 60)
    # Gone for every client at once, rows still there until the job runs.
    with pytest.raises(errors.TopicNotFound):
        topics.get_topic(console, "big")
    assert [t.name for t in topics.list_topics(console)] == []
    assert groups.list_groups(console) == []
    assert models.Message.objects.count() == 60
    assert [d.name for d in topics.list_topic_deletions(console)] == ["big"]
    # The same name again, at once: an empty topic with none of the old messages or offsets.
    topics.create_topic(console, "big", 1)
    _produce("big", 2, 0)
    fetched = log.read_messages(console, "big", 0, None, 100)
    assert [m.offset for m in fetched.messages] == [0, 1]
    removed = topics.run_topic_deletions()
    assert removed >= 60 + 3
    assert models.Message.objects.count() == 2
    assert list(models.Topic.objects.values_list("name", flat=True)) == ["big"]
    assert topics.list_topic_deletions(console) == []
    assert topics.run_topic_deletions() == 0


@pytest.mark.django_db(transaction=True)
def test_run_topic_deletions__each_chunk_its_own_transaction(settings, console):
    settings.FERRY_DELETION_CHUNK_ROWS = 10
    topics.create_topic(console, "big", 1)
    _produce("big", 35, 0)
    topics.delete_topic(console, "big")
    with CaptureQueriesContext(connection) as queries:
        topics.run_topic_deletions()
    statements = [q["sql"] for q in queries.captured_queries]
    chunks = [
        sql
        for sql in statements
        if sql.startswith('DELETE FROM "broker_message"') and '"offset" <' in sql
    ]
    # 35 messages in chunks of 10: four DELETEs, each in a durable transaction of its own.
    assert len(chunks) == 4
    assert not models.Message.objects.exists()
    assert not models.Topic.objects.exists()


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
