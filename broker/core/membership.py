"""Group membership: join, heartbeat, leave, expiry, and the partition leases a rebalance hands out.

See docs/semantics.md#membership. A rebalance runs under the group row's lock, bumps the
group's generation and rewrites the (group, partition) lease rows; a lease row holds one member,
so two members never hold one partition, whichever broker process serves them.
"""

import uuid
from typing import Any

from django.db import transaction

from broker import models
from broker import settings as ferry_settings
from broker.core import assignment, delivery, errors, filters, groups, keys, log, topics
from broker.core.records import GroupInfo, MemberInfo, MemberSummary, Principal

MEMBER_ID_MAX = 100


def _validate_member_id(member_id: str) -> None:
    if not topics.NAME_RE.fullmatch(member_id) or len(member_id) > MEMBER_ID_MAX:
        raise errors.InvalidRequest(
            f"Member ids are 1 to {MEMBER_ID_MAX} characters from A-Z, a-z, 0-9, '.', '_', '-'.",
            member_id=member_id,
        )


def locked_group(group_name: str) -> models.ConsumerGroup:
    """The group row, created if new and locked. Caller holds the write transaction."""
    models.ConsumerGroup.objects.get_or_create(name=group_name)
    # Group lock: serializes joins, leaves, expiry, rebalances and member polls of one group.
    # FOR NO KEY UPDATE (here and for every group and partition lock): rows inserted under
    # other locks that reference the group (in-flight runs, dead letters) take KEY SHARE on it
    # when PostgreSQL checks their foreign keys at commit, which FOR UPDATE would block.
    return models.ConsumerGroup.objects.select_for_update(no_key=True).get(name=group_name)


def rebalance(group: models.ConsumerGroup, topic_id: int) -> None:
    """Reassign the topic's partitions over the group's live members on it; bump the generation.

    Caller holds the group lock.
    """
    members = list(
        models.GroupMember.objects.filter(group=group, topic_id=topic_id).values_list(
            "member_id", flat=True
        )
    )
    partitions = dict(
        models.Partition.objects.filter(topic_id=topic_id).values_list("number", "id")
    )
    leases = {
        lease.partition_id: lease
        for lease in models.PartitionLease.objects.filter(
            group=group, partition_id__in=partitions.values()
        )
    }
    number_of = {pid: number for number, pid in partitions.items()}
    previous = {
        number_of[pid]: lease.member_id
        for pid, lease in leases.items()
        if lease.member_id is not None
    }
    if group.mode == models.ConsumerGroup.Mode.BROADCAST:
        # Every member reads every partition from its own offsets: no partition has one holder.
        owners: dict[int, str] = {}
    else:
        owners = assignment.assign(group.strategy, members, sorted(partitions), previous)
    group.generation += 1
    group.save(update_fields=["generation"])
    changed, created = [], []
    for number, pid in partitions.items():
        owner = owners.get(number)
        lease = leases.get(pid)
        if lease is None:
            created.append(
                models.PartitionLease(
                    group=group, partition_id=pid, member_id=owner, generation=group.generation
                )
            )
        else:
            lease.member_id = owner
            lease.generation = group.generation
            changed.append(lease)
    models.PartitionLease.objects.bulk_create(created)
    models.PartitionLease.objects.bulk_update(changed, ["member_id", "generation"])


SESSION_TIMEOUT_MS_RANGE = (1_000, 3_600_000)
MAX_ATTEMPTS_RANGE = (1, 1000)
MAX_RETRY_LEVELS = 100


def _validate_settings(
    strategy: str | None,
    session_timeout_ms: int | None,
    mode: str | None,
    ack_deadline_ms: int | None,
    max_attempts: int | None,
    retry_delays_ms: list[int] | None,
) -> None:
    if strategy is not None and strategy not in assignment.STRATEGIES:
        raise errors.InvalidRequest(
            f"strategy is one of {', '.join(assignment.STRATEGIES)}.", strategy=strategy
        )
    if mode is not None and mode not in models.ConsumerGroup.Mode.values:
        modes = ", ".join(models.ConsumerGroup.Mode.values)
        raise errors.InvalidRequest(f"mode is one of {modes}.", mode=mode)
    low, high = SESSION_TIMEOUT_MS_RANGE
    if session_timeout_ms is not None and not low <= session_timeout_ms <= high:
        raise errors.InvalidRequest(
            f"session_timeout_ms is {low} to {high}.", session_timeout_ms=session_timeout_ms
        )
    if ack_deadline_ms is not None:
        delivery.validate_ack_deadline(ack_deadline_ms)
    low, high = MAX_ATTEMPTS_RANGE
    if max_attempts is not None and not low <= max_attempts <= high:
        raise errors.InvalidRequest(f"max_attempts is {low} to {high}.", max_attempts=max_attempts)
    if retry_delays_ms is not None:
        longest = ferry_settings.get("MAX_DELAY_SECONDS") * 1000
        if len(retry_delays_ms) > MAX_RETRY_LEVELS or not all(
            0 <= d <= longest for d in retry_delays_ms
        ):
            raise errors.InvalidRequest(
                f"retry_delays_ms is up to {MAX_RETRY_LEVELS} delays of 0 to {longest} ms "
                "(empty: RocketMQ's levels).",
            )


def configure_group(
    principal: Principal,
    group_name: str,
    *,
    strategy: str | None = None,
    session_timeout_ms: int | None = None,
    mode: str | None = None,
    ordered: bool | None = None,
    ack_deadline_ms: int | None = None,
    max_attempts: int | None = None,
    retry_delays_ms: list[int] | None = None,
) -> GroupInfo:
    """Change how a group assigns and delivers; a field left out (None) keeps its value.

    A new strategy rebalances at once; the mode changes only while the group has no members.
    An operator's action: it needs an 'admin:*' key (or the console), like managing keys.
    """
    keys.require_superuser(principal)
    groups.validate_group_name(group_name)
    _validate_settings(
        strategy, session_timeout_ms, mode, ack_deadline_ms, max_attempts, retry_delays_ms
    )
    given = {
        "strategy": strategy,
        "session_timeout_ms": session_timeout_ms,
        "mode": mode,
        "ordered": ordered,
        "ack_deadline_ms": ack_deadline_ms,
        "max_attempts": max_attempts,
        "retry_delays_ms": retry_delays_ms,
    }
    with transaction.atomic(durable=True):
        group = locked_group(group_name)
        member_topics = set(
            models.GroupMember.objects.filter(group=group).values_list("topic_id", flat=True)
        )
        changed = [
            name
            for name, value in given.items()
            if value is not None and value != getattr(group, name)
        ]
        if "mode" in changed and member_topics:
            raise errors.GroupHasMembers(
                f"Group {group_name!r} has members: the mode changes only while it has none.",
                group=group_name,
            )
        for name in changed:
            setattr(group, name, given[name])
        if changed:
            group.save(update_fields=changed)
        if "strategy" in changed:
            for topic_id in sorted(member_topics):
                rebalance(group, topic_id)
    return groups.describe_group(principal, group_name)


def rebalance_topic(topic: models.Topic) -> None:
    """Rebalance every group with members on a topic whose partitions grew.

    Caller holds the topic lock (lock order: topic, then group).
    """
    group_ids = set(
        models.GroupMember.objects.filter(topic=topic).values_list("group_id", flat=True)
    )
    for group in (
        models.ConsumerGroup.objects.select_for_update(no_key=True)
        .filter(id__in=group_ids)
        .order_by("id")
    ):
        rebalance(group, topic.id)


def _info(group: models.ConsumerGroup, member: models.GroupMember, topic_name: str) -> MemberInfo:
    partitions = models.Partition.objects.filter(id__in=held_partitions(group, member)).values_list(
        "number", flat=True
    )
    return MemberInfo(
        group=group.name,
        member_id=member.member_id,
        topic=topic_name,
        generation=group.generation,
        partitions=tuple(sorted(partitions)),
        session_timeout_ms=group.session_timeout_ms,
        heartbeat_interval_ms=ferry_settings.get("HEARTBEAT_INTERVAL_MS"),
        mode=group.mode,
        filter=member.filter,
        topic_id=member.topic_id,
    )


def join_group(
    principal: Principal,
    group_name: str,
    topic_name: str,
    member_id: str | None = None,
    *,
    filter: dict[str, Any] | None = None,
    start: str = "earliest",
    start_timestamp_ms: int | None = None,
) -> MemberInfo:
    """Join (or rejoin) a group as a consumer of a topic with a subscription filter.

    Returns the member's partitions; a rejoin may change the filter. start says where the
    group (in broadcast mode: this member) begins on partitions where it has no position yet:
    earliest, latest or timestamp (Kafka's auto.offset.reset); an existing position is kept.
    """
    groups.validate_group_name(group_name)
    topic = topics.get_topic(principal, topic_name, "consume")
    member_id = member_id or uuid.uuid4().hex
    _validate_member_id(member_id)
    filters.parse_filter(filter)  # refuse a bad filter before anything is stored
    if start not in START_POSITIONS:
        raise errors.InvalidRequest(f"start is one of {', '.join(START_POSITIONS)}.", start=start)
    if start == "timestamp" and start_timestamp_ms is None:
        raise errors.InvalidRequest("Starting at a timestamp needs start_timestamp_ms.")
    now = log.now_ms()
    with transaction.atomic(durable=True):
        group = locked_group(group_name)
        member = models.GroupMember.objects.filter(group=group, member_id=member_id).first()
        moved_from = None
        if member is None:
            member = models.GroupMember.objects.create(
                group=group,
                member_id=member_id,
                topic_id=topic.id,
                joined_ms=now,
                heartbeat_ms=now,
                filter=filter,
            )
        else:
            # A rejoin is a consumer that restarted: what it had in flight comes back at once.
            _release_in_flight(group, [member_id], member.topic_id)
            if member.topic_id != topic.id:
                moved_from = member.topic_id
            member.topic_id = topic.id
            member.heartbeat_ms = now
            member.filter = filter
            member.save(update_fields=["topic", "heartbeat_ms", "filter"])
        _start_positions(group, member, start, start_timestamp_ms)
        rebalance(group, topic.id)
        if moved_from is not None:
            rebalance(group, moved_from)
        return _info(group, member, topic.name)


START_POSITIONS = ("earliest", "latest", "timestamp")


def _start_positions(
    group: models.ConsumerGroup, member: models.GroupMember, start: str, timestamp_ms: int | None
) -> None:
    """Give the member's offsets a position where they have none. Caller holds the group lock."""
    subscriber = member.member_id if group.mode == models.ConsumerGroup.Mode.BROADCAST else ""
    have = set(
        models.GroupOffset.objects.filter(
            group=group, subscriber=subscriber, partition__topic_id=member.topic_id
        ).values_list("partition_id", flat=True)
    )
    rows = []
    for p in models.Partition.objects.filter(topic_id=member.topic_id).exclude(id__in=have):
        if start == "latest":
            position = p.next_offset
        elif start == "timestamp":
            position = log.offset_for_timestamp(p, timestamp_ms or 0)
        else:
            position = p.start_offset
        rows.append(
            models.GroupOffset(
                group=group,
                partition=p,
                subscriber=subscriber,
                committed_offset=position,
                delivered_offset=position,
            )
        )
    models.GroupOffset.objects.bulk_create(rows, ignore_conflicts=True)


def _member(
    group_name: str, member_id: str, lock: bool
) -> tuple[models.ConsumerGroup, models.GroupMember]:
    """The group (locked if lock) and the member; MemberNotFound when gone (expired or left)."""
    groups_qs = models.ConsumerGroup.objects.filter(name=group_name)
    group = (groups_qs.select_for_update(no_key=True) if lock else groups_qs).first()
    member = (
        models.GroupMember.objects.select_related("topic")
        .filter(group=group, member_id=member_id)
        .first()
        if group is not None
        else None
    )
    if group is None or member is None:
        raise errors.MemberNotFound(group=group_name, member_id=member_id)
    return group, member


def heartbeat(principal: Principal, group_name: str, member_id: str) -> MemberInfo:
    """Keep a member alive; returns its current generation and partitions (rejoin if gone)."""
    with transaction.atomic(durable=True):
        group, member = _member(group_name, member_id, lock=False)
        keys.require(principal, member.topic.name, "consume")
        member.heartbeat_ms = log.now_ms()
        member.save(update_fields=["heartbeat_ms"])
        return _info(group, member, member.topic.name)


def leave_group(principal: Principal, group_name: str, member_id: str) -> None:
    """Leave a group at once: the member's partitions go to the others."""
    with transaction.atomic(durable=True):
        group, member = _member(group_name, member_id, lock=True)
        keys.require(principal, member.topic.name, "consume")
        member.delete()
        _release_in_flight(group, [member_id], member.topic_id)
        rebalance(group, member.topic_id)


def expire_members() -> int:
    """Remove members silent past their group's session timeout and rebalance; returns how many."""
    now = log.now_ms()
    candidates = models.GroupMember.objects.select_related("group").values_list(
        "group_id", "heartbeat_ms", "group__session_timeout_ms"
    )
    group_ids = sorted({gid for gid, beat, timeout in candidates if beat < now - timeout})
    removed = 0
    for group_id in group_ids:
        with transaction.atomic(durable=True):
            group = (
                models.ConsumerGroup.objects.select_for_update(no_key=True)
                .filter(id=group_id)
                .first()
            )
            if group is None:
                continue
            # Checked again under the lock: a heartbeat may have arrived meanwhile.
            stale = models.GroupMember.objects.filter(
                group=group, heartbeat_ms__lt=now - group.session_timeout_ms
            )
            gone = list(stale.values_list("member_id", "topic_id"))
            count, _ = stale.delete()
            removed += count
            for topic_id in sorted({topic_id for _, topic_id in gone}):
                _release_in_flight(group, [m for m, t in gone if t == topic_id], topic_id)
                rebalance(group, topic_id)
    return removed


def _release_in_flight(group: models.ConsumerGroup, member_ids: list[str], topic_id: int) -> None:
    """Make what gone members held in flight deliverable again at once (no attempt is counted
    as failed). Caller holds the group lock."""
    released = models.InFlight.objects.filter(
        group=group,
        member_id__in=member_ids,
        partition__topic_id=topic_id,
        state=models.InFlight.State.DELIVERED,
    ).update(state=models.InFlight.State.RETRY_WAIT, deadline_ms=log.now_ms())
    if released:
        delivery.wake(topic_id)


def touch_member(
    group_name: str, member_id: str, topic_id: int
) -> tuple[models.ConsumerGroup, models.GroupMember]:
    """Lock the group, check the member is in it on this topic, record a heartbeat.

    Caller holds the write transaction.
    """
    group, member = _member(group_name, member_id, lock=True)
    if member.topic_id != topic_id:
        raise errors.InvalidRequest(
            f"Member {member_id!r} joined for topic {member.topic.name!r}; join again to switch.",
            member_id=member_id,
        )
    now = log.now_ms()
    # A member polling in a tight loop need not write its heartbeat every time: a tenth of the
    # session timeout (at most 1 s) late is still far from expiring it.
    if now - member.heartbeat_ms >= min(1000, group.session_timeout_ms // 10):
        member.heartbeat_ms = now
        member.save(update_fields=["heartbeat_ms"])
    return group, member


def held_partitions(group: models.ConsumerGroup, member: models.GroupMember) -> set[int]:
    """Partition ids the member reads: its leases, or in broadcast mode all of its topic's.

    Caller holds the group lock.
    """
    if group.mode == models.ConsumerGroup.Mode.BROADCAST:
        return set(
            models.Partition.objects.filter(topic_id=member.topic_id).values_list("id", flat=True)
        )
    return set(
        models.PartitionLease.objects.filter(group=group, member_id=member.member_id).values_list(
            "partition_id", flat=True
        )
    )


def list_members(group: models.ConsumerGroup) -> list[MemberSummary]:
    """The group's members with their partitions (no permission check: callers filter)."""
    held: dict[str, list[int]] = {}
    for member_id, number in models.PartitionLease.objects.filter(
        group=group, member_id__isnull=False
    ).values_list("member_id", "partition__number"):
        if member_id is not None:
            held.setdefault(member_id, []).append(number)
    broadcast = group.mode == models.ConsumerGroup.Mode.BROADCAST
    return [
        MemberSummary(
            member_id=m.member_id,
            topic=m.topic.name,
            partitions=tuple(range(m.topic.partition_count))
            if broadcast
            else tuple(sorted(held.get(m.member_id, []))),
            joined_ms=m.joined_ms,
            heartbeat_ms=m.heartbeat_ms,
            filter=m.filter,
        )
        for m in models.GroupMember.objects.filter(group=group)
        .select_related("topic")
        .order_by("member_id")
    ]
