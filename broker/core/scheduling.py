"""Delayed messages: list, cancel, move, and release_due (docs/semantics.md#delayed-messages).

A delayed message is stored at once (durable) but invisible: it is appended to its topic, and
gets its partition and offset, only when due. Taking it in is the append's (log/delayed.py, in
the producing transaction); this module, a layer above the log, lists, cancels and moves it.
release_due claims due rows with SKIP LOCKED and deletes them in the transaction that appends
them, so several schedulers release each message exactly once, also across a restart.
"""

import logging
from collections import defaultdict

from django.db import transaction
from django.db.models import BigIntegerField, Count, ExpressionWrapper, F, Max, QuerySet

from broker import models
from broker import settings as ferry_settings
from broker.core import errors, keys, log, topics
from broker.core.records import NewMessage, Principal, ScheduledInfo

logger = logging.getLogger(__name__)

# A topic that refuses a due message (capacity full) gets it again this much later, so the
# rows behind it keep flowing.
RETRY_FULL_MS = 1000


def _info(row: models.ScheduledMessage, topic_name: str) -> ScheduledInfo:
    return ScheduledInfo(
        id=row.id,
        topic=topic_name,
        deliver_at_ms=row.due_ms,
        partition=row.partition_number,
        key=row.key,
        tag=row.tag,
        headers=row.headers,
        value=bytes(row.value),
        is_json=row.is_json,
        client_id=row.client_id,
        created_ms=row.created_ms,
    )


def list_scheduled(
    principal: Principal, topic_name: str, limit: int = 100, after_id: int | None = None
) -> list[ScheduledInfo]:
    """A topic's scheduled messages, soonest first (then by id); page with after_id."""
    topic = topics.get_topic(principal, topic_name, "consume")
    max_limit = ferry_settings.get("MAX_FETCH_MESSAGES")
    if not 1 <= limit <= max_limit:
        raise errors.InvalidRequest(f"limit must be between 1 and {max_limit}.", limit=limit)
    rows = models.ScheduledMessage.objects.filter(topic_id=topic.id).order_by("due_ms", "id")
    if after_id is not None:
        after = models.ScheduledMessage.objects.filter(id=after_id, topic_id=topic.id).first()
        if after is not None:
            rows = rows.filter(due_ms__gte=after.due_ms).exclude(
                due_ms=after.due_ms, id__lte=after.id
            )
    return [_info(row, topic.name) for row in rows[:limit]]


def _locked_visible(principal: Principal, scheduled_id: int) -> models.ScheduledMessage:
    """The scheduled row, locked, if the principal may produce to its topic.

    Caller holds the transaction. ScheduledNotFound once released or cancelled, and for a
    topic the key may not produce to: what it may not see answers as if it did not exist.
    """
    row = (
        models.ScheduledMessage.objects.select_related("topic")
        # Message lock (SKIP LOCKED): a row being released right now counts as gone.
        .select_for_update(skip_locked=True, of=("self",))
        .filter(id=scheduled_id)
        .first()
    )
    if row is None or not keys.allows(principal, row.topic.name, "produce"):
        raise errors.ScheduledNotFound(id=scheduled_id)
    return row


def cancel_scheduled(principal: Principal, scheduled_id: int) -> ScheduledInfo:
    """Cancel a message that is not due yet; ScheduledNotFound once released or cancelled."""
    with transaction.atomic(durable=True):
        row = _locked_visible(principal, scheduled_id)
        info = _info(row, row.topic.name)
        row.delete()
    return info


def _consumable_topics(principal: Principal, topic_name: str | None) -> dict[int, str]:
    """Topic ids and names the principal may consume: one topic's, or every visible one."""
    if topic_name is not None:
        topic = topics.get_topic(principal, topic_name, "consume")
        return {topic.id: topic.name}
    return {
        tid: name
        for tid, name in models.Topic.objects.values_list("id", "name")
        if keys.allows(principal, name, "consume")
    }


def _scheduled_rows(
    principal: Principal, topic_name: str | None
) -> tuple[dict[int, str], "QuerySet[models.ScheduledMessage]"]:
    visible = _consumable_topics(principal, topic_name)
    rows = models.ScheduledMessage.objects.all()
    if topic_name is not None or not principal.is_system:
        rows = rows.filter(topic_id__in=visible)
    return visible, rows


def list_all_scheduled(
    principal: Principal,
    topic_name: str | None = None,
    limit: int = 100,
    after_id: int | None = None,
) -> list[ScheduledInfo]:
    """Scheduled messages of every topic the principal may consume (or one), soonest first."""
    max_limit = ferry_settings.get("MAX_FETCH_MESSAGES")
    if not 1 <= limit <= max_limit:
        raise errors.InvalidRequest(f"limit must be between 1 and {max_limit}.", limit=limit)
    visible, rows = _scheduled_rows(principal, topic_name)
    rows = rows.order_by("due_ms", "id")
    if after_id is not None:
        after = rows.filter(id=after_id).first()
        if after is not None:
            rows = rows.filter(due_ms__gte=after.due_ms).exclude(
                due_ms=after.due_ms, id__lte=after.id
            )
    return [_info(row, visible.get(row.topic_id, "")) for row in rows[:limit]]


def count_scheduled(principal: Principal, topic_name: str | None = None) -> int:
    """How many messages are scheduled on the topics the principal may consume (or one)."""
    _, rows = _scheduled_rows(principal, topic_name)
    return rows.count()


def due_histogram(
    principal: Principal, topic_name: str | None = None, buckets: int = 24
) -> list[tuple[int, int]]:
    """(bucket start ms, count) from now to the latest due time; overdue rows count in the first.

    Empty when nothing is scheduled. Buckets are equal, at least 1 ms wide.
    """
    if not 1 <= buckets <= 1000:
        raise errors.InvalidRequest("buckets must be between 1 and 1000.", buckets=buckets)
    _, rows = _scheduled_rows(principal, topic_name)
    latest = rows.aggregate(latest=Max("due_ms"))["latest"]
    if latest is None:
        return []
    now = log.now_ms()
    width = max(1, -(-(latest - now + 1) // buckets))
    counts = [0] * buckets
    overdue = rows.filter(due_ms__lt=now).count()
    bucketed = (
        rows.filter(due_ms__gte=now)
        .annotate(
            bucket=ExpressionWrapper((F("due_ms") - now) / width, output_field=BigIntegerField())
        )
        .values("bucket")
        .annotate(n=Count("id"))
        .values_list("bucket", "n")
    )
    for bucket, n in bucketed:
        counts[min(int(bucket), buckets - 1)] += n
    counts[0] += overdue
    return [(now + i * width, counts[i]) for i in range(buckets)]


def _change_due(principal: Principal, scheduled_id: int, due: int) -> ScheduledInfo:
    with transaction.atomic(durable=True):
        row = _locked_visible(principal, scheduled_id)
        row.due_ms = due
        row.save(update_fields=["due_ms"])
        return _info(row, row.topic.name)


def deliver_now(principal: Principal, scheduled_id: int) -> ScheduledInfo:
    """Make a scheduled message due now: release_due appends it within its interval."""
    return _change_due(principal, scheduled_id, log.now_ms())


def reschedule_scheduled(principal: Principal, scheduled_id: int, due_ms: int) -> ScheduledInfo:
    """Move a scheduled message's due time; bounded like a produce's delay (MAX_DELAY_SECONDS)."""
    now = log.now_ms()
    limit_ms = ferry_settings.get("MAX_DELAY_SECONDS") * 1000
    if due_ms < 0 or due_ms - now > limit_ms:
        raise errors.InvalidRequest(
            f"due_ms is milliseconds since 1970, at most {limit_ms // 1000} s from now.",
            due_ms=due_ms,
            max_delay_seconds=limit_ms // 1000,
        )
    return _change_due(principal, scheduled_id, due_ms)


def release_due(batch_size: int = 1000) -> int:
    """Append every due message to its topic, batch by batch; returns how many were released."""
    released = 0
    while True:
        count, more = _release_batch(batch_size)
        released += count
        if not more:
            return released


def _release_batch(batch_size: int) -> tuple[int, bool]:
    now = log.now_ms()
    # A read first: most ticks find nothing due, and on SQLite a write transaction would take
    # the database's write lock five times a second for nothing.
    if not models.ScheduledMessage.objects.filter(due_ms__lte=now).exists():
        return 0, False
    with transaction.atomic(durable=True):
        # Message locks, taken before any partition lock: nothing that holds a partition lock
        # waits for a scheduled row, so this order cannot deadlock (docs/architecture.md#locks).
        # SKIP LOCKED: concurrent schedulers take disjoint rows.
        due = list(
            models.ScheduledMessage.objects.select_for_update(skip_locked=True)
            .filter(due_ms__lte=now)
            .order_by("due_ms", "id")[:batch_size]
        )
        by_topic: dict[int, list[models.ScheduledMessage]] = defaultdict(list)
        for row in due:
            by_topic[row.topic_id].append(row)
        released = 0
        for topic in models.Topic.objects.filter(id__in=by_topic).order_by("id"):
            rows = by_topic[topic.id]
            messages = [
                NewMessage(
                    bytes(r.value),
                    r.is_json,
                    r.key,
                    r.tag,
                    r.headers,
                    r.partition_number,
                    r.client_id,
                )
                for r in rows
            ]
            try:
                with transaction.atomic():  # savepoint: one full topic must not stop the rest
                    log.append_in_transaction(topic, messages)
            except errors.TopicFull:
                logger.warning(
                    "topic %s is full; its due messages wait %d ms", topic.name, RETRY_FULL_MS
                )
                models.ScheduledMessage.objects.filter(id__in=[r.id for r in rows]).update(
                    due_ms=now + RETRY_FULL_MS
                )
                continue
            models.ScheduledMessage.objects.filter(id__in=[r.id for r in rows]).delete()
            released += len(rows)
    return released, len(due) == batch_size
