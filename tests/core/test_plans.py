"""PostgreSQL plans of the hot reads: a delivery's read stays on the (partition, offset) index.

A partition that grew since the table's last ANALYZE is estimated at about one row, and the
planner then took the (partition, timestamp) index and filtered every row of the partition:
a read that cost in proportion to the partition's size (docs/benchmarks.md, PostgreSQL).
"""

import orjson
import pytest
from django.db import connection

from broker import models
from broker.core import keys, log, topics
from broker.core.log import read
from broker.core.records import NewMessage

pytestmark = pytest.mark.django_db(transaction=True)


def fill(topic: str, count: int) -> int:
    for start in range(0, count, 1000):
        log.append_messages(
            keys.CONSOLE, topic, [NewMessage(orjson.dumps(i)) for i in range(start, start + 1000)]
        )
    return models.Partition.objects.get(topic__name=topic, number=0).id


def plan(partition_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + read.SELECT_MESSAGES, (partition_id, 100, 200))
        return "\n".join(row[0] for row in cursor.fetchall())


def newer_than_the_statistics() -> int:
    """The id of partition 0 of topic plan.new, filled after the table's last ANALYZE."""
    for name in ("plan.a", "plan.b", "plan.c"):
        topics.create_topic(keys.CONSOLE, name, 1)
        fill(name, 3000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_message")
    topics.create_topic(keys.CONSOLE, "plan.new", 1)
    return fill("plan.new", 5000)


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_read_of_a_partition_newer_than_the_statistics_uses_the_offset_index():
    found = plan(newer_than_the_statistics())
    assert "message_partition_offset_uniq" in found, found


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_fetch_by_name_of_a_partition_newer_than_the_statistics_uses_the_offset_index():
    """The fetch's read with its partition found by name (read.SELECT_MESSAGES_BY_NAME)."""
    newer_than_the_statistics()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + read.SELECT_MESSAGES_BY_NAME, ("plan.new", 0, 100, 200))
        found = "\n".join(row[0] for row in cursor.fetchall())
    assert "message_partition_offset_uniq" in found, found
    assert "message_partition_ts_idx" not in found, found


def referencing(table: str) -> set[str]:
    """The tables with a foreign key (a check at commit) to table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' "
            "AND confrelid = %s::regclass",
            [table],
        )
        return {name for (name,) in cursor.fetchall()}


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_message_rows_carry_no_foreign_key_check():
    """ADR 0017: PostgreSQL checked the partition of every message row at its commit; the
    other tables keep theirs."""
    checked = referencing("broker_partition")
    assert "broker_message" not in checked
    assert {"broker_inflight", "broker_groupoffset", "broker_partitionlease"} <= checked


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_produced_ids_carry_no_foreign_key_check():
    """ADR 0017 (session 41): every client id of every produce paid a check of its topic at
    commit; the other tables that name a topic keep theirs."""
    checked = referencing("broker_topic")
    assert "broker_producedid" not in checked
    assert {"broker_partition", "broker_scheduledmessage"} <= checked
