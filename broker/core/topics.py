"""Topics: create, describe, list, alter (grow partitions, limits), delete (architecture.md).

The topic definitions and settings only, a layer below the log: purging a topic's messages is
log.purge_topic, and altering one is membership.alter_topic (grown partitions are handed out
to the groups on the topic in the same transaction), over check_alter and alter_in_transaction.
"""

import logging
import re
from typing import NamedTuple

from django.db import IntegrityError, transaction

from broker import models
from broker import settings as ferry_settings
from broker.core import errors, keys
from broker.core.records import PartitionInfo, Principal, TopicInfo

logger = logging.getLogger(__name__)
# Not dots alone: ".", ".." and "..." are path segments that URL clients rewrite (RFC 3986).
NAME_RE = re.compile(r"(?!\.+$)[A-Za-z0-9._-]{1,200}")
OVERFLOW_POLICIES = tuple(models.Topic.Overflow.values)
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


def list_topics(principal: Principal) -> list[TopicInfo]:
    """Every topic the principal may produce to, consume from or administer, by name."""
    topics = [
        t
        for t in models.Topic.objects.order_by("name")
        if any(keys.allows(principal, t.name, action) for action in keys.ACTIONS)
    ]
    by_topic: dict[int, list[models.Partition]] = {t.id: [] for t in topics}
    for p in models.Partition.objects.filter(topic_id__in=by_topic).order_by("number"):
        by_topic[p.topic_id].append(p)
    return [to_info(t, by_topic[t.id]) for t in topics]


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


def delete_topic(principal: Principal, name: str) -> None:
    """Delete a topic with its messages and every group's offsets on it."""
    validate_name(name)
    keys.require(principal, name, "admin")
    with transaction.atomic(durable=True):
        deleted, _ = models.Topic.objects.filter(name=name).delete()
    if not deleted:
        raise errors.TopicNotFound(name=name)
