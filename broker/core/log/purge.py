"""Purging a topic: remove its messages, all or those below an offset per partition.

An operator's retention: start offsets advance as retention.py advances them (truncate).
"""

from django.db import transaction

from broker import models
from broker.core import errors, keys, topics
from broker.core.log.append import truncate
from broker.core.records import Principal, PurgeTopicResult


def purge_topic(
    principal: Principal, name: str, up_to: dict[int, int] | None = None
) -> PurgeTopicResult:
    """Remove a topic's messages, all or those below up_to's offset per partition.

    Advances start offsets exactly as retention does (offsets are never reused, appends go on
    at the end offset); a group behind the new start offset reads from it (DESIGN.md: Retention).
    Delayed messages not yet due are not in the log and stay scheduled.
    """
    topics.validate_name(name)
    keys.require(principal, name, "admin")
    for number, offset in (up_to or {}).items():
        if number < 0 or offset < 0:
            raise errors.InvalidRequest(
                "up_to maps partition numbers to offsets, both at least 0.",
                partition=number,
                offset=offset,
            )
    with transaction.atomic(durable=True):
        topic = models.Topic.objects.filter(name=name).first()
        if topic is None:
            raise errors.TopicNotFound(name=name)
        # Partition locks, in number order like appends: serialize start offset moves with
        # appends, retention and drop_oldest; next_offset is untouched, so offsets stay gapless.
        rows = list(
            models.Partition.objects.select_for_update(no_key=True)
            .filter(topic=topic)
            .order_by("number")
        )
        by_number = {p.number: p for p in rows}
        targets: dict[int, int] = {}
        if up_to is None:
            targets = {p.number: p.next_offset for p in rows}
        else:
            for number, offset in sorted(up_to.items()):
                p = by_number.get(number)
                if p is None:
                    raise errors.PartitionNotFound(topic=name, partition=number)
                if offset > p.next_offset:
                    raise errors.OffsetOutOfRange(
                        f"Offset {offset} is past the end of partition {number} ({p.next_offset}).",
                        partition=number,
                        offset=offset,
                        end_offset=p.next_offset,
                    )
                targets[number] = offset
        removed = 0
        for number, new_start in targets.items():
            p = by_number[number]
            count = truncate(p, new_start)
            if count:
                p.save(update_fields=["start_offset", "bytes_stored"])
                removed += count
    partitions = tuple(topics.partition_info(p) for p in rows)
    return PurgeTopicResult(removed=removed, partitions=partitions)
