"""Group commit: concurrent small produces share a transaction, each all or nothing."""

import asyncio

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from broker import models
from broker.core import errors, groupcommit, keys
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
