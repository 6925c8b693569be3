"""Offset reset: move a group's committed offsets, or preview it (semantics.md#offset-reset-replay).

One function computes each partition's target (`_reset_target`), for reset_offsets and
preview_reset alike. Locks as in positions.py: the group row, then its offset rows in id order.
"""

from django.db import transaction

from broker import models
from broker.core import errors, log, membership
from broker.core.groups import info
from broker.core.groups.positions import (
    _ensure_offsets,
    _move,
    topic_for_consume,
)
from broker.core.records import GroupTopicOffsets, Principal, ResetPreviewRow

RESET_TARGETS = ("earliest", "latest", "timestamp", "offsets", "shift")


def _validate_reset(
    to: str, timestamp_ms: int | None, offsets: dict[int, int] | None, shift_by: int | None
) -> None:
    if to not in RESET_TARGETS:
        raise errors.InvalidRequest(f"to is one of {', '.join(RESET_TARGETS)}.", to=to)
    if to == "timestamp" and timestamp_ms is None:
        raise errors.InvalidRequest("Resetting to a timestamp needs timestamp_ms.")
    if to == "offsets" and not offsets:
        raise errors.InvalidRequest("Resetting to offsets needs at least one partition's offset.")
    if to == "shift" and shift_by is None:
        raise errors.InvalidRequest("Shifting offsets needs shift_by (negative replays).")


def _reset_target(
    p: models.Partition,
    committed_offset: int,
    topic_name: str,
    to: str,
    timestamp_ms: int | None,
    offsets: dict[int, int],
    shift_by: int | None,
) -> int | None:
    """Where reset_offsets moves one partition's committed offset; None leaves it.

    The one computation behind reset_offsets and preview_reset.
    """
    if to == "earliest":
        return p.start_offset
    if to == "latest":
        return p.next_offset
    if to == "timestamp":
        return log.offset_for_timestamp(p, timestamp_ms or 0)
    if to == "shift":
        current = max(committed_offset, p.start_offset)
        return min(max(current + (shift_by or 0), p.start_offset), p.next_offset)
    if p.number not in offsets:
        return None
    target = offsets[p.number]
    if not p.start_offset <= target <= p.next_offset:
        raise errors.OffsetOutOfRange(
            f"Offset {target} is outside partition {p.number}'s range "
            f"{p.start_offset}..{p.next_offset}.",
            partition=p.number,
            offset=target,
        )
    return target


def _check_partitions(topic_name: str, numbers: set[int], wanted: dict[int, int]) -> None:
    for number in wanted:
        if number not in numbers:
            raise errors.PartitionNotFound(topic=topic_name, partition=number)


def reset_offsets(
    principal: Principal,
    group_name: str,
    topic_name: str,
    to: str,
    *,
    timestamp_ms: int | None = None,
    offsets: dict[int, int] | None = None,
    shift_by: int | None = None,
    force: bool = False,
) -> GroupTopicOffsets:
    """Move a group's committed offsets on a topic: to earliest, latest, a time, given offsets,
    or shifted by shift_by (clamped to each partition's start and end offsets).

    Refused while the group has live members on the topic, unless forced (Kafka's
    kafka-consumer-groups --reset-offsets needs an inactive group too). Replays history.
    """
    membership.validate_group_name(group_name)
    _validate_reset(to, timestamp_ms, offsets, shift_by)
    topic = topic_for_consume(principal, topic_name)
    with transaction.atomic(durable=True):
        group = membership.locked_group(group_name)
        if not force and models.GroupMember.objects.filter(group=group, topic=topic).exists():
            raise errors.GroupHasMembers(group=group_name, topic=topic_name)
        _ensure_offsets(group_name, topic)
        # Group offset locks (id order), after the group lock; every subscriber's rows.
        rows = list(
            models.GroupOffset.objects.select_for_update(no_key=True)
            .filter(group=group, partition__topic=topic)
            .select_related("partition")
            .order_by("id")
        )
        wanted = offsets or {}
        if to == "offsets":
            _check_partitions(topic_name, {row.partition.number for row in rows}, wanted)
        moves = [
            (
                row,
                _reset_target(
                    row.partition,
                    row.committed_offset,
                    topic_name,
                    to,
                    timestamp_ms,
                    wanted,
                    shift_by,
                ),
            )
            for row in rows
        ]
        _move([(row, target) for row, target in moves if target is not None])
    return info._group_topic_offsets(group_name, topic, [r for r in rows if r.subscriber == ""])


def preview_reset(
    principal: Principal,
    group_name: str,
    topic_name: str,
    to: str,
    *,
    timestamp_ms: int | None = None,
    offsets: dict[int, int] | None = None,
    shift_by: int | None = None,
) -> tuple[ResetPreviewRow, ...]:
    """What reset_offsets would do to the group's committed offsets, per partition; writes nothing.

    Partitions reset_offsets would leave alone (not named in offsets) are not listed. A group
    that never read the topic starts at each partition's start offset.
    """
    membership.validate_group_name(group_name)
    _validate_reset(to, timestamp_ms, offsets, shift_by)
    topic = topic_for_consume(principal, topic_name)
    committed = dict(
        models.GroupOffset.objects.filter(
            group__name=group_name, partition__topic=topic, subscriber=""
        ).values_list("partition_id", "committed_offset")
    )
    partitions = list(topic.partitions.order_by("number"))
    wanted = offsets or {}
    if to == "offsets":
        _check_partitions(topic_name, {p.number for p in partitions}, wanted)
    preview = []
    for p in partitions:
        current = max(committed.get(p.id, 0), p.start_offset)
        target = _reset_target(p, current, topic_name, to, timestamp_ms, wanted, shift_by)
        if target is not None:
            preview.append(
                ResetPreviewRow(
                    partition=p.number, current=current, target=target, delta=target - current
                )
            )
    return tuple(preview)
