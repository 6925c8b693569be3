"""Reading the log: fetch a partition's messages (long-polling too), look offsets up by time."""

import datetime
from typing import Any, NamedTuple

from broker import models
from broker import settings as ferry_settings
from broker.core import bulk, dbthreads, errors, events, keys, topics
from broker.core.log import recent
from broker.core.records import FetchResult, OffsetLookup, Principal, StoredMessage

# Raw SELECTs for the fetch hot path: the ORM would compile the query on every fetch, parse
# every row's headers and run per-row converters; edges send the headers' JSON text on as is.
SELECT_PARTITION = (
    "SELECT p.id, p.topic_id, p.start_offset, p.next_offset FROM broker_partition p "
    "JOIN broker_topic t ON t.id = p.topic_id WHERE t.name = %s AND p.number = %s"
)
# headers as text in the statement: a row's loader in C, not a binary jsonb's in Python.
SELECT_MESSAGES = (
    'SELECT "offset", timestamp_ms, "key", tag, CAST(headers AS text), value, is_json, client_id '
    'FROM broker_message WHERE partition_id = %s AND "offset" >= %s AND "offset" < %s '
    'ORDER BY "offset"'
)


# SELECT_MESSAGES with the partition found by its topic's name and its number: a fetch from a
# given offset reads its messages in the round trip that reads the partition's row.
SELECT_MESSAGES_BY_NAME = SELECT_MESSAGES.replace(
    "partition_id = %s",
    "partition_id = (SELECT p.id FROM broker_partition p JOIN broker_topic t "
    "ON t.id = p.topic_id WHERE t.name = %s AND p.number = %s)",
)


# The largest offset a statement's parameter can carry (a bigint): a fetch past the end asks
# for offsets up to it, before the range check refuses it.
INT64_MAX = 2**63 - 1


class _PartitionRow(NamedTuple):
    id: int
    topic_id: int
    start_offset: int
    next_offset: int


def _partition_row(rows: list[tuple[Any, ...]], topic_name: str, number: int) -> _PartitionRow:
    """The partition's row found by SELECT_PARTITION, or the error for its absence."""
    if rows:
        return _PartitionRow(*rows[0])
    if not models.Topic.objects.filter(name=topic_name).exists():
        raise errors.TopicNotFound(name=topic_name)
    raise errors.PartitionNotFound(topic=topic_name, partition=number)


def _stored(number: int, rows: list[tuple[Any, ...]]) -> list[StoredMessage]:
    return [
        StoredMessage(number, o, ts, key, tag, headers, bytes(value), bool(is_json), client_id)
        for o, ts, key, tag, headers, value, is_json, client_id in rows
    ]


def read_partition(partition_id: int, number: int, offset: int, limit: int) -> list[StoredMessage]:
    """Stored messages of one partition from offset on, at most limit (no permission check)."""
    # Offsets are contiguous, so the range alone bounds the rows to limit.
    return _stored(number, bulk.run(SELECT_MESSAGES, (partition_id, offset, offset + limit)))


def read_partition_ahead(partition_id: int, offset: int, limit: int) -> None:
    """Announce read_partition(partition_id, _, offset, limit) as the transaction's next read
    (bulk.read_ahead): on PostgreSQL it comes back with the statement that runs next. What this
    process keeps of the partition from offset on (log/recent.py) is not read: only the rest,
    which read_locked reads next."""
    end = recent.kept_end(partition_id, offset)
    if end is None:
        bulk.read_ahead(SELECT_MESSAGES, (partition_id, offset, offset + limit))
    elif end < offset + limit:
        bulk.read_ahead(SELECT_MESSAGES, (partition_id, end, offset + limit))


def read_locked(
    partition: models.Partition, stamp: datetime.datetime, offset: int, limit: int
) -> list[StoredMessage]:
    """read_partition for a caller that locked the partition's offsets row in this transaction
    and read the partition's row with it, from offset (at least its start_offset, below its
    next_offset) on: what this process keeps of those messages (log/recent.py), or else the
    database's. stamp: the topic's created_at."""
    stop = min(offset + limit, partition.next_offset)
    kept = recent.take(partition.id, stamp, offset, stop)
    if kept is not None:
        return kept
    return read_partition(partition.id, partition.number, offset, limit)


def read_messages(
    principal: Principal, topic_name: str, partition: int, offset: int | None, limit: int
) -> FetchResult:
    """Messages of one partition from offset (default: its start offset), at most limit."""
    max_limit = ferry_settings.get("MAX_FETCH_MESSAGES")
    if not 1 <= limit <= max_limit:
        raise errors.InvalidRequest(f"limit must be between 1 and {max_limit}.", limit=limit)
    topics.validate_name(topic_name)
    keys.require(principal, topic_name, "consume")
    statements: list[tuple[str, tuple[Any, ...]]] = [(SELECT_PARTITION, (topic_name, partition))]
    if offset is not None:
        # Read with the partition's row (one round trip on PostgreSQL); not used when the
        # offset turns out to be outside the partition's range.
        by_name = (topic_name, partition, offset, min(offset + limit, INT64_MAX))
        statements.append((SELECT_MESSAGES_BY_NAME, by_name))
    found = bulk.run_together(statements)
    p = _partition_row(found[0], topic_name, partition)
    start = p.start_offset if offset is None else offset
    if not p.start_offset <= start <= p.next_offset:
        raise errors.OffsetOutOfRange(
            f"Offset {start} is outside partition {partition}'s range "
            f"{p.start_offset}..{p.next_offset}.",
            offset=start,
            start_offset=p.start_offset,
            end_offset=p.next_offset,
        )
    if offset is None:
        messages = read_partition(p.id, partition, start, limit)
    else:
        messages = _stored(partition, found[1])
    next_offset = messages[-1].offset + 1 if messages else start
    return FetchResult(
        topic_id=p.topic_id,
        partition=partition,
        messages=tuple(messages),
        next_offset=next_offset,
        start_offset=p.start_offset,
        end_offset=max(p.next_offset, next_offset),
    )


def validate_max_wait(max_wait_ms: int) -> None:
    limit = ferry_settings.get("MAX_WAIT_MS")
    if not 0 <= max_wait_ms <= limit:
        raise errors.InvalidRequest(
            f"max_wait_ms must be between 0 and {limit}.", max_wait_ms=max_wait_ms
        )


async def read_messages_async(
    principal: Principal,
    topic_name: str,
    partition: int,
    offset: int | None,
    limit: int,
    max_wait_ms: int,
) -> FetchResult:
    """read_messages, waiting up to max_wait_ms for a message when there is none yet."""
    validate_max_wait(max_wait_ms)
    return await events.long_poll(
        lambda: dbthreads.read(read_messages, principal, topic_name, partition, offset, limit),
        is_empty=lambda r: not r.messages,
        topic_id_of=lambda r: r.topic_id,
        max_wait_ms=max_wait_ms,
    )


# The first timestamp at or after the asked one, then the lowest offset stored at it: each an
# index range on (partition, timestamp) whatever the statistics say. One statement ordered by
# (timestamp_ms, offset), which that index does not hold, was planned with stale statistics as
# a sort of every message from the timestamp on (docs/benchmarks.md, session 42). "+ 0": a
# MIN of the bare column let both databases walk the (partition, offset) index from the
# partition's start up to the time instead.
SELECT_OFFSET_AT_TIME = (
    'SELECT MIN("offset" + 0) FROM broker_message WHERE partition_id = %s AND timestamp_ms = ('
    "SELECT timestamp_ms FROM broker_message WHERE partition_id = %s AND timestamp_ms >= %s "
    "ORDER BY timestamp_ms LIMIT 1)"
)


def first_offset_at(partition_id: int, timestamp_ms: int) -> int | None:
    """The offset of the first message stored at or after timestamp_ms (by timestamp, then
    offset), or None when there is none that recent."""
    ((found,),) = bulk.run(SELECT_OFFSET_AT_TIME, (partition_id, partition_id, timestamp_ms))
    return None if found is None else int(found)


def offset_for_timestamp(partition: models.Partition, timestamp_ms: int) -> int:
    """The first offset stored at or after timestamp_ms, else the end offset (Kafka's lookup)."""
    first = first_offset_at(partition.id, timestamp_ms)
    return partition.next_offset if first is None else first


def list_offsets(
    principal: Principal, topic_name: str, timestamp_ms: int | None = None
) -> list[OffsetLookup]:
    """Per partition: start and end offsets, and the first offset at or after timestamp_ms."""
    info = topics.get_topic(principal, topic_name)
    found: dict[int, int] = {}
    if timestamp_ms is not None:
        for p in models.Partition.objects.filter(topic_id=info.id):
            found[p.number] = offset_for_timestamp(p, timestamp_ms)
    return [
        OffsetLookup(
            partition=p.number,
            start_offset=p.start_offset,
            end_offset=p.end_offset,
            offset_for_timestamp=found.get(p.number),
        )
        for p in info.partitions
    ]
