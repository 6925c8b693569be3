"""Group positions: the committed offsets a group reads from, and poll, commit and reset.

See docs/architecture.md#locks: every write here locks the group offset rows, in id order.
"""

import itertools
import threading
from collections.abc import Iterable

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from broker import models
from broker import settings as ferry_settings
from broker.core import bulk, dbthreads, deadletters, errors, events, keys, log, membership, topics
from broker.core.groups import info
from broker.core.records import (
    GroupTopicOffsets,
    PollResult,
    Principal,
    StoredMessage,
)

# A poll of a topic with a TTL reads at most this many messages past the expired ones it skips.
SCAN_LIMIT = 10_000

_poll_turn = itertools.count()
_poll_turn_lock = threading.Lock()


def check_consume(principal: Principal, topic_name: str) -> None:
    """Refuse a bad topic name, or a key that may not consume the topic (no database read)."""
    topics.validate_name(topic_name)
    keys.require(principal, topic_name, "consume")


def topic_for_consume(principal: Principal, topic_name: str) -> models.Topic:
    check_consume(principal, topic_name)
    # Raw SQL: every poll and push asks, and the ORM would compile the query each time.
    topic = next(iter(bulk.select_models(models.Topic, WHERE_TOPIC, [topic_name])), None)
    if topic is None:
        raise errors.TopicNotFound(name=topic_name)
    return topic


WHERE_TOPIC = "WHERE name = %s"


def ensure_offsets(
    group: models.ConsumerGroup, partition_ids: Iterable[int], subscriber: str
) -> None:
    """Create the group's offset rows for these partitions. Caller holds the transaction."""
    models.GroupOffset.objects.bulk_create(
        [
            models.GroupOffset(group=group, partition_id=pid, subscriber=subscriber)
            for pid in partition_ids
        ],
        ignore_conflicts=True,
    )


def _ensure_offsets(group_name: str, topic: models.Topic) -> models.ConsumerGroup:
    """Create the group and its (group-wide) offset rows for every partition of the topic.

    Caller holds the transaction.
    """
    group, _ = models.ConsumerGroup.objects.get_or_create(name=group_name)
    ensure_offsets(group, topic.partitions.values_list("id", flat=True), "")
    return group


def poll_messages(
    principal: Principal,
    group_name: str,
    topic_name: str,
    max_messages: int,
    auto_commit: bool,
) -> PollResult:
    """The next messages after the group's committed offsets, across the topic's partitions.

    With auto_commit the offsets move past the returned messages in the same transaction, so
    concurrent pollers of one group never get the same message; without it the group sees the
    same messages again until it commits. Members poll through delivery.deliver_messages.
    """
    membership.validate_group_name(group_name)
    limit = ferry_settings.get("MAX_FETCH_MESSAGES")
    if not 1 <= max_messages <= limit:
        raise errors.InvalidRequest(
            f"max_messages must be between 1 and {limit}.", max_messages=max_messages
        )
    topic = topic_for_consume(principal, topic_name)
    try:
        return _poll(group_name, topic, topic_name, max_messages, auto_commit)
    except IntegrityError:
        # The only rows a poll inserts are the group's offset rows: on PostgreSQL their
        # foreign keys fail at commit when delete_group (or delete_topic) removed the group
        # (or the partitions) meanwhile. Nothing was stored; the next poll starts afresh.
        raise errors.GroupNotFound(
            f"Group {group_name!r} was deleted during the poll; poll again.", group=group_name
        ) from None


def _poll(
    group_name: str, topic: models.Topic, topic_name: str, max_messages: int, auto_commit: bool
) -> PollResult:
    with transaction.atomic(durable=True):
        group = _ensure_offsets(group_name, topic)
        # Group offset locks (id order): serialize pollers and committers of this group.
        rows = list(
            models.GroupOffset.objects.select_for_update(no_key=True)
            .filter(group=group, partition__topic=topic, subscriber="")
            .select_related("partition")
            .order_by("id")
        )
        rows.sort(key=lambda row: row.partition.number)
        if rows and auto_commit:
            # Rotate the first partition read so one busy partition cannot starve the rest.
            # Without a commit the order stays fixed: the group sees the same messages again.
            with _poll_turn_lock:
                turn = next(_poll_turn) % len(rows)
            rows = rows[turn:] + rows[:turn]
        messages: list[StoredMessage] = []
        next_offsets: dict[int, int] = {}
        expired = 0
        for row in rows:
            remaining = max_messages - len(messages)
            if remaining <= 0:
                break
            p = row.partition
            start = max(row.committed_offset, p.start_offset)
            if start >= p.next_offset:
                continue
            if topic.message_ttl_ms is None:
                batch = log.read_partition(p.id, p.number, start, remaining)
                position = batch[-1].offset + 1 if batch else start
            else:
                batch, position, lead, dead = _read_live(group, topic, p, start, remaining)
                expired += dead
                if lead > row.committed_offset and not auto_commit:
                    # Expired messages the group would read first: move past them, as a
                    # filter's skips do, so a poll without commits is not held by them.
                    row.committed_offset = lead
                    row.save(update_fields=["committed_offset", "updated_at"])
            if position == start:
                continue
            messages.extend(batch)
            next_offsets[p.number] = position
            if auto_commit:
                row.committed_offset = position
                row.save(update_fields=["committed_offset", "updated_at"])
    messages.sort(key=lambda m: (m.partition, m.offset))
    return PollResult(
        topic_id=topic.id,
        group=group_name,
        topic=topic_name,
        messages=tuple(messages),
        next_offsets=next_offsets,
        committed=auto_commit,
        expired=expired,
    )


def _read_live(
    group: models.ConsumerGroup,
    topic: models.Topic,
    p: models.Partition,
    start: int,
    wanted: int,
) -> tuple[list[StoredMessage], int, int, int]:
    """Read up to wanted messages from start, dead-lettering those past the topic's TTL.

    Returns the messages, the offset after the last one read, the offset of the first message
    not expired (where the group's position may move without a commit) and how many were
    dead-lettered now. Caller holds the group offset lock of the partition.
    """
    now = log.now_ms()
    oldest = now - (topic.message_ttl_ms or 0)
    live: list[StoredMessage] = []
    expired: list[StoredMessage] = []
    position, lead, scanned = start, -1, 0
    while len(live) < wanted and position < p.next_offset and scanned < SCAN_LIMIT:
        chunk = log.read_partition(p.id, p.number, position, wanted - len(live))
        if not chunk:
            break
        for m in chunk:
            scanned += 1
            position = m.offset + 1
            if m.timestamp_ms < oldest:
                expired.append(m)
            else:
                live.append(m)
                if lead < 0:
                    lead = m.offset
    # Those before the first live one move the position and are never read again; later
    # ones (a client-set older timestamp) may be, and are recorded once.
    lead = position if lead < 0 else lead
    leading = [m for m in expired if m.offset < lead]
    later = [m for m in expired if m.offset >= lead]
    deadletters.dead_letter_messages(group, topic, "", leading, "expired", now)
    dead = len(leading) + deadletters.dead_letter_once(group, topic, "", later, "expired", now)
    return live, position, lead, dead


async def poll_messages_async(
    principal: Principal,
    group_name: str,
    topic_name: str,
    max_messages: int,
    auto_commit: bool,
    max_wait_ms: int,
) -> PollResult:
    """poll_messages, waiting up to max_wait_ms for a message when there is none yet."""
    log.validate_max_wait(max_wait_ms)
    return await events.long_poll(
        lambda: dbthreads.run(
            poll_messages, principal, group_name, topic_name, max_messages, auto_commit
        ),
        is_empty=lambda r: not r.messages and not r.expired,
        topic_id_of=lambda r: r.topic_id,
        max_wait_ms=max_wait_ms,
    )


def commit_offsets(
    principal: Principal,
    group_name: str,
    topic_name: str,
    offsets: dict[int, int],
    *,
    member_id: str | None = None,
    generation: int | None = None,
) -> GroupTopicOffsets:
    """Set the group's committed offsets for some partitions of a topic (Kafka's commit).

    The offset becomes the group's position: what is in flight on the partition is dropped.
    With member_id (and generation) the commit is fenced like Kafka's: refused for a partition
    the member does not hold or after a rebalance it has not seen.
    """
    membership.validate_group_name(group_name)
    topic = topic_for_consume(principal, topic_name)
    if not offsets:
        raise errors.InvalidRequest("Name at least one partition's offset to commit.")
    with transaction.atomic(durable=True):
        group = _ensure_offsets(group_name, topic)
        held = None
        if member_id is not None:
            group, member = membership.touch_member(group_name, member_id, topic.id)
            if generation is not None and generation != group.generation:
                raise errors.StaleGeneration(
                    f"Generation {generation} is stale: group {group_name!r} is at "
                    f"{group.generation}. Heartbeat to learn your partitions.",
                    generation=generation,
                    current_generation=group.generation,
                )
            held = membership.held_partitions(group, member)
        rows = _commit_locked(group, topic, offsets, held, member_id)
    return info._group_topic_offsets(group_name, topic, rows)


def commit_offsets_in_transaction(
    group_name: str, topic: models.Topic, offsets: dict[int, int]
) -> None:
    """commit_offsets without a member, checked by the caller (transactions.commit_transaction).

    Caller holds the write transaction and checked the consume permission on the topic.
    """
    group = _ensure_offsets(group_name, topic)
    _commit_locked(group, topic, offsets, None, None)


def _commit_locked(
    group: models.ConsumerGroup,
    topic: models.Topic,
    offsets: dict[int, int],
    held: frozenset[int] | None,
    member_id: str | None,
) -> list[models.GroupOffset]:
    """Lock the group's offset rows of the topic and move them. Caller holds the transaction."""
    # Group offset locks (id order): serialize with pollers and deliveries of this group.
    rows = {
        row.partition.number: row
        for row in models.GroupOffset.objects.select_for_update(no_key=True)
        .filter(group=group, partition__topic=topic, subscriber="")
        .select_related("partition")
        .order_by("id")
    }
    moves = []
    for number, offset in sorted(offsets.items()):
        row = rows.get(number)
        if row is None:
            raise errors.PartitionNotFound(topic=topic.name, partition=number)
        if held is not None and row.partition_id not in held:
            raise errors.StaleGeneration(
                f"Member {member_id!r} does not hold partition {number}.",
                partition=number,
                current_generation=group.generation,
            )
        if not 0 <= offset <= row.partition.next_offset:
            raise errors.OffsetOutOfRange(
                f"Offset {offset} is past the end of partition {number} "
                f"({row.partition.next_offset}).",
                partition=number,
                offset=offset,
                end_offset=row.partition.next_offset,
            )
        moves.append((row, offset))
    _move(moves)
    return list(rows.values())


# The rows' new positions in one statement: the ORM's save() a row (or its bulk_update) made a
# commit of a 512-partition topic's offsets take 0.4 s on SQLite. SQLite runs MOVE once a row in
# one driver call (bulk.run_many); PostgreSQL takes the rows as two arrays.
MOVE = (
    "UPDATE broker_groupoffset SET committed_offset = %s, delivered_offset = %s, "
    "updated_at = %s WHERE id = %s"
)
MOVE_ARRAYS = (
    "UPDATE broker_groupoffset AS o SET committed_offset = t.target, delivered_offset = "
    "t.target, updated_at = %s FROM unnest(%s::bigint[], %s::bigint[]) AS t(id, target) "
    "WHERE o.id = t.id"
)


def _move(moves: list[tuple[models.GroupOffset, int]]) -> None:
    """Make each offset its row's position, dropping the rows' in-flight deliveries. Caller
    holds the rows' locks."""
    if not moves:
        return
    now = timezone.now()
    stored_now = connection.ops.adapt_datetimefield_value(now)
    by_subscriber: dict[str, list[int]] = {}
    for row, offset in moves:
        row.committed_offset = row.delivered_offset = offset
        row.updated_at = now
        by_subscriber.setdefault(row.subscriber, []).append(row.partition_id)
    if bulk.vendor() == "sqlite":
        bulk.run_many(MOVE, [(offset, offset, stored_now, row.id) for row, offset in moves])
    else:
        ids, targets = [row.id for row, _ in moves], [offset for _, offset in moves]
        bulk.run(MOVE_ARRAYS, (stored_now, ids, targets))
    group_id = moves[0][0].group_id
    for subscriber, partition_ids in by_subscriber.items():
        models.InFlight.objects.filter(
            group_id=group_id, subscriber=subscriber, partition_id__in=partition_ids
        ).delete()


def delete_group(principal: Principal, group_name: str, force: bool = False) -> None:
    """Delete a group with its offsets, in-flight messages, dead letters, leases and members.

    Refused while it has live members (heartbeat within its session timeout) unless forced;
    forced, its members learn on their next heartbeat or poll that they are gone.
    """
    keys.require_superuser(principal)
    membership.validate_group_name(group_name)
    with transaction.atomic(durable=True):
        # Group lock: serializes with joins, polls and settlements of this group.
        group = (
            models.ConsumerGroup.objects.select_for_update(no_key=True)
            .filter(name=group_name)
            .first()
        )
        if group is None:
            raise errors.GroupNotFound(group=group_name)
        live_since = log.now_ms() - group.session_timeout_ms
        live = models.GroupMember.objects.filter(group=group, heartbeat_ms__gte=live_since).count()
        if live and not force:
            raise errors.GroupHasMembers(
                f"Group {group_name!r} has {live} live member(s); stop them or pass force.",
                group=group_name,
                members=live,
            )
        # Cascades to offsets, in-flight runs, dead letters, leases, members, samples, redrives.
        group.delete()
