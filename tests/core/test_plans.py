"""PostgreSQL plans of the lookups by a topic, partition or group, on tables newer than their
statistics, and the indexes behind them (ADR 0027).

A partition that grew since the table's last ANALYZE is estimated at about one row, and the
planner then took the (partition, timestamp) index and filtered every row of the partition:
a read that cost in proportion to the partition's size (docs/benchmarks.md, PostgreSQL). A
topic's ids, its scheduled messages and its trace events the same way, and a partition's
offset for a time sorted every message from it on (session 42).
"""

import functools
from collections.abc import Callable

import orjson
import pytest
from django.db import connection

from broker import models
from broker.core import keys, log, topics, trace
from broker.core.log import append, delayed, read
from broker.core.records import NewMessage

pytestmark = pytest.mark.django_db(transaction=True)


def fill(topic: str, count: int) -> int:
    """A new topic of one partition with count messages; the partition's id."""
    topics.create_topic(keys.CONSOLE, topic, 1)
    for start in range(0, count, 1000):
        log.append_messages(
            keys.CONSOLE, topic, [NewMessage(orjson.dumps(i)) for i in range(start, start + 1000)]
        )
    return models.Partition.objects.get(topic__name=topic, number=0).id


def filled_after_analyze(table: str, fill: Callable[[str, int], int], count: int) -> int:
    """Three topics filled and table analyzed, then topic plan.new filled with count rows:
    PostgreSQL estimates plan.new's at about one row. What fill gave for plan.new."""
    for name in ("plan.a", "plan.b", "plan.c"):
        fill(name, 3000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")
    return fill("plan.new", count)


def plan(partition_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + read.SELECT_MESSAGES, (partition_id, 100, 200))
        return "\n".join(row[0] for row in cursor.fetchall())


def newer_than_the_statistics() -> int:
    """The id of partition 0 of topic plan.new, filled after the table's last ANALYZE."""
    return filled_after_analyze("broker_message", fill, 5000)


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


def test_offset_for_a_time_in_a_partition_newer_than_the_statistics_sorts_nothing():
    """Ordered by (timestamp, offset), which no index holds, the lookup sorted every message
    from the timestamp on; now two index ranges of (partition, timestamp). A MIN of the bare
    offset walked the (partition, offset) index from the partition's start instead."""
    partition_id = newer_than_the_statistics()
    times = sorted(
        models.Message.objects.filter(partition_id=partition_id).values_list(
            "timestamp_ms", flat=True
        )
    )
    explain = "EXPLAIN " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "
    with connection.cursor() as cursor:
        cursor.execute(
            explain + read.SELECT_OFFSET_AT_TIME, (partition_id, partition_id, times[2500])
        )
        found = "\n".join(str(row[-1]) for row in cursor.fetchall())
    assert "Sort" not in found, found
    assert "TEMP B-TREE" not in found, found  # SQLite's sort
    assert "message_partition_ts_idx" in found, found
    # The (partition, offset) index: message_partition_offset_uniq, SQLite's autoindex of it.
    assert "offset_uniq" not in found, found
    assert "autoindex_broker_message" not in found, found


def test_offset_for_a_time_is_the_lowest_of_the_first_timestamp_at_or_after_it():
    topics.create_topic(keys.CONSOLE, "times", 1)
    log.append_messages(keys.CONSOLE, "times", [NewMessage(orjson.dumps(i)) for i in range(4)])
    partition_id = models.Partition.objects.get(topic__name="times").id
    for offset, at in ((0, 1000), (1, 3000), (2, 2000), (3, 2000)):
        models.Message.objects.filter(partition_id=partition_id, offset=offset).update(
            timestamp_ms=at
        )
    assert [log.first_offset_at(partition_id, at) for at in (0, 1500, 2000, 2500, 3001)] == [
        0,
        2,
        2,
        1,
        None,
    ]


def with_ids(topic: str, count: int, delay_ms: int | None = None) -> int:
    """A new topic with count messages, a client id each ("<topic>-<i>"); its id."""
    topics.create_topic(keys.CONSOLE, topic, 1)
    for start in range(0, count, 1000):
        log.append_messages(
            keys.CONSOLE,
            topic,
            [
                NewMessage(b"1", client_id=f"{topic}-{i}", delay_ms=delay_ms)
                for i in range(start, start + 1000)
            ],
        )
    return models.Topic.objects.get(name=topic).id


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_id_lookup_of_a_topic_newer_than_the_statistics_probes_each_id():
    """Looked up as "client_id = ANY(%s)", the ids of a topic filled after the last ANALYZE
    were found by reading all of the topic's ids through the unique index's first column."""
    topic_id = filled_after_analyze("broker_producedid", with_ids, 5000)
    asked = [f"plan.new-{i}" for i in range(4950, 5050)]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + append.KNOWN_IDS_PG, (asked, topic_id))
        found = "\n".join(row[0] for row in cursor.fetchall())
    assert "Nested Loop" in found, found
    assert "Index Scan using producedid_topic_id_uniq" in found, found
    assert "client_id)::text = c.client_id" in found, found
    assert append.known_ids(topic_id, set(asked), log.now_ms()).keys() == set(asked[:50])


def test_scheduled_id_lookup_of_a_topic_newer_than_the_statistics_uses_the_ids_index():
    """A delayed produce's ids: looked up with the topic, the plan took the topic's index
    and read all of the topic's scheduled messages. Sequential scans are off on PostgreSQL:
    at this test's size one is cheaper than 100 probes, as it is not at a queue's."""
    filled_after_analyze(
        "broker_scheduledmessage", functools.partial(with_ids, delay_ms=3_600_000), 5000
    )
    asked = {f"plan.new-{i}" for i in range(4950, 5050)}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET enable_seqscan = off")
        found = delayed.with_client_ids(asked).explain()
        if connection.vendor == "postgresql":
            cursor.execute("RESET enable_seqscan")
    assert "scheduled_client_id_topic_uniq" in found, found
    assert "topic_id" not in found, found
    assert {row.client_id for row in delayed.with_client_ids(asked)} == {
        f"plan.new-{i}" for i in range(4950, 5000)
    }


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_trace_of_a_message_of_a_topic_newer_than_the_statistics_uses_the_message_index():
    """A message's trace: the topic's own index was taken, and all its events read."""

    def traced(topic: str, count: int) -> int:
        topics.create_topic(keys.CONSOLE, topic, 1)
        topic_id = models.Topic.objects.get(name=topic).id
        trace.record([trace.event(topic_id, 0, i, "produced", at_ms=1) for i in range(count)])
        return topic_id

    topic_id = filled_after_analyze("broker_traceevent", traced, 20000)
    found = trace.get_trace(keys.CONSOLE, "plan.new", 0, 10)
    assert [t.event for t in found] == ["produced"]
    query = models.TraceEvent.objects.filter(  # trace.get_trace's
        topic_id=topic_id, partition_number=0, offset=10
    ).order_by("at_ms", "id")
    plan = query.explain()
    assert "trace_message_idx" in plan, plan


def test_no_index_of_one_column_that_a_longer_index_leads_with():
    """Migrations 0012, 0014 and 0015: such an index served nothing the longer one does not,
    cost every insert its upkeep, and with stale statistics PostgreSQL took it for lookups
    naming more columns (the produced ids, a message's trace). Introspection does not tell a
    partial index, which would not serve every lookup by its first column: no broker table's
    partial index leads with a column that has an index of its own."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            if not table.startswith("broker_"):
                continue
            indexes = connection.introspection.get_constraints(cursor, table).values()
            leading = [
                i["columns"][0]
                for i in indexes
                if (i["index"] or i["unique"]) and len(i["columns"]) > 1
            ]
            found += [
                f"{table}.{i['columns'][0]}"
                for i in indexes
                if i["index"]
                and not i["unique"]
                and len(i["columns"]) == 1
                and i["columns"][0] in leading
            ]
    assert found == []


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
