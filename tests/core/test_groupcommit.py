"""Group commit: concurrent small produces share a transaction, each all or nothing."""

import asyncio
import time

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from broker import models
from broker.core import bulk, errors, groupcommit, keys, log, topics
from broker.core.membership import rebalancing
from broker.core.records import NewMessage

pytestmark = pytest.mark.django_db(transaction=True)


def message(value, **fields):
    return NewMessage(orjson.dumps(value), **fields)


async def close_thread_connection():
    # The core ran on another thread (FERRY_DB_THREADS=0 in tests: asgiref's) with this
    # context's connection: close it, or PostgreSQL cannot drop the test database at the end.
    def close():
        connection.inc_thread_sharing()
        try:
            connection.close()
        finally:
            connection.dec_thread_sharing()

    await sync_to_async(close)()


def offsets(outcome):
    assert isinstance(outcome, list), outcome
    return [r.offset for r in outcome]


def test_append_batches__each_request_on_its_own(topic_factory, key_factory):
    topic = topic_factory().name
    other_topic = topic_factory().name
    limited, _ = key_factory(f"produce:{topic}")
    outcomes = groupcommit.append_batches(
        [
            (keys.CONSOLE, topic, [message(1), message(2)]),
            (keys.CONSOLE, "no-such-topic", [message(3)]),
            (keys.CONSOLE, topic, [message(4, partition=7)]),
            (limited, other_topic, [message(5)]),
            (limited, topic, [message(6)]),
        ]
    )
    assert offsets(outcomes[0]) == [0, 1]
    assert isinstance(outcomes[1], errors.TopicNotFound)
    assert isinstance(outcomes[2], errors.PartitionNotFound)
    assert isinstance(outcomes[3], errors.PermissionDenied)
    assert offsets(outcomes[4]) == [2]
    stored = models.Message.objects.filter(partition__topic__name=topic).order_by("offset")
    assert [orjson.loads(bytes(m.value)) for m in stored] == [1, 2, 6]


def test_append_batches__a_failure_inside_the_transaction_rolls_back_alone(topic_factory):
    topic = topic_factory(capacity=2).name
    outcomes = groupcommit.append_batches(
        [
            (keys.CONSOLE, topic, [message(1)]),
            (keys.CONSOLE, topic, [message(2), message(3)]),  # over capacity: refused whole
            (keys.CONSOLE, topic, [message(4)]),
        ]
    )
    assert offsets(outcomes[0]) == [0]
    assert isinstance(outcomes[1], errors.TopicFull)
    assert offsets(outcomes[2]) == [1]
    assert models.Message.objects.count() == 2


async def test_append_messages__concurrent_requests_all_stored_in_order(topic_factory):
    topic = (await sync_to_async(topic_factory)()).name
    results = await asyncio.gather(
        *(groupcommit.append_messages(keys.CONSOLE, topic, [message(i)]) for i in range(50))
    )
    # Requests are committed in arrival order, so offsets follow it.
    assert [r[0].offset for r in results] == list(range(50))
    with pytest.raises(errors.TopicNotFound):
        await groupcommit.append_messages(keys.CONSOLE, "missing", [message(0)])
    await close_thread_connection()


async def test_append_messages__idempotent_ids_within_a_group(topic_factory):
    topic = (await sync_to_async(topic_factory)()).name
    first, second = await asyncio.gather(
        groupcommit.append_messages(keys.CONSOLE, topic, [message(1, client_id="a")]),
        groupcommit.append_messages(keys.CONSOLE, topic, [message(1, client_id="a")]),
    )
    assert (first[0].offset, first[0].duplicate) == (0, False)
    assert (second[0].offset, second[0].duplicate) == (0, True)
    await close_thread_connection()


def test_append_batches__a_stored_id_rolls_back_and_is_answered_duplicate(topic_factory):
    """The group stores its ids without a lookup first; a retry's id fails the commit, and the
    requests are appended again, after a lookup, each on its own."""
    topic = topic_factory(partitions=1).name
    [stored] = groupcommit.append_batches([(keys.CONSOLE, topic, [message(0, client_id="a")])])
    assert isinstance(stored, list)
    outcomes = groupcommit.append_batches(
        [
            (keys.CONSOLE, topic, [message(1, client_id="b")]),
            (keys.CONSOLE, topic, [message(0, client_id="a"), message(2)]),
            (keys.CONSOLE, topic, [message(3, client_id="c")]),
        ]
    )
    assert [offsets(o) for o in outcomes] == [[1], [0, 2], [3]]
    assert isinstance(outcomes[1], list)
    assert outcomes[1][0] == stored[0]._replace(duplicate=True)
    assert [m.offset for m in models.Message.objects.order_by("offset")] == [0, 1, 2, 3]
    assert sorted(models.ProducedId.objects.values_list("client_id", "offset")) == [
        ("a", 0),
        ("b", 1),
        ("c", 3),
    ]
    assert not log.unseen_ids_likely()


def test_append_batches__no_savepoint_when_all_succeed(topic_factory):
    """Savepoints only on the way back from a failure: two round trips fewer per group commit
    on PostgreSQL (docs/benchmarks.md)."""
    from django.test.utils import CaptureQueriesContext

    one, two = topic_factory().name, topic_factory().name
    with CaptureQueriesContext(connection) as queries:
        outcomes = groupcommit.append_batches(
            [
                (keys.CONSOLE, one, [message(1)]),
                (keys.CONSOLE, two, [message(2)]),
                (keys.CONSOLE, one, [message(3), message(4)]),
            ]
        )
    assert [offsets(o) for o in outcomes] == [[0], [0], [1, 2]]
    assert not [q for q in queries.captured_queries if "SAVEPOINT" in q["sql"].upper()]


def test_append_batches__a_topic_changed_since_the_last_commit_is_read_again(topic_factory):
    """On PostgreSQL a commit plans with its topic's row as the last commit read it, and reads
    it again with the partitions' lock: a change in between (a limit raised or lowered, more
    partitions, the topic deleted and made again) is seen as if the row had been read first."""
    name = topic_factory(partitions=2, max_message_bytes=1000).name

    def append(*messages):
        (outcome,) = groupcommit.append_batches([(keys.CONSOLE, name, list(messages))])
        return outcome

    assert offsets(append(message(1))) == [0]
    big = message("x" * 1500)
    assert isinstance(append(big), errors.MessageTooLarge)
    rebalancing.alter_topic(keys.CONSOLE, name, max_message_bytes=4000, partitions=4)
    assert append(big, message(2, partition=3))[1].partition == 3
    rebalancing.alter_topic(keys.CONSOLE, name, max_message_bytes=1000)
    # Rows enough for a COPY, planned with the last row (4000): the row read with the lock,
    # before the rows, is the one checked, and nothing is stored.
    many = [message(i) for i in range(bulk.PG_COPY_MIN_ROWS)]
    assert isinstance(append(big, *many), errors.MessageTooLarge)
    assert models.Message.objects.filter(partition__topic__name=name).count() == 3
    assert isinstance(append(big), errors.MessageTooLarge)
    topics.delete_topic(keys.CONSOLE, name)
    assert isinstance(append(message(3)), errors.TopicNotFound)
    topics.create_topic(keys.CONSOLE, name, 1)
    assert [(r.partition, r.offset) for r in append(message(4))] == [(0, 0)]
    stored = models.Message.objects.filter(partition__topic__name=name)
    assert [orjson.loads(bytes(m.value)) for m in stored] == [4]


def test_append_batches__the_topic_read_with_the_partitions_lock(topic_factory, monkeypatch):
    """On PostgreSQL a commit after the first to a topic is two round trips: the partitions'
    lock with the topic's row, then the rows, the partitions' update and the COMMIT."""
    if connection.vendor != "postgresql":
        pytest.skip("round trips are PostgreSQL's")
    from broker.core import pgwire

    name = topic_factory(partitions=1).name
    trips: list[list[str]] = []
    real = pgwire.execute

    def seen(db, statements, commit=False):
        trips.append([sql.split()[0] for sql, _ in statements] + (["COMMIT"] if commit else []))
        return real(db, statements, commit)

    monkeypatch.setattr(pgwire, "execute", seen)
    for value in range(3):
        trips.clear()
        (outcome,) = groupcommit.append_batches([(keys.CONSOLE, name, [message(value)])])
        assert offsets(outcome) == [value]
        if value:  # the first reads the topic on its own
            assert trips == [["SELECT", "SELECT"], ["INSERT", "UPDATE", "COMMIT"]]
    # Client ids are not looked up first, and their rows go with the messages' and the COMMIT.
    trips.clear()
    (outcome,) = groupcommit.append_batches([(keys.CONSOLE, name, [message(3, client_id="a")])])
    assert offsets(outcome) == [3]
    assert trips == [["SELECT", "SELECT"], ["INSERT", "UPDATE", "INSERT", "COMMIT"]]
    # Rows enough for a COPY (its own protocol, not through pgwire): the topic's row read with
    # the lock is not read again after the rows, under the lock.
    trips.clear()
    big = [message(i) for i in range(bulk.PG_COPY_MIN_ROWS)]
    (outcome,) = groupcommit.append_batches([(keys.CONSOLE, name, big)])
    assert offsets(outcome) == list(range(4, 4 + bulk.PG_COPY_MIN_ROWS))
    assert trips == [["SELECT", "SELECT"], ["UPDATE", "COMMIT"]]
    rebalancing.alter_topic(keys.CONSOLE, name, max_message_bytes=4000)
    trips.clear()
    (outcome,) = groupcommit.append_batches([(keys.CONSOLE, name, [message(9)])])
    assert offsets(outcome) == [4 + bulk.PG_COPY_MIN_ROWS]
    # The guess (the lock and the changed row; then a rollback), then as without one.
    assert trips == [["SELECT", "SELECT"], ["SELECT"], ["SELECT"], ["INSERT", "UPDATE", "COMMIT"]]


class Commits(list):
    """The requests each group commit held; every commit takes 0.2 s (so a wait may too)."""

    started: float = 0.0  # when the last one began (time.monotonic())


@pytest.fixture
def commits(monkeypatch):
    held = Commits()
    real = groupcommit.append_batches

    def slow(requests):
        held.started = time.monotonic()
        held.append(len(requests))
        time.sleep(0.2)
        return real(requests)

    monkeypatch.setattr(groupcommit, "append_batches", slow)
    return held


async def produce(topic, value, after_s=0.0):
    await asyncio.sleep(after_s)
    return await groupcommit.append_messages(keys.CONSOLE, topic, [message(value)])


async def test_append_messages__producers_coming_back_share_the_next_commit(
    topic_factory, settings, commits
):
    """After a commit of four, two producers come back at once and two 20 ms later: the next
    commit waits for all four (FERRY_GROUP_COMMIT_WAIT_MS), where it would hold two."""
    settings.FERRY_GROUP_COMMIT_WAIT_MS = 5000
    topic = (await sync_to_async(topic_factory)()).name
    await asyncio.gather(*(produce(topic, i) for i in range(4)))
    results = await asyncio.gather(
        produce(topic, 4), produce(topic, 5), produce(topic, 6, 0.02), produce(topic, 7, 0.02)
    )
    assert commits == [4, 4]
    assert sorted(r[0].offset for r in results) == [4, 5, 6, 7]
    await close_thread_connection()


async def test_append_messages__without_the_wait_they_split(topic_factory, settings, commits):
    settings.FERRY_GROUP_COMMIT_WAIT_MS = 0
    topic = (await sync_to_async(topic_factory)()).name
    await asyncio.gather(*(produce(topic, i) for i in range(4)))
    await asyncio.gather(
        produce(topic, 4), produce(topic, 5), produce(topic, 6, 0.02), produce(topic, 7, 0.02)
    )
    assert commits == [4, 2, 2]
    await close_thread_connection()


async def test_append_messages__the_wait_is_bounded_and_a_lone_producer_never_waits(
    topic_factory, settings, commits, monkeypatch
):
    settings.FERRY_GROUP_COMMIT_WAIT_MS = 5000
    monkeypatch.setattr(groupcommit, "PEAK_SECONDS", 0.5)
    topic = (await sync_to_async(topic_factory)()).name
    await asyncio.gather(*(produce(topic, i) for i in range(4)))
    # Three of four do not come back: the commit waits no longer than the last one took.
    sent = time.monotonic()
    await produce(topic, 4)
    assert 0.15 <= commits.started - sent < 2.0  # not the 5 s configured
    # The crowd is gone (PEAK_SECONDS): a lone producer's commit starts at once.
    await asyncio.sleep(0.6)
    sent = time.monotonic()
    await produce(topic, 5)
    assert commits.started - sent < 0.15
    assert commits == [4, 1, 1]
    await close_thread_connection()


async def test_append_messages__a_wait_in_vain_is_not_repeated(topic_factory, settings, commits):
    """A producer sending at a steady rate, whose request once met a slow commit, does not
    come back just after a commit: once a wait has ended on its timer, and nobody came during
    that commit to raise the count again, the next request's commit starts at once (not
    PEAK_SECONDS later)."""
    settings.FERRY_GROUP_COMMIT_WAIT_MS = 5000
    topic = (await sync_to_async(topic_factory)()).name
    sent = time.monotonic()
    # The second arrives during the first's commit, so the next commit waits for a crowd of
    # two (no longer than the last commit took), which does not come.
    await asyncio.gather(produce(topic, 0), produce(topic, 1, 0.05))
    assert commits.started - sent >= 0.35
    sent = time.monotonic()
    await produce(topic, 2)
    assert commits.started - sent < 0.15
    assert commits == [1, 1, 1]
    await close_thread_connection()


async def test_append_messages__producers_later_than_the_wait_keep_the_crowd(
    topic_factory, settings, commits
):
    """Producers held back longer than the wait (a process short of CPU) but back by the end
    of the commit are still waited for: the commit after them waits again."""
    settings.FERRY_GROUP_COMMIT_WAIT_MS = 5000
    topic = (await sync_to_async(topic_factory)()).name
    await asyncio.gather(*(produce(topic, i) for i in range(4)))
    sent = time.monotonic()
    # Two come back at once, and wait 0.2 s (the last commit) in vain; the other two come
    # during their commit, and their own commit waits for the four again.
    await asyncio.gather(
        produce(topic, 4), produce(topic, 5), produce(topic, 6, 0.3), produce(topic, 7, 0.3)
    )
    assert commits == [4, 2, 2]
    assert commits.started - sent >= 0.55  # wait, commit, and wait again
    await close_thread_connection()


def test_wait_ms_setting__picks_by_database(settings):
    settings.FERRY_GROUP_COMMIT_WAIT_MS = -1
    expected = groupcommit.PG_WAIT_MS if connection.vendor == "postgresql" else 0.0
    assert groupcommit.wait_ms_setting() == expected
    settings.FERRY_GROUP_COMMIT_WAIT_MS = 3
    assert groupcommit.wait_ms_setting() == 3
