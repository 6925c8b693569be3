"""Appending to the log: check and plan a batch, dedup client ids, assign offsets, insert.

See docs/architecture.md#life-of-a-message and #locks.
"""

import functools
import time
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import orjson
from django.db import IntegrityError, transaction
from django.db.models import Sum

from broker import models
from broker import settings as ferry_settings
from broker.core import bulk, errors, events, keys, partitioning, topics, trace
from broker.core.log import delayed, recent
from broker.core.records import AppendResult, NewMessage, Principal

# Raw SQL on the produce hot path: the ORM's bulk_create costs more per row than the insert
# itself (docs/benchmarks.md). Plain SQL that runs on SQLite and PostgreSQL; "offset" and "key"
# are quoted because they are reserved words on PostgreSQL.
MESSAGE_COLUMNS = (
    "partition_id",
    "offset",
    "timestamp_ms",
    "key",
    "tag",
    "headers",
    "value",
    "is_json",
    "size_bytes",
    "client_id",
)
# One row per statement: what the benchmark's raw baseline runs with executemany.
INSERT_MESSAGES = (
    'INSERT INTO broker_message (partition_id, "offset", timestamp_ms, "key", tag, headers, '
    "value, is_json, size_bytes, client_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_DEDUP_ATTEMPTS = 3


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Planned(NamedTuple):
    partition: int
    message: NewMessage
    size_bytes: int
    # Set for a delayed message: stored in the schedule, appended when due.
    due_ms: int | None = None


def in_partition(messages: list[NewMessage], partition: int) -> list[NewMessage]:
    """The messages of a produce to one partition's URL, each placed in that partition.

    A message that names another partition is refused (nothing is stored); one that names
    none goes there instead of where its key would send it. A number past the topic's
    partitions is refused by the append, as a message's own would be.
    """
    for index, message in enumerate(messages):
        if message.partition is not None and message.partition != partition:
            raise errors.InvalidMessage(
                f"Message {index} names partition {message.partition}; this request produces "
                f"to partition {partition} only.",
                index=index,
                partition=message.partition,
            )
    return [m if m.partition == partition else m._replace(partition=partition) for m in messages]


def message_size(message: NewMessage) -> int:
    """What counts against max_message_bytes: value, key and headers, in bytes."""
    size = len(message.value)
    if message.key is not None:
        size += len(message.key.encode())
    for name, value in message.headers.items():
        size += len(name.encode()) + len(value.encode())
    return size


def _plan(
    topic: models.Topic, messages: list[NewMessage], check_size: bool = True
) -> list[_Planned]:
    """Validate every message and choose its partition, before anything is written."""
    partitions = partitioning.choose_partitions(
        topic.partition_count, topic.id, [(m.partition, m.key) for m in messages]
    )
    count, max_bytes = topic.partition_count, topic.max_message_bytes
    now = now_ms()
    planned = []
    for index, message in enumerate(messages):
        if message.partition is not None and not 0 <= message.partition < count:
            raise errors.PartitionNotFound(
                f"Topic {topic.name!r} has partitions 0 to {count - 1}.",
                index=index,
                partition=message.partition,
            )
        # The common message has no key and no headers: skip the call.
        if message.key is None and not message.headers:
            size = len(message.value)
        else:
            size = message_size(message)
        if check_size and size > max_bytes:
            raise errors.MessageTooLarge(
                f"Message {index} is {size} bytes; topic {topic.name!r} accepts at most "
                f"{topic.max_message_bytes}.",
                index=index,
                size_bytes=size,
                max_message_bytes=topic.max_message_bytes,
            )
        due = delayed.due_ms(message, now, index) if message.is_delayed else None
        if message.timestamp_ms is not None and (message.is_delayed or message.timestamp_ms < 0):
            raise errors.InvalidMessage(
                f"Message {index}: timestamp_ms is a time at or after 1970, and a delayed "
                "message takes the time it is released.",
                index=index,
            )
        planned.append(_Planned(partitions[index], message, size, due))
    return planned


def append_messages(
    principal: Principal, topic_name: str, messages: list[NewMessage]
) -> list[AppendResult]:
    """Append a batch in one transaction; results are in the batch's order."""
    topic, plan = checked_batch(principal, topic_name, messages)
    if unseen_ids_likely():
        try:
            return _append_planned(topic, plan, ids_unseen=True)
        except IntegrityError:
            met_stored_id()  # one of them is stored: look them up, below
    for attempt in range(_DEDUP_ATTEMPTS):
        try:
            return _append_planned(topic, plan)
        except IntegrityError:
            # PostgreSQL only: a concurrent producer stored one of these client ids between our
            # lookup and our insert. The retry sees it and answers duplicate.
            if attempt == _DEDUP_ATTEMPTS - 1:
                raise errors.BrokerError("Could not store the batch; retry it.") from None
    raise AssertionError("unreachable")


# A batch's client ids are stored without a lookup first (ids_unseen): ids are new but for a
# producer's retries, and a lookup costs PostgreSQL a probe of the unique index an id and
# the batch a round trip, which the insert's own check of the index makes again. A batch that
# meets a stored id rolls back and is appended again after a lookup. Retries come in bursts
# (a producer's after a timeout, all of them after an outage), so after one the process looks
# ids up first for a while, instead of rolling back every batch of the burst.
LOOK_UP_IDS_FOR_SECONDS = 10.0
_look_up_ids_until = 0.0


def unseen_ids_likely() -> bool:
    """Whether a batch's client ids are stored without a lookup first (ids_unseen)."""
    return time.monotonic() >= _look_up_ids_until


def met_stored_id() -> None:
    """A batch stored with ids_unseen met a stored client id: look ids up for a while."""
    global _look_up_ids_until
    _look_up_ids_until = time.monotonic() + LOOK_UP_IDS_FOR_SECONDS


def checked_batch(
    principal: Principal,
    topic_name: str,
    messages: list[NewMessage],
    known: dict[str, models.Topic] | None = None,
) -> tuple[models.Topic, list[_Planned]]:
    """Everything append_messages checks before its transaction; the topic and the plan.

    known: topics already read by name (group commit reads them all in one query).
    """
    topics.validate_name(topic_name)
    keys.require(principal, topic_name, "produce")
    if not messages:
        raise errors.InvalidRequest("A batch needs at least one message.")
    limit = ferry_settings.get("MAX_BATCH_MESSAGES")
    if len(messages) > limit:
        raise errors.BatchTooLarge(
            f"A batch holds at most {limit} messages.", messages=len(messages), limit=limit
        )
    if known is not None:
        topic = known.get(topic_name)
    else:
        topic = models.Topic.objects.filter(name=topic_name).first()
    if topic is None:
        if not ferry_settings.get("AUTO_CREATE_TOPICS"):
            raise errors.TopicNotFound(name=topic_name)
        # Checked against the topic it would create first: a bad batch creates nothing.
        _plan(topics.draft_topic(topic_name), messages)
        topic = topics.create_for_produce(topic_name)
        if known is not None:
            known[topic_name] = topic
    return topic, _plan(topic, messages)


def _append_planned(
    topic: models.Topic, plan: list[_Planned], *, ids_unseen: bool = False
) -> list[AppendResult]:
    with transaction.atomic(durable=True):
        return _append_in_transaction(topic, plan, ids_unseen=ids_unseen)


def append_planned_in_transaction(
    topic: models.Topic, plan: list[_Planned], *, ids_unseen: bool = False
) -> list[AppendResult]:
    """Append a checked batch (checked_batch). Caller holds the write transaction.

    ids_unseen: see _append_in_transaction; the caller rolls back on IntegrityError."""
    return _append_in_transaction(topic, plan, ids_unseen=ids_unseen)


def append_in_transaction(topic: models.Topic, messages: list[NewMessage]) -> list[AppendResult]:
    """Append due delayed messages as they were accepted: no permission or size check again.

    Caller holds the write transaction (scheduling.release_due).
    """
    return _append_in_transaction(topic, _plan(topic, messages, check_size=False))


def _append_in_transaction(
    topic: models.Topic, plan: list[_Planned], *, ids_unseen: bool = False
) -> list[AppendResult]:
    """Dedup, schedule delayed messages, store the rest. Caller holds the write transaction.

    ids_unseen: store the client ids without looking them up first, as if none were stored;
    one that is raises IntegrityError (on PostgreSQL by the COMMIT), and the caller appends
    again with ids_unseen False (see unseen_ids_likely).
    """
    timestamp_ms = now_ms()
    results: list[AppendResult | None] = [None] * len(plan)
    existing: dict[str, tuple[int, int]] = {}
    if not ids_unseen:  # unseen: not even the set of ids, a loop over the batch
        client_ids = {
            p.message.client_id
            for p in plan
            if p.message.client_id is not None and p.due_ms is None
        }
        if client_ids:
            existing = known_ids(topic.id, client_ids, timestamp_ms)
    first_index: dict[str, int] = {}
    duplicate_of: dict[int, int] = {}
    to_store: list[int] = []
    later: list[tuple[int, NewMessage, int]] = []
    for index, planned in enumerate(plan):
        if planned.due_ms is not None:
            later.append((index, planned.message, planned.due_ms))
            continue
        client_id = planned.message.client_id
        if client_id is not None:
            if client_id in existing:
                partition, offset = existing[client_id]
                results[index] = AppendResult(partition, offset, duplicate=True)
                continue
            if client_id in first_index:
                duplicate_of[index] = first_index[client_id]
                continue
            first_index[client_id] = index
        to_store.append(index)
    if to_store:
        placed = _store(topic, plan, to_store, results)
        if first_index:
            # Sorted: concurrent producers insert shared ids in one order, so on PostgreSQL
            # they wait on each other instead of deadlocking. Unseen, with the COMMIT (or a
            # COPY: bulk.insert_rows), which a stored id then fails, and the caller appends
            # again. Looked up, now: a concurrent producer's id then fails this statement,
            # inside the savepoint that retries the request on its own.
            bulk.insert_rows(
                "broker_producedid",
                ID_COLUMNS,
                [
                    (topic.id, client_id, *placed[i], timestamp_ms)
                    for client_id, i in sorted(first_index.items())
                ],
                now=not ids_unseen,
            )
    if to_store and topic.trace:
        trace.record(
            [
                trace.event(topic.id, r.partition, r.offset, "produced", at_ms=timestamp_ms)
                for i in to_store
                if (r := results[i]) is not None
                and r.partition is not None
                and r.offset is not None
            ]
        )
    if later:
        ids = {m.client_id for _, m, _ in later if m.client_id is not None}
        released = known_ids(topic.id, ids, timestamp_ms) if ids else {}
        delayed.schedule_in_transaction(topic, later, results, timestamp_ms, released)
    for index, first in duplicate_of.items():
        original = results[first]
        if original is not None:
            results[index] = AppendResult(original.partition, original.offset, duplicate=True)
    return [r for r in results if r is not None]


# Raw SQL, as the messages' insert: through the ORM a batch's ids cost the broker 2.3 times
# the CPU of the batch without them (docs/benchmarks.md, session 41).
KNOWN_IDS = (
    'SELECT id, client_id, partition_number, "offset", created_ms FROM broker_producedid '
    "WHERE topic_id = %s AND client_id = ANY(%s)"
)
# PostgreSQL: one lookup an id in producedid_topic_id_uniq, whatever its statistics say. With
# "client_id = ANY(%s)", a plan made while they were stale (a new topic, a table not yet
# analyzed) read the topic's every id through the index's first column and filtered them:
# milliseconds a request, growing with the topic (docs/benchmarks.md, session 42). Here each
# lookup names both columns of the unique index; OFFSET 0 keeps the loop from being
# flattened into a join the planner could turn back into that scan.
KNOWN_IDS_PG = (
    'SELECT p.id, p.client_id, p.partition_number, p."offset", p.created_ms '
    "FROM unnest(%s::text[]) AS c (client_id) CROSS JOIN LATERAL ("
    'SELECT id, client_id, partition_number, "offset", created_ms FROM broker_producedid '
    "WHERE topic_id = %s AND client_id = c.client_id OFFSET 0) AS p"
)
# Ids past the window no longer deduplicate; their rows would trip the unique constraint.
EXPIRED_IDS = "DELETE FROM broker_producedid WHERE id = ANY(%s)"
ID_COLUMNS = ("topic_id", "client_id", "partition_number", "offset", "created_ms")


def known_ids(topic_id: int, client_ids: set[str], timestamp_ms: int) -> dict[str, tuple[int, int]]:
    """Client ids already stored within the dedup window. Caller holds the write transaction.

    The rows of expired ids found are deleted, for the new ones to take their place."""
    cutoff_ms = timestamp_ms - ferry_settings.get("DEDUP_WINDOW_SECONDS") * 1000
    ids = bulk.id_array(sorted(client_ids))
    if bulk.vendor() == "postgresql":
        rows = bulk.run(KNOWN_IDS_PG, (ids, topic_id))
    else:
        rows = bulk.run(bulk.for_ids(KNOWN_IDS), (topic_id, ids))
    known: dict[str, tuple[int, int]] = {}
    expired: list[int] = []
    for row_id, client_id, partition, offset, created_ms in rows:
        if created_ms >= cutoff_ms:
            known[client_id] = (partition, offset)
        else:
            expired.append(row_id)
    if expired:
        bulk.run(bulk.for_ids(EXPIRED_IDS), (bulk.id_array(expired),))
    return known


# Raw SQL on the produce hot path: the ORM would compile these for every batch.
SELECT_PARTITIONS = (
    "SELECT id, topic_id, number, next_offset, start_offset, bytes_stored FROM broker_partition "
    "WHERE topic_id = %s AND number IN ({}) ORDER BY number"
)
UPDATE_PARTITION = (
    "UPDATE broker_partition SET next_offset = %s, start_offset = %s, bytes_stored = %s "
    "WHERE id = %s"
)


def _locked_partitions(topic_id: int, numbers: list[int]) -> dict[int, models.Partition]:
    """The partitions, locked in number order. Caller holds the write transaction."""
    sql = SELECT_PARTITIONS.format(", ".join(["%s"] * len(numbers)))
    if bulk.vendor() == "postgresql":
        # Partition row locks, in number order: serialize offset assignment per partition.
        sql += " FOR NO KEY UPDATE"
    rows = bulk.run(sql, [topic_id, *numbers])
    return {
        number: models.Partition(
            id=pid,
            topic_id=tid,
            number=number,
            next_offset=nxt,
            start_offset=start,
            bytes_stored=size,
        )
        for pid, tid, number, nxt, start, size in rows
    }


def _store(
    topic: models.Topic,
    plan: list[_Planned],
    to_store: list[int],
    results: list[AppendResult | None],
) -> dict[int, tuple[int, int]]:
    """Assign offsets and insert; returns index -> (partition, offset). Caller holds the lock."""
    numbers = sorted({plan[i].partition for i in to_store})
    partitions = _locked_partitions(topic.id, numbers)
    # Stamped under the lock, so timestamps follow offsets within a partition (one clock).
    timestamp_ms = now_ms()
    if len(partitions) != len(numbers):
        raise errors.TopicNotFound(name=topic.name)
    if topic.capacity is not None and topic.overflow_policy == models.Topic.Overflow.REJECT:
        incoming = Counter(plan[i].partition for i in to_store)
        for number, count in incoming.items():
            p = partitions[number]
            if p.next_offset - p.start_offset + count > topic.capacity:
                raise errors.TopicFull(
                    f"Partition {number} of {topic.name!r} holds "
                    f"{p.next_offset - p.start_offset} of {topic.capacity} messages.",
                    partition=number,
                    capacity=topic.capacity,
                    incoming=count,
                )
    # Plain dicts and locals in the per-message loop: it runs once per message of every batch.
    next_offset = {n: p.next_offset for n, p in partitions.items()}
    partition_id = {n: p.id for n, p in partitions.items()}
    partition_number = {p.id: n for n, p in partitions.items()}
    added_bytes = dict.fromkeys(partitions, 0)
    rows: list[tuple[object, ...]] = []
    placed: dict[int, tuple[int, int]] = {}
    for index in to_store:
        number, message, size, _ = plan[index]
        offset = next_offset[number]
        next_offset[number] = offset + 1
        added_bytes[number] += size
        headers = message.headers
        rows.append(
            (
                partition_id[number],
                offset,
                timestamp_ms if message.timestamp_ms is None else message.timestamp_ms,
                message.key,
                message.tag,
                orjson.dumps(headers).decode() if headers else "{}",
                message.value,
                message.is_json,
                size,
                message.client_id,
            )
        )
        results[index] = AppendResult(number, offset, False)
        placed[index] = (number, offset)
    _insert_rows(rows)
    recent.keep_on_commit(topic.created_at, partition_number, rows)
    for number, p in partitions.items():
        p.next_offset = next_offset[number]
        p.bytes_stored += added_bytes[number]
        if topic.capacity is not None and p.next_offset - p.start_offset > topic.capacity:
            # drop_oldest: the reject policy raised above, before any insert.
            truncate(p, p.next_offset - topic.capacity)
    rows_out = [(p.next_offset, p.start_offset, p.bytes_stored, p.id) for p in partitions.values()]
    if bulk.vendor() == "postgresql":
        # One statement, with the COMMIT (bulk.defer): the partition locks are held a round
        # trip less.
        bulk.defer(
            _update_partitions(len(rows_out)),
            [v for row in rows_out for v in row],
            table="broker_partition",
        )
    else:
        bulk.run_many(UPDATE_PARTITION, rows_out)
    events.messages_appended(topic.id, {p.number: p.next_offset for p in partitions.values()})
    return placed


@functools.cache
def _update_partitions(count: int) -> str:
    """UPDATE_PARTITION for count partitions in one statement (PostgreSQL)."""
    values = ", ".join(["(%s::bigint, %s::bigint, %s::bigint, %s::bigint)"] * count)
    # Placeholders only: count comes from the code, never input.
    return (
        "UPDATE broker_partition AS p SET next_offset = v.next_offset, "  # noqa: S608
        "start_offset = v.start_offset, bytes_stored = v.bytes_stored "
        f"FROM (VALUES {values}) AS v (next_offset, start_offset, bytes_stored, id) "
        "WHERE p.id = v.id"
    )


def _insert_rows(rows: Sequence[tuple[object, ...]]) -> None:
    """Insert message rows in bulk. Caller holds the transaction."""
    bulk.insert_rows("broker_message", MESSAGE_COLUMNS, rows)


def truncate(partition: models.Partition, new_start: int) -> int:
    """Delete messages below new_start and advance start_offset. Caller holds the partition lock."""
    if new_start <= partition.start_offset:
        return 0
    doomed = models.Message.objects.filter(partition_id=partition.id, offset__lt=new_start)
    freed = doomed.aggregate(total=Sum("size_bytes"))["total"] or 0
    doomed.delete()
    removed = new_start - partition.start_offset
    partition.start_offset = new_start
    partition.bytes_stored = max(0, partition.bytes_stored - freed)
    return removed
