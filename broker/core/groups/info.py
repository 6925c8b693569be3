"""Reading groups: describe, list and the overview, with offsets, lag and members."""

import itertools

from django.db.models import Count, F, Q, Sum, Value
from django.db.models.functions import Greatest

from broker import models
from broker.core import errors, keys, membership, topics
from broker.core.records import (
    GroupInfo,
    GroupSettings,
    GroupTopicOffsets,
    GroupTopicTotals,
    MemberSummary,
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
                skipped_by_retention=max(0, row.partition.start_offset - row.committed_offset),
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
    """Offsets of the groups matching group_filter, on the topics principal may consume.

    The permission filter is in the query (topics.visible_topics), so only visible rows are read.
    """
    visible = {"partition__topic__in": topics.visible_topics(principal, ("consume",))}
    # Tuples, not model instances: a listing may read 100,000 rows (docs/benchmarks.md).
    rows = (
        models.GroupOffset.objects.filter(**group_filter, **visible)
        .order_by("group__name", "partition__topic__name", "subscriber", "partition__number")
        .values_list(
            "group__name",
            "group_id",
            "partition__topic__name",
            "partition__topic__capacity",
            "subscriber",
            "partition_id",
            "partition__number",
            "partition__start_offset",
            "partition__next_offset",
            "committed_offset",
            "filtered_count",
        )
    )
    in_flight = _in_flight_counts({**group_filter, **visible})
    delivered, waiting = models.InFlight.State.DELIVERED, models.InFlight.State.RETRY_WAIT
    by_group: dict[str, list[GroupTopicOffsets]] = {}
    for (group_name, group_id, topic_name, capacity, subscriber), topic_rows in itertools.groupby(
        rows, key=lambda r: r[:5]
    ):
        if not keys.allows(principal, topic_name, "consume"):
            continue
        by_group.setdefault(group_name, []).append(
            GroupTopicOffsets(
                group=group_name,
                topic=topic_name,
                capacity=capacity,
                subscriber=subscriber,
                partitions=tuple(
                    PartitionLag(
                        partition=number,
                        # A group behind retention reads from the start offset (DESIGN.md).
                        committed_offset=max(committed, start),
                        start_offset=start,
                        end_offset=end,
                        in_flight=in_flight.get((group_id, pid, subscriber, delivered), 0),
                        filtered=filtered,
                        retry_waiting=in_flight.get((group_id, pid, subscriber, waiting), 0),
                        skipped_by_retention=max(0, start - committed),
                    )
                    for *_, pid, number, start, end, committed, filtered in topic_rows
                ),
            )
        )
    return by_group


def _group_page(
    principal: Principal, limit: int | None, after: str | None
) -> list[models.ConsumerGroup]:
    """The groups with offsets or members on a topic principal may consume: a page by name.

    Filtered in SQL; a group the SQL filter lets through but keys.allows() refuses on every
    topic (a pattern with a character class) is skipped and the page read on.
    """
    visible = topics.visible_topics(principal, ("consume",))
    query = models.ConsumerGroup.objects.filter(
        Q(id__in=models.GroupOffset.objects.filter(partition__topic__in=visible).values("group_id"))
        | Q(id__in=models.GroupMember.objects.filter(topic__in=visible).values("group_id"))
    )

    def seen(chunk: list[models.ConsumerGroup]) -> list[models.ConsumerGroup]:
        ids = _groups_seeing(principal, [g.id for g in chunk])
        return [g for g in chunk if g.id in ids]

    return topics.page_by_name(query, seen, limit, after)


def _groups_seeing(principal: Principal, group_ids: list[int]) -> set[int]:
    """Of group_ids, those with offsets or members on a topic principal may consume (exactly)."""
    if principal.is_system or not any(
        "[" in p.pattern for p in principal.permissions if p.action in ("consume", "admin")
    ):
        return set(group_ids)
    pairs = set(
        models.GroupOffset.objects.filter(group_id__in=group_ids)
        .values_list("group_id", "partition__topic__name")
        .distinct()
    ) | set(
        models.GroupMember.objects.filter(group_id__in=group_ids).values_list(
            "group_id", "topic__name"
        )
    )
    return {g for g, name in pairs if keys.allows(principal, name, "consume")}


def describe_group(principal: Principal, group_name: str) -> GroupInfo:
    """A group's committed offsets, end offsets and lag per topic the principal may consume."""
    membership.validate_group_name(group_name)
    group = models.ConsumerGroup.objects.filter(name=group_name).first()
    if group is None:
        raise errors.GroupNotFound(group=group_name)
    offsets = _offsets_by_group(principal, {"group": group}).get(group_name, [])
    return _group_info(
        principal,
        group,
        offsets,
        membership.list_members(group),
        _dead_letter_counts(principal, [group.id]).get(group.id, 0),
    )


def _group_info(
    principal: Principal,
    group: models.ConsumerGroup,
    offsets: list[GroupTopicOffsets],
    members: list[MemberSummary],
    dead_letters: int,
) -> GroupInfo:
    members = [m for m in members if keys.allows(principal, m.topic, "consume")]
    return GroupInfo(
        name=group.name,
        created_at_ms=int(group.created_at.timestamp() * 1000),
        topics=tuple(offsets),
        generation=group.generation,
        strategy=group.strategy,
        members=tuple(members),
        settings=settings_of(group),
        # Only letters of topics the principal may consume (issue 9, item 10).
        dead_letters=dead_letters,
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


def list_groups(
    principal: Principal, *, limit: int | None = None, after: str | None = None
) -> list[GroupInfo]:
    """The groups with offsets or members on a topic the principal may consume, by name.

    A page of at most limit groups named after `after` (all when limit is None); permissions
    filter in the query and the figures are read for the page's groups only.
    """
    page = _group_page(principal, limit, after)
    by_group = _offsets_by_group(principal, {"group_id__in": [g.id for g in page]})
    dead = _dead_letter_counts(principal, [g.id for g in page])
    members = membership.list_members_by_group(page)
    return [
        _group_info(
            principal, g, by_group.get(g.name, []), members.get(g.id, []), dead.get(g.id, 0)
        )
        for g in page
    ]


def _dead_letter_counts(principal: Principal, group_ids: list[int]) -> dict[int, int]:
    """Per group, its dead letters on topics the principal may consume: one grouped query."""
    counts: dict[int, int] = {}
    for group_id, name, n in (
        models.DeadLetter.objects.filter(group_id__in=group_ids)
        .values_list("group_id", "topic__name")
        .annotate(n=Count("id"))
        .order_by()
    ):
        if keys.allows(principal, name, "consume"):
            counts[group_id] = counts.get(group_id, 0) + n
    return counts


def list_group_offsets(
    principal: Principal, *, limit: int | None = None, after: str | None = None
) -> dict[str, list[GroupTopicOffsets]]:
    """Per group, its offsets and lag on each topic the principal may consume.

    list_groups without members, settings and dead-letter counts: a fixed number of queries
    however many groups there are (the console's overview and lists). Paged like list_groups.
    """
    if limit is None and after is None:
        return _offsets_by_group(principal, {})
    page = _group_page(principal, limit, after)
    return _offsets_by_group(principal, {"group_id__in": [g.id for g in page]})


def list_group_totals(principal: Principal) -> dict[str, list[GroupTopicTotals]]:
    """Per group, its totals on each topic the principal may consume, summed in SQL.

    One grouped query for the offsets and one for the messages in flight, whatever the number
    of partitions: the console's lists sort every group by lag without reading every row.
    """
    visible = topics.visible_topics(principal, ("consume",))
    position = Greatest(F("committed_offset"), F("partition__start_offset"))
    rows = (
        models.GroupOffset.objects.filter(partition__topic__in=visible)
        .values(
            "group__name", "group_id", "partition__topic__name", "partition__topic_id", "subscriber"
        )
        .annotate(
            committed=Sum(position),
            end=Sum("partition__next_offset"),
            lag=Sum(Greatest(Value(0), F("partition__next_offset") - position)),
        )
        .values_list(
            "group__name",
            "group_id",
            "partition__topic__name",
            "partition__topic_id",
            "subscriber",
            "committed",
            "end",
            "lag",
        )
        .order_by("group__name", "partition__topic__name", "subscriber")
    )
    in_flight = {
        (g, t, sub, state): int(n)
        for g, t, sub, state, n in models.InFlight.objects.filter(partition__topic__in=visible)
        .values("group_id", "partition__topic_id", "subscriber", "state")
        .annotate(n=Sum(F("last_offset") - F("offset") + 1))
        .values_list("group_id", "partition__topic_id", "subscriber", "state", "n")
    }
    delivered, waiting = models.InFlight.State.DELIVERED, models.InFlight.State.RETRY_WAIT
    found: dict[str, list[GroupTopicTotals]] = {}
    for group, group_id, topic, topic_id, subscriber, committed, end, lag in rows:
        if not keys.allows(principal, topic, "consume"):
            continue
        found.setdefault(group, []).append(
            GroupTopicTotals(
                group=group,
                topic=topic,
                subscriber=subscriber,
                committed_total=int(committed or 0),
                end_total=int(end or 0),
                lag=int(lag or 0),
                in_flight=in_flight.get((group_id, topic_id, subscriber, delivered), 0),
                retry_waiting=in_flight.get((group_id, topic_id, subscriber, waiting), 0),
            )
        )
    return found


def overview(
    principal: Principal,
    *,
    limit: int | None = None,
    topics_after: str | None = None,
    groups_after: str | None = None,
) -> Overview:
    """The topics, and per group and topic its offsets and lag: pages of at most limit each.

    The next pages start after next_topics_after and next_groups_after (None: no more).
    """
    visible_topics = topics.list_topics(principal, limit=limit, after=topics_after)
    if limit is None and groups_after is None:
        by_group = list_group_offsets(principal)
        group_names = sorted(by_group)
    else:
        page = _group_page(principal, limit, groups_after)
        by_group = _offsets_by_group(principal, {"group_id__in": [g.id for g in page]})
        group_names = [g.name for g in page]
    groups = [t for name in group_names for t in by_group.get(name, [])]
    full = limit is not None
    return Overview(
        topics=tuple(visible_topics),
        groups=tuple(groups),
        next_topics_after=visible_topics[-1].name
        if full and len(visible_topics) == limit
        else None,
        next_groups_after=group_names[-1] if full and len(group_names) == limit else None,
    )
