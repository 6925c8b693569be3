"""Member sessions: join, heartbeat, leave, expiry, and the partitions each member holds.

See docs/semantics.md#membership.
"""

import uuid
from typing import Any

from django.db import transaction
from django.db.models import F

from broker import models
from broker import settings as ferry_settings
from broker.core import bulk, errors, filters, inflight, keys, log, memo, topics
from broker.core.membership import rebalancing
from broker.core.records import MemberInfo, MemberSummary, Principal

MEMBER_ID_MAX = 100


def validate_group_name(name: str) -> None:
    if not topics.NAME_RE.fullmatch(name or ""):
        raise errors.InvalidRequest(
            "Group names are 1 to 200 characters from A-Z, a-z, 0-9, '.', '_' and '-'.",
            group=name,
        )


def _validate_member_id(member_id: str) -> None:
    if not topics.NAME_RE.fullmatch(member_id) or len(member_id) > MEMBER_ID_MAX:
        raise errors.InvalidRequest(
            f"Member ids are 1 to {MEMBER_ID_MAX} characters from A-Z, a-z, 0-9, '.', '_', '-'.",
            member_id=member_id,
        )


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
    client: str = "",
    host: str = "",
) -> MemberInfo:
    """Join (or rejoin) a group as a consumer of a topic with a subscription filter.

    Returns the member's partitions; a rejoin may change the filter. start says where the
    group (in broadcast mode: this member) begins on partitions where it has no position yet:
    earliest, latest or timestamp (Kafka's auto.offset.reset); an existing position is kept.
    client is the consumer's own name for itself (Kafka's client.id) and host where the edge
    saw it connect from; both are shown, never trusted.
    """
    validate_group_name(group_name)
    topic = topics.get_topic(principal, topic_name, "consume")
    member_id = member_id or uuid.uuid4().hex
    _validate_member_id(member_id)
    filters.parse_filter(filter)  # refuse a bad filter before anything is stored
    if start not in START_POSITIONS:
        raise errors.InvalidRequest(f"start is one of {', '.join(START_POSITIONS)}.", start=start)
    if start == "timestamp" and start_timestamp_ms is None:
        raise errors.InvalidRequest("Starting at a timestamp needs start_timestamp_ms.")
    if len(client) > CLIENT_MAX:
        raise errors.InvalidRequest(
            f"client is at most {CLIENT_MAX} characters.", client_length=len(client)
        )
    host = host[:CLIENT_MAX]
    now = log.now_ms()
    with transaction.atomic(durable=True):
        group = rebalancing.locked_group(group_name)
        member = models.GroupMember.objects.filter(group=group, member_id=member_id).first()
        if member is None:
            member = models.GroupMember.objects.create(
                group=group,
                member_id=member_id,
                topic_id=topic.id,
                joined_ms=now,
                heartbeat_ms=now,
                filter=filter,
                client=client,
                host=host,
            )
        else:
            if member.topic_id != topic.id:
                # Another consumer's id, perhaps under another key: taking it over would move
                # that member and release its messages (a rejoin is for the same topic only).
                raise errors.MemberIdTaken(group=group_name, member_id=member_id)
            # A rejoin is a consumer that restarted: what it had in flight comes back at once.
            _release_in_flight(group, [member_id], member.topic_id)
            member.topic_id = topic.id
            member.heartbeat_ms = now
            member.filter = filter
            member.client, member.host = client, host
            member.save(update_fields=["topic", "heartbeat_ms", "filter", "client", "host"])
        _start_positions(group, member, start, start_timestamp_ms)
        rebalancing.rebalance(group, topic.id)
        return _info(group, member, topic.name)


START_POSITIONS = ("earliest", "latest", "timestamp")
# The longest client name (and host description) a member keeps.
CLIENT_MAX = 100


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


# Raw SQL on every member poll and push: the ORM would compile these queries each time.
WHERE_GROUP = "WHERE name = %s"
WHERE_MEMBER = "WHERE group_id = %s AND member_id = %s"
SELECT_LEASES = (
    "SELECT partition_id FROM broker_partitionlease WHERE group_id = %s AND member_id = %s"
)
SELECT_PARTITIONS = "SELECT id FROM broker_partition WHERE topic_id = %s"


def find_group(
    group_name: str, lock: bool = False, shared: bool = False
) -> models.ConsumerGroup | None:
    """The group by name, or None; locked (the group lock) if lock, in share mode if shared.
    Raw SQL: every member poll, push and settlement looks its group up, and the ORM would
    compile the query."""
    sql = WHERE_GROUP
    if lock and bulk.vendor() == "postgresql":
        # The group lock (see rebalancing.locked_group). Shared by deliveries: they exclude
        # membership changes and rebalances, not one another (each locks its partitions'
        # offset rows), so a group's members deliver side by side (docs/architecture.md#locks).
        sql += " FOR SHARE" if shared else " FOR NO KEY UPDATE"
    return next(iter(bulk.select_models(models.ConsumerGroup, sql, [group_name])), None)


def _member(
    group_name: str, member_id: str, lock: bool, shared: bool = False
) -> tuple[models.ConsumerGroup, models.GroupMember]:
    """The group (locked if lock) and the member; MemberNotFound when gone (expired or left)."""
    group = find_group(group_name, lock, shared)
    found = (
        bulk.select_models(models.GroupMember, WHERE_MEMBER, [group.id, member_id])
        if group is not None
        else []
    )
    member = found[0] if found else None
    if group is None or member is None:
        raise errors.MemberNotFound(group=group_name, member_id=member_id)
    return group, member


def heartbeat(principal: Principal, group_name: str, member_id: str) -> MemberInfo:
    """Keep a member alive; returns its current generation and partitions (rejoin if gone)."""
    with transaction.atomic(durable=True):
        group, member = _member(group_name, member_id, lock=False)
        if not keys.allows(principal, member.topic.name, "consume"):
            # Another topic's member is, to this key, no member at all (issue 9, item 10).
            raise errors.MemberNotFound(group=group_name, member_id=member_id)
        member.heartbeat_ms = log.now_ms()
        member.save(update_fields=["heartbeat_ms"])
        return _info(group, member, member.topic.name)


def leave_group(principal: Principal, group_name: str, member_id: str) -> None:
    """Leave a group at once: the member's partitions go to the others."""
    with transaction.atomic(durable=True):
        group, member = _member(group_name, member_id, lock=True)
        if not keys.allows(principal, member.topic.name, "consume"):
            # Another topic's member is, to this key, no member at all (issue 9, item 10).
            raise errors.MemberNotFound(group=group_name, member_id=member_id)
        member.delete()
        _release_in_flight(group, [member_id], member.topic_id)
        rebalancing.rebalance(group, member.topic_id)


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
                rebalancing.rebalance(group, topic_id)
    return removed


def _release_in_flight(group: models.ConsumerGroup, member_ids: list[str], topic_id: int) -> None:
    """Make what gone members held in flight deliverable again at once (no attempt is counted
    as failed). Caller holds the group lock.

    A waiting retry's attempt is the failed attempts so far and the redelivery adds one, so the
    hand-over takes back the one its delivery added: the redelivery has the same attempt.
    """
    released = models.InFlight.objects.filter(
        group=group,
        member_id__in=member_ids,
        partition__topic_id=topic_id,
        state=models.InFlight.State.DELIVERED,
    ).update(
        state=models.InFlight.State.RETRY_WAIT,
        deadline_ms=log.now_ms(),
        attempt=F("attempt") - 1,
    )
    if released:
        inflight.wake(topic_id)


def touch_member(
    group_name: str, member_id: str, topic_id: int, *, beat: bool = True
) -> tuple[models.ConsumerGroup, models.GroupMember]:
    """Lock the group (shared: a delivery), check the member is in it on this topic, record a
    heartbeat (unless beat is False: see heartbeat_due).

    Caller holds the write transaction.
    """
    group, member = _member(group_name, member_id, lock=True, shared=True)
    if member.topic_id != topic_id:
        raise errors.InvalidRequest(
            f"Member {member_id!r} joined for topic {member.topic.name!r}; join again to switch.",
            member_id=member_id,
        )
    if beat:
        _beat(group, member)
    return group, member


# Raw SQL, one statement for what a delivery looks up first: its topic, its group and its member
# on that topic. On PostgreSQL the group is locked first, on its own: a row lock taken by a
# join would, after waiting for a leave or a rebalance, return the member row as it was
# before (only the locked row is read again), so the member is read after the lock (in the
# lock's round trip: bulk.read_ahead).
MEMBER_OF_TOPIC = (
    "FROM broker_topic t JOIN broker_consumergroup g ON g.name = %s "
    "JOIN broker_groupmember m ON m.group_id = g.id AND m.member_id = %s AND m.topic_id = t.id "
    "WHERE t.name = %s"
)


def touch_member_of_topic(
    group_name: str, member_id: str, topic_name: str, *, beat: bool = True
) -> tuple[models.Topic, models.ConsumerGroup, models.GroupMember] | None:
    """touch_member and the topic by name, in one statement on SQLite (two on PostgreSQL, in
    one round trip); None
    when the topic, the group or the member is missing, or the member is on another topic (the
    caller then looks each up on its own, for the error). Checks no permission: the caller
    does first.

    Caller holds the write transaction.
    """
    group: Any
    params = [group_name, member_id, topic_name]
    if bulk.vendor() == "postgresql":
        parts = ((models.Topic, "t"), (models.GroupMember, "m"))
        bulk.read_ahead(bulk.joined_sql(parts, MEMBER_OF_TOPIC), params)
        group = find_group(group_name, lock=True, shared=True)
        if group is None:
            return None
        pair = bulk.select_joined(parts, MEMBER_OF_TOPIC, params)
        if not pair:
            return None
        topic, member = pair[0]
    else:
        # SQLite: BEGIN IMMEDIATE already serializes this transaction with every writer.
        found = bulk.select_joined(
            ((models.Topic, "t"), (models.ConsumerGroup, "g"), (models.GroupMember, "m")),
            MEMBER_OF_TOPIC,
            params,
        )
        if not found:
            return None
        topic, group, member = found[0]
    assert isinstance(topic, models.Topic)  # noqa: S101 (for mypy: select_joined's order)
    assert isinstance(group, models.ConsumerGroup)  # noqa: S101
    assert isinstance(member, models.GroupMember)  # noqa: S101
    if beat:
        _beat(group, member)
    return topic, group, member


def heartbeat_due(group: models.ConsumerGroup, member: models.GroupMember) -> bool:
    """Whether a delivery to the member writes its heartbeat (touch_member, with beat)."""
    # A member polling in a tight loop need not write its heartbeat every time: a tenth of the
    # session timeout (at most 1 s) late is still far from expiring it.
    return log.now_ms() - member.heartbeat_ms >= min(1000, group.session_timeout_ms // 10)


def _beat(group: models.ConsumerGroup, member: models.GroupMember) -> None:
    if heartbeat_due(group, member):
        member.heartbeat_ms = log.now_ms()
        member.save(update_fields=["heartbeat_ms"])


# What held_partitions read for deliveries, by group (id and creation time), member, topic and
# generation. Leases change only in rebalancing.rebalance, which bumps the generation under the
# group lock (and a topic's partitions grow only with a rebalance of its groups), so a committed
# generation's entry never goes stale: a new generation is a new key. A group deleted and made
# again has a new id, or (SQLite may reuse the id of rows whose insert rolled back, as tests do)
# a new creation time.
_held: dict[tuple[int, object, str, int, int], frozenset[int]] = {}
HELD_CACHE_MAX = 10_000


def held_partitions(
    group: models.ConsumerGroup, member: models.GroupMember, *, cached: bool = False
) -> frozenset[int]:
    """Partition ids the member reads: its leases, or in broadcast mode all of its topic's.

    Caller holds the group lock. cached (every delivery asks): the answer is read once per
    generation; only for a caller that read the group's generation from the database under
    the lock, never one whose transaction rebalanced (that generation may roll back).
    """
    key = (group.id, group.created_at, member.member_id, member.topic_id, group.generation)
    held = _held.get(key) if cached else None
    if held is not None:
        return held
    if group.mode == models.ConsumerGroup.Mode.BROADCAST:
        rows = bulk.run(SELECT_PARTITIONS, [member.topic_id])
    else:
        rows = bulk.run(SELECT_LEASES, [group.id, member.member_id])
    held = frozenset(pid for (pid,) in rows)
    if cached:
        memo.remember(_held, key, held, HELD_CACHE_MAX)
    return held


def list_members(group: models.ConsumerGroup) -> list[MemberSummary]:
    """The group's members with their partitions (no permission check: callers filter)."""
    return list_members_by_group([group]).get(group.id, [])


def list_members_by_group(
    groups: list[models.ConsumerGroup],
) -> dict[int, list[MemberSummary]]:
    """Per group id, its members with their partitions, in two queries for all the groups."""
    held: dict[tuple[int, str], list[int]] = {}
    for group_id, member_id, number in models.PartitionLease.objects.filter(
        group__in=groups, member_id__isnull=False
    ).values_list("group_id", "member_id", "partition__number"):
        if member_id is not None:
            held.setdefault((group_id, member_id), []).append(number)
    broadcast = {g.id for g in groups if g.mode == models.ConsumerGroup.Mode.BROADCAST}
    found: dict[int, list[MemberSummary]] = {}
    for m in (
        models.GroupMember.objects.filter(group__in=groups)
        .select_related("topic")
        .order_by("group_id", "member_id")
    ):
        found.setdefault(m.group_id, []).append(
            MemberSummary(
                member_id=m.member_id,
                topic=m.topic.name,
                partitions=tuple(range(m.topic.partition_count))
                if m.group_id in broadcast
                else tuple(sorted(held.get((m.group_id, m.member_id), []))),
                joined_ms=m.joined_ms,
                heartbeat_ms=m.heartbeat_ms,
                filter=m.filter,
                client=m.client,
                host=m.host,
            )
        )
    return found
