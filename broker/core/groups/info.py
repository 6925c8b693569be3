"""Reading groups: describe, list and the overview, with offsets, lag and members."""

import itertools

from django.db.models import Count, F, Sum

from broker import models
from broker.core import errors, keys, membership, topics
from broker.core.records import (
    GroupInfo,
    GroupSettings,
    GroupTopicOffsets,
    Overview,
    PartitionLag,
    Principal,
)


def _group_topic_offsets(
    group_name: str,
    topic: models.Topic,
    rows: list[models.GroupOffset],
    in_flight: dict[tuple[int, int, str, str], int] | None = None,
) -> GroupTopicOffsets:
    if in_flight is None:
        in_flight = _in_flight_counts({"group_id__in": {row.group_id for row in rows}})
    delivered, waiting = models.InFlight.State.DELIVERED, models.InFlight.State.RETRY_WAIT
    return GroupTopicOffsets(
        group=group_name,
        topic=topic.name,
        capacity=topic.capacity,
        subscriber=rows[0].subscriber if rows else "",
        partitions=tuple(
            PartitionLag(
                partition=row.partition.number,
                # A group behind retention is moved to the start offset (DESIGN.md: Retention).
                committed_offset=max(row.committed_offset, row.partition.start_offset),
                start_offset=row.partition.start_offset,
                end_offset=row.partition.next_offset,
                in_flight=in_flight.get(
                    (row.group_id, row.partition_id, row.subscriber, delivered), 0
                ),
                filtered=row.filtered_count,
                retry_waiting=in_flight.get(
                    (row.group_id, row.partition_id, row.subscriber, waiting), 0
                ),
            )
            for row in sorted(rows, key=lambda r: r.partition.number)
        ),
    )


def _in_flight_counts(group_filter: dict[str, object]) -> dict[tuple[int, int, str, str], int]:
    """Messages in InFlight rows per (group, partition, subscriber, state)."""
    return {
        (g, p, s, state): n
        for g, p, s, state, n in models.InFlight.objects.filter(**group_filter)
        .values("group_id", "partition_id", "subscriber", "state")
        .annotate(n=Sum(F("last_offset") - F("offset") + 1))
        .values_list("group_id", "partition_id", "subscriber", "state", "n")
    }


def _offsets_by_group(
    principal: Principal, group_filter: dict[str, object]
) -> dict[str, list[GroupTopicOffsets]]:
    rows = (
        models.GroupOffset.objects.filter(**group_filter)
        .select_related("group", "partition__topic")
        .order_by("group__name", "partition__topic__name", "subscriber", "partition__number")
    )
    in_flight = _in_flight_counts(group_filter)
    by_group: dict[str, list[GroupTopicOffsets]] = {}
    for (group_name, _, _), topic_rows in itertools.groupby(
        rows, key=lambda r: (r.group.name, r.partition.topic_id, r.subscriber)
    ):
        topic_rows_list = list(topic_rows)
        topic = topic_rows_list[0].partition.topic
        if not keys.allows(principal, topic.name, "consume"):
            continue
        by_group.setdefault(group_name, []).append(
            _group_topic_offsets(group_name, topic, topic_rows_list, in_flight)
        )
    return by_group


def describe_group(principal: Principal, group_name: str) -> GroupInfo:
    """A group's committed offsets, end offsets and lag per topic the principal may consume."""
    membership.validate_group_name(group_name)
    group = models.ConsumerGroup.objects.filter(name=group_name).first()
    if group is None:
        raise errors.GroupNotFound(group=group_name)
    offsets = _offsets_by_group(principal, {"group": group}).get(group_name, [])
    return _group_info(principal, group, offsets)


def _group_info(
    principal: Principal, group: models.ConsumerGroup, offsets: list[GroupTopicOffsets]
) -> GroupInfo:
    members = [
        m for m in membership.list_members(group) if keys.allows(principal, m.topic, "consume")
    ]
    return GroupInfo(
        name=group.name,
        created_at_ms=int(group.created_at.timestamp() * 1000),
        topics=tuple(offsets),
        generation=group.generation,
        strategy=group.strategy,
        members=tuple(members),
        settings=settings_of(group),
        # Only letters of topics the principal may consume (issue 9, item 10).
        dead_letters=sum(
            n
            for name, n in models.DeadLetter.objects.filter(group=group)
            .values_list("topic__name")
            .annotate(n=Count("id"))
            .order_by()
            if keys.allows(principal, name, "consume")
        ),
    )


def settings_of(group: models.ConsumerGroup) -> GroupSettings:
    return GroupSettings(
        mode=group.mode,
        ordered=group.ordered,
        ack_deadline_ms=group.ack_deadline_ms,
        max_attempts=group.max_attempts,
        retry_delays_ms=tuple(group.retry_delays_ms or ()),
        session_timeout_ms=group.session_timeout_ms,
    )


def list_groups(principal: Principal) -> list[GroupInfo]:
    """Every group with offsets or members on a topic the principal may consume, by name."""
    by_group = _offsets_by_group(principal, {})
    # A group whose members joined but never polled or committed has no offsets yet.
    for group_name, topic_name in models.GroupMember.objects.values_list(
        "group__name", "topic__name"
    ):
        if keys.allows(principal, topic_name, "consume"):
            by_group.setdefault(group_name, [])
    rows = {g.name: g for g in models.ConsumerGroup.objects.filter(name__in=by_group)}
    return [_group_info(principal, rows[name], by_group[name]) for name in sorted(by_group)]


def list_group_offsets(principal: Principal) -> dict[str, list[GroupTopicOffsets]]:
    """Per group, its offsets and lag on each topic the principal may consume.

    list_groups without members, settings and dead-letter counts: a fixed number of queries
    however many groups there are (the console's overview and lists).
    """
    return _offsets_by_group(principal, {})


def overview(principal: Principal) -> Overview:
    """Seed 000's overview: the topics, and per group and topic its offsets and lag."""
    visible_topics = topics.list_topics(principal)
    by_group = list_group_offsets(principal)
    groups = [t for name in sorted(by_group) for t in by_group[name]]
    return Overview(topics=tuple(visible_topics), groups=tuple(groups))
