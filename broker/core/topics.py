"""Topics: create, describe, list, alter (grow partitions, limits), delete (architecture.md).

The topic definitions and settings only, a layer below the log: purging a topic's messages is
log.purge_topic, and altering one is membership.alter_topic (grown partitions are handed out
to the groups on the topic in the same transaction), over check_alter and alter_in_transaction.
"""

import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple, TypeVar

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Model, QuerySet, Sum

from broker import models
from broker import settings as ferry_settings
from broker.core import errors, keys
from broker.core.records import PartitionInfo, Principal, TopicDeletion, TopicInfo

logger = logging.getLogger(__name__)
# Not dots alone: ".", ".." and "..." are path segments that URL clients rewrite (RFC 3986).
NAME_RE = re.compile(r"(?!\.+$)[A-Za-z0-9._-]{1,200}")
OVERFLOW_POLICIES = tuple(models.Topic.Overflow.values)
# The largest page a listing (topics, groups, the overview) answers.
MAX_LIST_LIMIT = 1000
_UNSET = object()


def validate_name(name: str) -> None:
    if not NAME_RE.fullmatch(name or ""):
        raise errors.InvalidTopicName(name=name)


def partition_info(p: models.Partition) -> PartitionInfo:
    return PartitionInfo(
        number=p.number,
        start_offset=p.start_offset,
        end_offset=p.next_offset,
        bytes_stored=p.bytes_stored,
    )


def to_info(topic: models.Topic, partitions: list[models.Partition] | None = None) -> TopicInfo:
    return TopicInfo(
        id=topic.id,
        name=topic.name,
        partition_count=topic.partition_count,
        retention_ms=topic.retention_ms,
        retention_bytes=topic.retention_bytes,
        max_message_bytes=topic.max_message_bytes,
        capacity=topic.capacity,
        overflow_policy=topic.overflow_policy,
        message_ttl_ms=topic.message_ttl_ms,
        trace=topic.trace,
        created_at_ms=int(topic.created_at.timestamp() * 1000),
        partitions=tuple(partition_info(p) for p in partitions or ()),
    )


def _validate_limits(
    retention_ms: int | None,
    retention_bytes: int | None,
    max_message_bytes: int | None,
    capacity: int | None,
    overflow_policy: str | None,
    message_ttl_ms: int | None = None,
) -> None:
    for field, value in (
        ("retention_ms", retention_ms),
        ("retention_bytes", retention_bytes),
        ("max_message_bytes", max_message_bytes),
        ("capacity", capacity),
        ("message_ttl_ms", message_ttl_ms),
    ):
        if value is not None and value < 1:
            raise errors.InvalidRequest(f"{field} must be at least 1.", field=field, value=value)
    # Every stored message must fit one WebSocket push frame (docs/websocket.md#limits).
    ceiling = ferry_settings.max_message_bytes_ceiling()
    if max_message_bytes is not None and max_message_bytes > ceiling:
        raise errors.InvalidRequest(
            f"max_message_bytes must be at most {ceiling} (FERRY_WS_MAX_FRAME_BYTES).",
            field="max_message_bytes",
            value=max_message_bytes,
        )
    if overflow_policy is not None and overflow_policy not in OVERFLOW_POLICIES:
        raise errors.InvalidRequest(
            f"overflow_policy must be one of {', '.join(OVERFLOW_POLICIES)}.",
            overflow_policy=overflow_policy,
        )


def _validate_partition_count(partitions: int) -> None:
    limit = ferry_settings.get("MAX_PARTITIONS")
    if not 1 <= partitions <= limit:
        raise errors.InvalidPartitionCount(
            f"partitions must be between 1 and {limit}.", partitions=partitions
        )


def draft_topic(name: str) -> models.Topic:
    """An unsaved topic with the defaults a produce's auto-creation gives it."""
    return models.Topic(
        name=name,
        partition_count=ferry_settings.get("DEFAULT_PARTITIONS"),
        max_message_bytes=min(
            ferry_settings.get("MAX_MESSAGE_BYTES"), ferry_settings.max_message_bytes_ceiling()
        ),
    )


def create_for_produce(name: str) -> models.Topic:
    """Create the topic a produce names, with the defaults (FERRY_AUTO_CREATE_TOPICS).

    The caller checked the principal's produce permission on the name and the batch against
    draft_topic. A concurrent produce that created it first wins: its topic is returned.
    """
    topic = draft_topic(name)
    try:
        with transaction.atomic(durable=True):
            topic.save()
            models.Partition.objects.bulk_create(
                models.Partition(topic=topic, number=n) for n in range(topic.partition_count)
            )
    except IntegrityError:
        pass
    else:
        logger.info("topic %s created by a produce (FERRY_AUTO_CREATE_TOPICS)", name)
        return topic
    found = models.Topic.objects.filter(name=name).first()
    if found is None:  # created and deleted again meanwhile
        raise errors.TopicNotFound(name=name)
    return found


def create_topic(
    principal: Principal,
    name: str,
    partitions: int | None = None,
    *,
    retention_ms: int | None = None,
    retention_bytes: int | None = None,
    max_message_bytes: int | None = None,
    capacity: int | None = None,
    overflow_policy: str = models.Topic.Overflow.REJECT,
    message_ttl_ms: int | None = None,
    trace: bool = False,
) -> TopicInfo:
    """Create a topic with its partitions."""
    validate_name(name)
    keys.require(principal, name, "admin")
    if partitions is None:
        partitions = ferry_settings.get("DEFAULT_PARTITIONS")
    _validate_partition_count(partitions)
    _validate_limits(
        retention_ms, retention_bytes, max_message_bytes, capacity, overflow_policy, message_ttl_ms
    )
    try:
        with transaction.atomic(durable=True):
            topic = models.Topic.objects.create(
                name=name,
                partition_count=partitions,
                retention_ms=retention_ms,
                retention_bytes=retention_bytes,
                max_message_bytes=max_message_bytes
                or min(
                    ferry_settings.get("MAX_MESSAGE_BYTES"),
                    ferry_settings.max_message_bytes_ceiling(),
                ),
                capacity=capacity,
                overflow_policy=overflow_policy,
                message_ttl_ms=message_ttl_ms,
                trace=trace,
            )
            rows = models.Partition.objects.bulk_create(
                models.Partition(topic=topic, number=n) for n in range(partitions)
            )
    except IntegrityError:
        raise errors.TopicExists(name=name) from None
    return to_info(topic, rows)


def get_topic(principal: Principal, name: str, action: str = "consume") -> TopicInfo:
    """A topic with its partitions' start and end offsets, for a principal allowed action."""
    validate_name(name)
    keys.require(principal, name, action)
    return _topic_with_partitions(name)


def _topic_with_partitions(name: str) -> TopicInfo:
    topic = models.Topic.objects.filter(name=name).first()
    if topic is None:
        raise errors.TopicNotFound(name=name)
    return to_info(topic, list(topic.partitions.order_by("number")))


def describe_topic(principal: Principal, name: str) -> TopicInfo:
    """A topic with its partitions, for any principal that may see it (any permission)."""
    validate_name(name)
    if not any(keys.allows(principal, name, action) for action in keys.ACTIONS):
        keys.require(principal, name, "consume")
    return _topic_with_partitions(name)


def visible_topics(
    principal: Principal, actions: tuple[str, ...] = keys.ACTIONS
) -> QuerySet[models.Topic]:
    """The live topics (not being deleted) principal may do one of actions on, filtered in SQL.

    May hold a few more than keys.allows() admits (see keys.topic_filter); check each row.
    """
    return models.Topic.objects.filter(
        keys.topic_filter(principal, actions), deleting_since_ms__isnull=True
    )


Named = TypeVar("Named", bound=Model)


def page_by_name(
    query: "QuerySet[Named]",
    keep: Callable[[list[Named]], Iterable[Named]],
    limit: int | None,
    after: str | None,
) -> list[Named]:
    """A page of query's rows by name: at most limit (all when None), named after `after`.

    query filters by permission in SQL, as closely as SQL can; keep() drops what it let through
    that the key may not see exactly (a pattern with a character class), and the page reads on
    to fill itself.
    """
    if limit is not None and not 1 <= limit <= MAX_LIST_LIMIT:
        raise errors.InvalidRequest(f"limit must be between 1 and {MAX_LIST_LIMIT}.", limit=limit)
    query = query.order_by("name")
    if after is not None:
        query = query.filter(name__gt=after)
    found: list[Named] = []
    while True:
        if limit is None:
            found.extend(keep(list(query)))
            return found
        want = limit - len(found)
        chunk = list(query[:want])
        found.extend(keep(chunk))
        if len(chunk) < want or len(found) >= limit:
            return found
        query = query.filter(name__gt=chunk[-1].serializable_value("name"))


def list_topics(
    principal: Principal, *, limit: int | None = None, after: str | None = None
) -> list[TopicInfo]:
    """The topics the principal may produce to, consume from or administer, by name.

    A page of at most limit topics named after `after` (all of them when limit is None),
    filtered by permission in the query, so a key that sees few topics reads few rows.
    """
    found = page_by_name(
        visible_topics(principal),
        lambda chunk: (
            t for t in chunk if any(keys.allows(principal, t.name, a) for a in keys.ACTIONS)
        ),
        limit,
        after,
    )
    by_topic: dict[int, list[models.Partition]] = {t.id: [] for t in found}
    for p in models.Partition.objects.filter(topic_id__in=by_topic).order_by("number"):
        by_topic[p.topic_id].append(p)
    return [to_info(t, by_topic[t.id]) for t in found]


class TopicChange(NamedTuple):
    """A checked alter_topic: the topic's name, the fields to set, and a partition count."""

    name: str
    fields: dict[str, object]
    partitions: int | None


def check_alter(
    principal: Principal,
    name: str,
    *,
    partitions: int | None = None,
    retention_ms: object = _UNSET,
    retention_bytes: object = _UNSET,
    max_message_bytes: int | None = None,
    capacity: object = _UNSET,
    overflow_policy: str | None = None,
    message_ttl_ms: object = _UNSET,
    trace: bool | None = None,
) -> TopicChange:
    """Everything alter_topic checks before its transaction; a field left out keeps its value.

    membership.alter_topic owns the whole change: growing partitions rebalances the groups on
    the topic in the same transaction, which is membership's, a layer up.
    """
    validate_name(name)
    keys.require(principal, name, "admin")
    nullable = {
        "retention_ms": retention_ms,
        "retention_bytes": retention_bytes,
        "capacity": capacity,
        "message_ttl_ms": message_ttl_ms,
    }
    given = {k: v for k, v in nullable.items() if v is not _UNSET}
    _validate_limits(
        given.get("retention_ms"),  # type: ignore[arg-type]
        given.get("retention_bytes"),  # type: ignore[arg-type]
        max_message_bytes,
        given.get("capacity"),  # type: ignore[arg-type]
        overflow_policy,
        given.get("message_ttl_ms"),  # type: ignore[arg-type]
    )
    if partitions is not None:
        _validate_partition_count(partitions)
    for field, value in (
        ("max_message_bytes", max_message_bytes),
        ("overflow_policy", overflow_policy),
        ("trace", trace),
    ):
        if value is not None:
            given[field] = value
    return TopicChange(name, given, partitions)


def alter_in_transaction(change: TopicChange) -> tuple[models.Topic, bool]:
    """Apply a checked change under the topic lock; the topic, and whether its partitions grew.

    Caller holds the write transaction and, when they grew, rebalances the topic's groups
    (membership.alter_topic).
    """
    # Topic lock: serializes partition growth with appends that read partition_count.
    topic = models.Topic.objects.select_for_update().filter(name=change.name).first()
    if topic is None:
        raise errors.TopicNotFound(name=change.name)
    changed = list(change.fields)
    for field, value in change.fields.items():
        setattr(topic, field, value)
    partitions = change.partitions
    grown = False
    if partitions is not None and partitions != topic.partition_count:
        if partitions < topic.partition_count:
            raise errors.InvalidPartitionCount(
                "Partitions can grow but never shrink.",
                partitions=partitions,
                current=topic.partition_count,
            )
        models.Partition.objects.bulk_create(
            models.Partition(topic=topic, number=n)
            for n in range(topic.partition_count, partitions)
        )
        topic.partition_count = partitions
        changed.append("partition_count")
        grown = True
    if changed:
        topic.save(update_fields=changed)
    return topic, grown


# A topic marked for deletion is renamed so: "~" is never in a topic name, so no client can
# reach it and its old name is free for a new topic at once.
DELETING_PREFIX = "~deleting."


def delete_topic(principal: Principal, name: str) -> TopicDeletion:
    """Mark a topic for deletion: gone for every client at once, its rows deleted in the background.

    One short transaction renames it (DELETING_PREFIX) and removes its members; a topic of the
    same name can be created right after and sees none of the old one's messages or offsets.
    run_topic_deletions (a periodic job) deletes the rows in chunks of short transactions.
    """
    validate_name(name)
    keys.require(principal, name, "admin")
    now = int(time.time() * 1000)
    with transaction.atomic(durable=True):
        # Topic lock: serializes the rename with alters (partition growth) of the same topic.
        topic = models.Topic.objects.select_for_update().filter(name=name).first()
        if topic is None:
            raise errors.TopicNotFound(name=name)
        topic.deleted_name = name
        topic.name = f"{DELETING_PREFIX}{topic.id}"
        topic.deleting_since_ms = now
        topic.save(update_fields=["name", "deleted_name", "deleting_since_ms"])
        # Nobody consumes a topic that is gone: its members go now (their leases with the rows).
        models.GroupMember.objects.filter(topic=topic).delete()
        stored = models.Partition.objects.filter(topic=topic).aggregate(
            n=Sum(F("next_offset") - F("start_offset"))
        )["n"]
    return TopicDeletion(name=name, since_ms=now, messages=int(stored or 0))


def list_topic_deletions(principal: Principal) -> list[TopicDeletion]:
    """Topics principal administers that are marked for deletion and not gone yet, oldest first."""
    rows = (
        models.Topic.objects.filter(deleting_since_ms__isnull=False)
        # The count it had when marked (cheap): counting what is left would scan the rows.
        .annotate(n=Sum(F("partitions__next_offset") - F("partitions__start_offset")))
        .order_by("deleting_since_ms")
        .values_list("deleted_name", "deleting_since_ms", "n")
    )
    return [
        TopicDeletion(name=n, since_ms=since or 0, messages=int(c or 0))
        for n, since, c in rows
        if keys.allows(principal, n, "admin")
    ]


def run_topic_deletions() -> int:
    """Delete the rows of topics marked for deletion, in chunks; returns how many rows went.

    Each chunk is its own short transaction of at most FERRY_DELETION_CHUNK_ROWS rows, and on
    SQLite the job rests as long as a chunk took before the next, so appends and commits (one
    writer at a time) wait for one chunk at most, never for the whole topic. Idempotent: a job
    stopped halfway goes on where it was in its next round.
    """
    removed = 0
    for topic_id in (
        models.Topic.objects.filter(deleting_since_ms__isnull=False)
        .order_by("id")
        .values_list("id", flat=True)
    ):
        removed += _delete_topic_rows(topic_id)
    return removed


def _rest_after(started: float) -> None:
    # SQLite has one write lock: resting as long as the chunk took lets waiting writers in.
    # PostgreSQL's writers to other rows never wait for a chunk, so it goes straight on.
    if connection.vendor == "sqlite":
        time.sleep(min(0.5, time.monotonic() - started))


def _delete_topic_rows(topic_id: int) -> int:
    chunk = int(ferry_settings.get("DELETION_CHUNK_ROWS"))
    removed = 0
    by_topic = {"topic_id": topic_id}
    by_partition = {"partition__topic_id": topic_id}
    # Small tables first (what listings and jobs read across topics), the messages last.
    for model, where in (
        (models.GroupOffset, by_partition),
        (models.InFlight, by_partition),
        (models.PartitionLease, by_partition),
        (models.DeadLetter, by_topic),
        (models.ScheduledMessage, by_topic),
        (models.StagedMessage, by_topic),
        (models.StagedOffset, by_topic),
        (models.ProducedId, by_topic),
        (models.TraceEvent, by_topic),
        (models.TopicSample, by_topic),
        (models.GroupSample, by_topic),
    ):
        while True:
            started = time.monotonic()
            with transaction.atomic(durable=True):
                ids = list(
                    model.objects.filter(**where)
                    .order_by("id")
                    .values_list("id", flat=True)[:chunk]
                )
                model.objects.filter(id__in=ids).delete()
            removed += len(ids)
            if len(ids) < chunk:
                break
            _rest_after(started)
    for partition_id in models.Partition.objects.filter(**by_topic).values_list("id", flat=True):
        while True:
            started = time.monotonic()
            with transaction.atomic(durable=True):
                lowest = (
                    models.Message.objects.filter(partition_id=partition_id)
                    .order_by("offset")
                    .values_list("offset", flat=True)
                    .first()
                )
                if lowest is None:
                    break
                # Offsets are contiguous: the range bounds the chunk to `chunk` rows.
                count, _ = models.Message.objects.filter(
                    partition_id=partition_id, offset__lt=lowest + chunk
                ).delete()
            removed += count
            _rest_after(started)
    with transaction.atomic(durable=True):
        # What is left is small (partitions, and rows an append or a release racing the mark
        # added): the cascade takes it with the topic.
        count, _ = models.Topic.objects.filter(id=topic_id).delete()
    return removed + count
