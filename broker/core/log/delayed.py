"""Delayed messages taken in: when each is due, and storing it in the schedule with its batch.

A produce with delayed messages stores them in the appending transaction, deduplicated by client
id like the rest of the batch (semantics.md#delayed-messages). Listing, cancelling, moving and
releasing them when due is scheduling.py's, a layer above the log.
"""

from django.db.models import QuerySet

from broker import models
from broker import settings as ferry_settings
from broker.core import errors
from broker.core.records import AppendResult, NewMessage

# RocketMQ's delay levels 1..18 (messageDelayLevel): 1s 5s 10s 30s 1m 2m 3m … 10m 20m 30m 1h 2h.
LEVELS_MS = tuple(
    seconds * 1000
    for seconds in (
        1,
        5,
        10,
        30,
        60,
        120,
        180,
        240,
        300,
        360,
        420,
        480,
        540,
        600,
        1200,
        1800,
        3600,
        7200,
    )
)


def due_ms(message: NewMessage, now_ms: int, index: int = 0) -> int:
    """When a delayed message becomes visible; InvalidMessage for a bad or too long delay."""
    given = [
        name
        for name, value in (
            ("delay_ms", message.delay_ms),
            ("deliver_at_ms", message.deliver_at_ms),
            ("level", message.delay_level),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise errors.InvalidMessage(
            f"Message {index}: give at most one of delay_ms, deliver_at_ms and level.",
            index=index,
            given=given,
        )
    if message.delay_level is not None:
        if not 1 <= message.delay_level <= len(LEVELS_MS):
            raise errors.InvalidMessage(
                f"Message {index}: level is 1 to {len(LEVELS_MS)}.", index=index
            )
        due = now_ms + LEVELS_MS[message.delay_level - 1]
    elif message.delay_ms is not None:
        if message.delay_ms < 0:
            raise errors.InvalidMessage(f"Message {index}: delay_ms is negative.", index=index)
        due = now_ms + message.delay_ms
    else:
        due = message.deliver_at_ms or 0
        if due < 0:
            raise errors.InvalidMessage(
                f"Message {index}: deliver_at_ms is milliseconds since 1970, not negative.",
                index=index,
            )
    limit_ms = ferry_settings.get("MAX_DELAY_SECONDS") * 1000
    if due - now_ms > limit_ms:
        raise errors.InvalidMessage(
            f"Message {index}: delays are at most {limit_ms // 1000} s.",
            index=index,
            max_delay_seconds=limit_ms // 1000,
        )
    return due


def with_client_ids(ids: set[str]) -> QuerySet[models.ScheduledMessage]:
    """The scheduled messages with these client ids, on any topic: the caller checks it.
    Named in the query, the topic let PostgreSQL with stale statistics read all of the
    topic's scheduled messages through its index (docs/benchmarks.md, session 42); the ids'
    unique index leads with them."""
    return models.ScheduledMessage.objects.filter(client_id__in=ids)


def schedule_in_transaction(
    topic: models.Topic,
    delayed: list[tuple[int, NewMessage, int]],
    results: list[AppendResult | None],
    now_ms: int,
    released: dict[str, tuple[int, int]],
) -> None:
    """Store (index, message, due_ms) entries; fill results. Caller holds the write transaction.

    A client id seen before answers duplicate: still scheduled (its scheduled id), or already
    released within the dedup window (its partition and offset: released, append.known_ids of
    the delayed messages' client ids).
    """
    ids = {m.client_id for _, m, _ in delayed if m.client_id is not None}
    pending = {row.client_id: row for row in with_client_ids(ids) if row.topic_id == topic.id}
    seen: dict[str, int] = {}
    duplicate_of: dict[int, int] = {}
    rows: list[tuple[int, models.ScheduledMessage]] = []
    for index, message, due in delayed:
        client_id = message.client_id
        if client_id is not None:
            if client_id in pending:
                row = pending[client_id]
                results[index] = AppendResult(None, None, True, row.id, row.due_ms)
                continue
            if client_id in released:
                partition, offset = released[client_id]
                results[index] = AppendResult(partition, offset, True)
                continue
            if client_id in seen:
                duplicate_of[index] = seen[client_id]
                continue
            seen[client_id] = index
        rows.append(
            (
                index,
                models.ScheduledMessage(
                    topic_id=topic.id,
                    due_ms=due,
                    partition_number=message.partition,
                    key=message.key,
                    tag=message.tag,
                    headers=message.headers,
                    value=message.value,
                    is_json=message.is_json,
                    client_id=client_id,
                    created_ms=now_ms,
                ),
            )
        )
    created = models.ScheduledMessage.objects.bulk_create([row for _, row in rows])
    for (index, _), row in zip(rows, created, strict=True):
        results[index] = AppendResult(None, None, False, row.id, row.due_ms)
    # A repeated id inside the batch points at the first one's schedule.
    for index, first in duplicate_of.items():
        original = results[first]
        if original is not None:
            results[index] = original._replace(duplicate=True)
