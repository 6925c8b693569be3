"""Delivery to members: due retries first, then new messages, each with a receipt.

See docs/semantics.md#acknowledgements and docs/architecture.md#in-flight-by-runs.
"""

import functools
from typing import Any, NamedTuple

import orjson
from django.db.models import F

from broker import models
from broker import settings as ferry_settings
from broker.core import (
    bulk,
    dbthreads,
    deadletters,
    errors,
    events,
    filters,
    groups,
    inflight,
    log,
    membership,
    memo,
    retries,
    trace,
)
from broker.core.records import Delivery, DeliveryResult, Principal, StoredMessage

# A poll reads at most this many messages past what a selective filter skips, then answers.
SCAN_LIMIT = 10_000

# A selective filter's reads: this many messages at a time, whatever the room.
FILTERED_READ = 500

# Which of its partitions a member reads first at its next delivery, by the keys of its offset
# rows in order (one member's in clustering mode, and a broadcast member's own): they take
# turns, so that one busy partition cannot starve the rest.
_turns: dict[tuple[inflight.OffsetKey, ...], int] = {}

# Where each offset row's next delivery reads from, as this process's last delivery left it:
# the read that the next lock of the row announces (bulk.read_ahead), so that on PostgreSQL
# the messages come back with the lock, not in a round trip of their own. A guess: when the
# delivery starts elsewhere (another process delivered, a seek, retention, a retry taken
# first), it reads for itself and the rows read ahead are dropped.
_next_reads: dict[inflight.OffsetKey, int] = {}


def _parsed_filter(spec: dict[str, Any] | None) -> filters.Filter:
    if spec is None:
        return filters.EVERYTHING
    return _parse_cached(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS).decode())


@functools.lru_cache(maxsize=256)
def _parse_cached(spec_json: str) -> filters.Filter:
    return filters.parse_filter(orjson.loads(spec_json))


def validate_max_messages(max_messages: int) -> None:
    limit = ferry_settings.get("MAX_FETCH_MESSAGES")
    if not 1 <= max_messages <= limit:
        raise errors.InvalidRequest(
            f"max_messages must be between 1 and {limit}.", max_messages=max_messages
        )


def deliver_messages(
    principal: Principal,
    group_name: str,
    topic_name: str,
    member_id: str,
    max_messages: int,
    *,
    auto_ack: bool = False,
) -> DeliveryResult:
    """Hand a member its next messages: due retries first, then new ones, each with a receipt.

    In clustering mode a member reads only the partitions it holds a lease on, from the group's
    offsets; in broadcast mode it reads every partition from its own. Messages its filter skips
    advance the offsets and count as filtered; messages past the topic's TTL are dead-lettered.
    With auto_ack the messages are settled as they are handed out (at most once).
    """
    membership.validate_group_name(group_name)
    validate_max_messages(max_messages)
    groups.check_consume(principal, topic_name)
    args = (principal, group_name, topic_name, member_id, max_messages, auto_ack)
    try:
        return _deliver_once(*args, guess=True)
    except GuessedWrong:
        return _deliver_once(*args, guess=False)  # rolled back: its locks let go of


def _deliver_once(
    principal: Principal,
    group_name: str,
    topic_name: str,
    member_id: str,
    max_messages: int,
    auto_ack: bool,
    *,
    guess: bool,
) -> DeliveryResult:
    """deliver_messages' transaction; guess: its offset rows locked ahead (lock_ahead)."""
    with bulk.bookkeeping():
        # A member gone or a key refused raises, and the rollback lets go of what was guessed.
        ahead = lock_ahead(group_name, member_id, topic_name, max_messages) if guess else None
        topic, group, member = member_for_delivery(
            principal, group_name, member_id, topic_name, guessed=ahead is not None
        )
        return deliver_in_transaction(
            topic, group, member, max_messages, auto_ack=auto_ack, guess=ahead
        )


def member_for_delivery(
    principal: Principal,
    group_name: str,
    member_id: str,
    topic_name: str,
    *,
    guessed: bool = False,
) -> tuple[models.Topic, models.ConsumerGroup, models.GroupMember]:
    """The topic, the group (locked) and the member, its heartbeat noted: one statement, or,
    when one of them is missing, one lookup each for its error (TopicNotFound, MemberNotFound,
    InvalidRequest for a member of another topic), all raised before anything is written.

    guessed: offset rows were locked ahead in this transaction (lock_ahead). The heartbeat is
    then not written: the member's row would be locked after those rows, where a delivery that
    did not guess locks it before them, and the two could deadlock. When one is due,
    GuessedWrong: the caller runs again unguessed, which writes it.

    Caller holds the bookkeeping transaction and checked the key (groups.check_consume).
    """
    beat = not guessed
    found = membership.touch_member_of_topic(group_name, member_id, topic_name, beat=beat)
    if found is None:
        topic = groups.topic_for_consume(principal, topic_name)
        group, member = membership.touch_member(group_name, member_id, topic.id, beat=beat)
        found = (topic, group, member)
    if guessed and membership.heartbeat_due(found[1], found[2]):
        raise GuessedWrong
    return found


def _subscriber(group: models.ConsumerGroup, member: models.GroupMember) -> str:
    # Broadcast members read with offsets of their own; clustering members share the group's.
    return member.member_id if group.mode == models.ConsumerGroup.Mode.BROADCAST else ""


class LockGuess(NamedTuple):
    """The offset rows a member's delivery will lock, locked ahead of its group's lock's
    answer (lock_ahead): their keys in id order, and the time their due retries were asked at."""

    keys: tuple[inflight.OffsetKey, ...]
    now_ms: int

    @property
    def group_id(self) -> int:
        return self.keys[0][0]


class GuessedWrong(Exception):
    """The offset rows locked ahead are not the member's (internal: the caller rolls back,
    which lets go of them before any other lock is asked for, and runs again unguessed)."""


# By (group name, member id, topic name): the offset rows the member's last lock on this
# process took, with its group's ordered flag and whether its filter takes every message (for
# the read of the messages): what lock_ahead guesses.
_last_locks: dict[tuple[str, str, str], tuple[tuple[inflight.OffsetKey, ...], bool, bool]] = {}


def lock_ahead(group_name: str, member_id: str, topic_name: str, room: int) -> LockGuess | None:
    """On PostgreSQL, lock the offset rows the member's last delivery locked, and read the
    messages it would deliver next, in the round trip of its group's lock (bulk.read_ahead,
    announced before member_for_delivery): a round trip fewer. None when there is no guess.

    The guess is checked by lock_member_offsets, once the group's lock has answered: rows that
    are not the member's (a rebalance, the member gone) raise GuessedWrong, and the caller
    rolls back. The rows are locked in id order after the group's lock, as lock_member_offsets
    locks them; a wrong guess is let go of before any other lock is asked for, and a call that
    guessed leaves the member's heartbeat to an unguessed one (member_for_delivery), so
    guessing adds no deadlock (docs/architecture.md#locks).
    """
    if bulk.vendor() != "postgresql":
        return None
    last = _last_locks.get((group_name, member_id, topic_name))
    if last is None or not last[0]:
        return None
    keys, ordered, everything = last
    guess = LockGuess(keys, log.now_ms())
    inflight.lock_ahead(keys, guess.now_ms)
    group_id, subscriber = keys[0][0], keys[0][2]
    partition_ids = frozenset(pid for _, pid, _ in keys)
    _read_next_ahead(group_id, subscriber, partition_ids, ordered, everything, room)
    return guess


def lock_member_offsets(
    topic: models.Topic,
    group: models.ConsumerGroup,
    member: models.GroupMember,
    room: int,
    guess: LockGuess | None = None,
) -> tuple[dict[inflight.OffsetKey, models.GroupOffset], bool]:
    """Lock the offset rows the member delivers from, in id order (those that exist yet); and
    whether a retry of theirs is due (deliver_in_transaction's retries_due). room: how many
    messages the delivery that follows will ask for, at most (for its read ahead). guess: what
    lock_ahead locked ahead in this transaction, if anything (GuessedWrong when it is not
    this).

    Caller holds the bookkeeping transaction and the group's lock (member_for_delivery).
    """
    subscriber = _subscriber(group, member)
    partition_ids = membership.held_partitions(group, member, cached=True)
    keys = tuple(sorted((group.id, pid, subscriber) for pid in partition_ids))
    everything = _parsed_filter(member.filter).is_everything
    memo.remember(
        _last_locks, (group.name, member.member_id, topic.name), (keys, group.ordered, everything)
    )
    if guess is None:
        _read_next_ahead(group.id, subscriber, partition_ids, group.ordered, everything, room)
        return inflight.locked_offsets_and_due(keys, log.now_ms())
    if guess.keys != keys:
        raise GuessedWrong
    return inflight.locked_offsets_and_due(keys, guess.now_ms)


def _read_next_ahead(
    group_id: int,
    subscriber: str,
    partition_ids: frozenset[int],
    ordered: bool,
    everything: bool,
    room: int,
) -> None:
    """Announce the first read of a delivery of room messages (log.read_partition_ahead): of
    the partition whose turn it is (_Batch.take_new), from where this process's last delivery
    from it ended. everything: the member's filter takes every message."""
    if not partition_ids or room <= 0:
        return
    pids = sorted(partition_ids)
    turns = tuple((group_id, pid, subscriber) for pid in pids)
    pid = pids[_turns.get(turns, 0) % len(pids)]
    start = _next_reads.get((group_id, pid, subscriber))
    if start is None:
        return
    log.read_partition_ahead(pid, start, (1 if ordered else room) if everything else FILTERED_READ)


def deliver_in_transaction(
    topic: models.Topic,
    group: models.ConsumerGroup,
    member: models.GroupMember,
    max_messages: int,
    *,
    auto_ack: bool = False,
    locked: dict[inflight.OffsetKey, models.GroupOffset] | None = None,
    recompute: set[inflight.OffsetKey] | None = None,
    retries_due: bool | None = None,
    guess: LockGuess | None = None,
) -> DeliveryResult:
    """deliver_messages inside the caller's bookkeeping transaction, after touch_member.

    locked: offset rows the caller locked in this transaction already (and keeps up to date),
    read again only when they do not cover the member's partitions. recompute: offset rows
    whose committed offsets an ack in this transaction left to recompute
    (settle.ack_in_transaction's defer_committed), all among the member's. retries_due:
    whether a retry was due when the caller locked those rows (lock_member_offsets). guess:
    what lock_ahead locked ahead in this transaction, when the caller locked nothing
    (GuessedWrong when it is not the member's rows).
    """
    now = log.now_ms()
    member_id = member.member_id
    subscriber = _subscriber(group, member)
    partition_ids = membership.held_partitions(group, member, cached=True)
    wanted = [(group.id, pid, subscriber) for pid in sorted(partition_ids)]
    due = retries_due
    if locked is not None and all(key in locked for key in wanted):
        offsets = {key: locked[key] for key in wanted}
    else:
        offsets, due = lock_member_offsets(topic, group, member, max_messages, guess)
    if len(offsets) < len(partition_ids):
        # First delivery from some partition: its offsets start where the group does.
        groups.ensure_offsets(group, partition_ids, subscriber)
        offsets, due = inflight.locked_offsets_and_due(wanted, now)
    batch = _Batch(group, topic, member, subscriber, now, max_messages, auto_ack)
    batch.recompute = recompute or set()
    batch.before = {
        r.partition_id: (r.committed_offset, r.delivered_offset, r.filtered_count)
        for r in offsets.values()
    }
    batch.take_retries(offsets, due)
    batch.take_new(offsets)
    batch.store()
    batch.save_offsets(offsets)
    return DeliveryResult(
        topic_id=topic.id,
        group=group.name,
        topic=topic.name,
        member_id=member_id,
        generation=group.generation,
        deliveries=tuple(batch.deliveries),
        filtered=batch.filtered,
        expired=batch.expired,
        held_back=group.ordered and bool(batch.blocked or batch.deliveries),
    )


# Raw SQL: most deliveries find no due retry, and this check costs a tenth of the ORM query.
ANY_DUE = (
    "SELECT 1 FROM broker_inflight WHERE group_id = %s AND subscriber = %s AND state = %s "
    "AND deadline_ms <= %s AND partition_id IN ({}) LIMIT 1"
)


def _any_due(batch: "_Batch", partition_ids: list[int]) -> bool:
    sql = ANY_DUE.format(", ".join(["%s"] * len(partition_ids)))
    params = (
        batch.group.id,
        batch.subscriber,
        models.InFlight.State.RETRY_WAIT.value,
        batch.now,
        *partition_ids,
    )
    return bool(bulk.run(sql, params))


def _read_spans(
    due: list[models.InFlight], spans: dict[int, int]
) -> dict[int, dict[int, StoredMessage]]:
    """The stored messages of each due row from its offset to its span's end, by partition: a
    run's as a range, as a new delivery reads, and the single rows' in one read a partition."""
    found: dict[int, dict[int, StoredMessage]] = {row.partition_id: {} for row in due}
    singles: dict[int, list[int]] = {}
    numbers: dict[int, int] = {}
    for row in due:
        last, number = spans[row.id], row.partition.number
        if row.last_offset == row.offset:
            singles.setdefault(row.partition_id, []).append(row.offset)
            numbers[row.partition_id] = number
        elif last >= row.offset:
            messages = log.read_partition(
                row.partition_id, number, row.offset, last - row.offset + 1
            )
            found[row.partition_id].update((m.offset, m) for m in messages)
    for pid, offsets in singles.items():
        found[pid].update(inflight.read_at(pid, numbers[pid], offsets))
    return found


# The retries a delivery hands out again: its token, member and deadline, one attempt more.
# Raw SQL with the delivery's next statement: the ORM's bulk_update cost several milliseconds.
REDELIVER = (  # bulk.for_ids
    "UPDATE broker_inflight SET state = %s, member_id = %s, token = %s, deadline_ms = %s, "
    "attempt = attempt + 1 WHERE id = ANY(%s)"
)
SHORTEN_RUN = "UPDATE broker_inflight SET last_offset = %s WHERE id = %s"


class _Batch:
    """One delivery's working set. Used inside deliver_messages' transaction, under its locks."""

    def __init__(
        self,
        group: models.ConsumerGroup,
        topic: models.Topic,
        member: models.GroupMember,
        subscriber: str,
        now: int,
        max_messages: int,
        auto_ack: bool,
    ) -> None:
        self.group, self.topic, self.member = group, topic, member
        self.subscriber, self.now, self.max_messages = subscriber, now, max_messages
        self.auto_ack = auto_ack
        self.deadline_ms = now + group.ack_deadline_ms
        self.token = inflight.new_token()
        self.match = _parsed_filter(member.filter)
        self.deliveries: list[Delivery] = []
        self.new_rows: list[tuple[object, ...]] = []
        self.redelivered: list[models.InFlight] = []
        # Runs handed out in front pieces: the rest of each waits on as a row of self.rest,
        # the front (shortened, its new last offset set) goes out.
        self.rest: list[tuple[object, ...]] = []
        self.shortened: list[models.InFlight] = []
        self.events: list[models.TraceEvent] = []
        self.filtered = 0
        self.expired = 0
        self.removed = 0
        # Whether in-flight rows were deleted (gone, expired, auto-acked retries), and the first
        # offset of each partition's new run: what the committed offsets depend on.
        self.deleted = False
        self.first_new: dict[int, int] = {}
        self.before: dict[int, tuple[int, int, int]] = {}
        # Ordered mode: partitions with a message in flight deliver nothing new.
        self.blocked: set[int] = set()
        # Offset rows whose committed offsets an earlier settlement in this transaction left
        # to recompute.
        self.recompute: set[inflight.OffsetKey] = set()

    @property
    def room(self) -> int:
        return self.max_messages - len(self.deliveries)

    def _expired(self, m: StoredMessage, row: models.InFlight | None = None) -> bool:
        """Whether m is past the topic's TTL; a redriven retry (row) never is: a dead letter's
        expiration is removed, as RabbitMQ does (docs/semantics.md#message-ttl)."""
        if row is not None and row.redriven:
            return False
        ttl = self.topic.message_ttl_ms
        return ttl is not None and m.timestamp_ms + ttl < self.now

    def _hand_out(self, m: StoredMessage, receipt: str, attempt: int) -> None:
        self.deliveries.append(Delivery(m, receipt, attempt, self.deadline_ms))
        if self.topic.trace:
            self.events.append(
                trace.event(
                    self.topic.id,
                    m.partition,
                    m.offset,
                    "delivered",
                    group=self.group.name,
                    member_id=self.member.member_id,
                    attempt=attempt,
                    at_ms=self.now,
                )
            )

    def take_retries(
        self, offsets: dict[inflight.OffsetKey, models.GroupOffset], any_due: bool | None
    ) -> None:
        """Redeliver due retries (nacked, expired deadline, redriven, released by a leaver).

        any_due: whether one is, as the offsets' lock found (None: not asked; asked here).
        """
        pids = [key[1] for key in offsets]
        if not pids:
            return
        if not self.group.ordered and not (
            any_due if any_due is not None else _any_due(self, pids)
        ):
            return
        pending = models.InFlight.objects.filter(
            group=self.group, subscriber=self.subscriber, partition_id__in=pids
        ).select_related("partition")
        waiting = pending.filter(state=models.InFlight.State.RETRY_WAIT, deadline_ms__lte=self.now)
        if not self.group.ordered:
            due = list(waiting.order_by("deadline_ms", "id")[: self.max_messages])
            if not due:
                return
            spans = self._spans(due)
            found = _read_spans(due, spans)
            # A run goes out whole, unless retention removed one of its messages or one is past
            # its TTL: that one is split first, and its messages dead-lettered one by one.
            broken = [
                row
                for row in due
                if row.last_offset > row.offset and not self._all_fresh(row, spans, found)
            ]
            if broken:
                inflight._split(broken)
                due = list(waiting.order_by("deadline_ms", "id")[: self.max_messages])
                spans = self._spans(due)
                found = _read_spans(due, spans)
        else:
            inflight._split(list(waiting.filter(last_offset__gt=F("offset"))))
            # One message of a partition in flight at most: its lowest row, if any, blocks it.
            lowest: dict[int, models.InFlight] = {}
            for row in pending.order_by("partition_id", "offset"):
                lowest.setdefault(row.partition_id, row)
            self.blocked = set(lowest)
            due = [
                row
                for row in lowest.values()
                if row.state == models.InFlight.State.RETRY_WAIT and row.deadline_ms <= self.now
            ]
            spans = {row.id: row.offset for row in due}
            found = _read_spans(due, spans)
        gone, expired = [], []
        for row in due:
            messages = found[row.partition_id]
            if row.last_offset > row.offset:
                self._redeliver_run(row, spans[row.id], messages)
                continue
            m = messages.get(row.offset)
            if m is None:
                # Retention or drop_oldest removed it before the group settled it: it is
                # dead-lettered by its coordinates, never dropped without a record.
                gone.append(row)
            elif self._expired(m, row):
                expired.append(row)
            elif self.room > 0:
                self._redeliver(row)
                self._hand_out(
                    m, inflight.receipt(self.token, row.partition_id, row.offset), row.attempt
                )
        self.deleted = self.deleted or bool(gone or expired)
        self.expired += len(expired)
        self.removed += len(gone)
        retries.dead_letter_rows(expired, self.group, self.topic, "expired", self.now)
        retries.dead_letter_rows(gone, self.group, self.topic, "removed", self.now)

    def _spans(self, due: list[models.InFlight]) -> dict[int, int]:
        """The last offset of each due row to read: a single row's own, and a run's as far as
        the room left after the rows before it (a run past the room is not read: offset - 1)."""
        left, spans = self.room, {}
        for row in due:
            last = row.offset if row.last_offset == row.offset else row.offset + left - 1
            spans[row.id] = min(row.last_offset, last)
            left -= max(0, spans[row.id] - row.offset + 1)
        return spans

    def _all_fresh(
        self,
        run: models.InFlight,
        spans: dict[int, int],
        found: dict[int, dict[int, StoredMessage]],
    ) -> bool:
        messages = found[run.partition_id]
        for offset in range(run.offset, spans[run.id] + 1):
            m = messages.get(offset)
            if m is None or self._expired(m, run):
                return False
        return True

    def _redeliver(self, row: models.InFlight) -> None:
        """Hand the row out again: one attempt more here, and in the database with the rest of
        the delivery's fields (_store_redelivered)."""
        row.attempt += 1
        self.redelivered.append(row)

    def _store_redelivered(self) -> None:
        if not self.redelivered:
            return
        ids = bulk.id_array([row.id for row in self.redelivered])
        delivered = models.InFlight.State.DELIVERED.value
        fields = (delivered, self.member.member_id, self.token, self.deadline_ms)
        bulk.defer(bulk.for_ids(REDELIVER), (*fields, ids), table="broker_inflight")
        for row in self.shortened:
            bulk.defer(SHORTEN_RUN, (row.last_offset, row.id), table="broker_inflight")

    def _redeliver_run(
        self, run: models.InFlight, read_to: int, messages: dict[int, StoredMessage]
    ) -> None:
        """Redeliver a due run whole as one row, or its front as far as the room goes: the rest
        waits on as a run of its own (docs/architecture.md#in-flight-by-runs)."""
        last = min(read_to, run.offset + self.room - 1)
        if last < run.offset:
            return
        if last < run.last_offset:
            self.rest.append(inflight.piece(run, last + 1, run.last_offset))
            run.last_offset = last
            self.shortened.append(run)
        self._redeliver(run)
        for offset in range(run.offset, last + 1):
            receipt = inflight.receipt(self.token, run.partition_id, offset)
            self._hand_out(messages[offset], receipt, run.attempt)

    def take_new(self, offsets: dict[inflight.OffsetKey, models.GroupOffset]) -> None:
        """Hand out messages never delivered, from each partition's delivered offset on."""
        if not offsets:
            return
        turns = tuple(sorted(offsets))
        rows = [offsets[key] for key in turns]
        turn = _turns.get(turns, 0) % len(rows)
        memo.remember(_turns, turns, turn + 1)
        for row in rows[turn:] + rows[:turn]:
            if self.room <= 0:
                break
            if row.partition_id in self.blocked:
                continue
            self._take_from(row, 1 if self.group.ordered else self.room)

    def _take_from(self, row: models.GroupOffset, wanted: int) -> None:
        p = row.partition
        position = max(row.delivered_offset, row.committed_offset, p.start_offset)
        scanned, taken, expired = 0, 0, []
        ttl, everything = self.topic.message_ttl_ms, self.match.is_everything
        run_start = -1  # first offset of the run being taken, -1 when none
        # Every message goes out as it is (no filter, TTL, trace or auto-ack): taken whole.
        plain = everything and ttl is None and not self.topic.trace and not self.auto_ack
        while taken < wanted and position < p.next_offset and scanned < SCAN_LIMIT:
            chunk = log.read_locked(
                p, self.topic.created_at, position, wanted - taken if everything else FILTERED_READ
            )
            if not chunk:
                break
            if plain:
                if run_start < 0:
                    run_start = chunk[0].offset
                self._hand_out_plain(row.partition_id, chunk)
                taken += len(chunk)
                scanned += len(chunk)
                position = chunk[-1].offset + 1
                continue
            for m in chunk:
                scanned += 1
                position = m.offset + 1
                if ttl is not None and m.timestamp_ms + ttl < self.now:
                    expired.append(m)
                elif not everything and not self.match.matches(m.tag, m.headers):
                    row.filtered_count += 1
                    self.filtered += 1
                else:
                    taken += 1
                    if run_start < 0:
                        run_start = m.offset
                    self._hand_out(m, self._receipt(row.partition_id, m.offset), 1)
                    if taken >= wanted:
                        break
                    continue
                # A skipped message ends the run being taken.
                self._end_run(row.partition_id, run_start, m.offset - 1)
                run_start = -1
        self._end_run(row.partition_id, run_start, position - 1)
        row.delivered_offset = position
        memo.remember(_next_reads, (self.group.id, row.partition_id, self.subscriber), position)
        if expired:
            self.expired += len(expired)
            deadletters.dead_letter_messages(
                self.group, self.topic, self.subscriber, expired, "expired", self.now
            )

    def _hand_out_plain(self, partition_id: int, messages: list[StoredMessage]) -> None:
        """_hand_out of each message, first attempts with receipts and no trace, in one go."""
        prefix, deadline_ms = inflight.receipt_prefix(self.token, partition_id), self.deadline_ms
        self.deliveries.extend(
            [Delivery(m, f"{prefix}{m.offset:x}", 1, deadline_ms) for m in messages]
        )

    def _receipt(self, partition_id: int, offset: int) -> str:
        return "" if self.auto_ack else inflight.receipt(self.token, partition_id, offset)

    def _end_run(self, partition_id: int, first: int, last: int) -> None:
        if first < 0 or self.auto_ack:
            return
        self.first_new.setdefault(partition_id, first)
        self.new_rows.append(
            (
                self.group.id,
                partition_id,
                self.subscriber,
                first,
                last,
                models.InFlight.State.DELIVERED.value,
                self.member.member_id,
                self.token,
                1,
                self.deadline_ms,
                "",
            )
        )

    def save_offsets(self, offsets: dict[inflight.OffsetKey, models.GroupOffset]) -> None:
        """Store the moved offsets; the committed ones computed here when nothing was deleted.

        Without deletions the lowest in-flight offset of a partition that had some is
        unchanged (committed < delivered tells it had some), and one that had none now starts
        at its first new run, or at its delivered offset. The last write of a delivery: on
        PostgreSQL it goes with the COMMIT (bulk.defer; the rows are not read again).
        """
        if self.deleted:
            inflight.save_recomputed(offsets, read_back=False)
            return
        if self.recompute:
            # Those rows, and the ones this delivery moved: a member's other partitions are
            # left alone (one row written for an ack and its push, not one per partition).
            inflight.save_recomputed(
                {
                    key: row
                    for key, row in offsets.items()
                    if key in self.recompute
                    or (row.delivered_offset, row.filtered_count)
                    != self.before[row.partition_id][1:]
                },
                read_back=False,
            )
            return
        moved = []
        for row in offsets.values():
            before = self.before[row.partition_id]
            if before[0] >= before[1]:
                first = self.first_new.get(row.partition_id)
                if first is not None:
                    row.committed_offset = first
                else:
                    row.committed_offset = max(row.delivered_offset, row.committed_offset)
            if (row.committed_offset, row.delivered_offset, row.filtered_count) != before:
                moved.append(row)
        bulk.update_rows(
            moved,
            ["committed_offset", "delivered_offset", "filtered_count", "updated_at"],
            deferred=True,
        )

    def store(self) -> None:
        if self.auto_ack:
            # Settled on delivery: the redelivered rows are done with too.
            models.InFlight.objects.filter(id__in=[r.id for r in self.redelivered]).delete()
            self.deleted = self.deleted or bool(self.redelivered)
        else:
            self._store_redelivered()
            bulk.insert_rows("broker_inflight", inflight.IN_FLIGHT_COLUMNS, self.new_rows)
        # What the room left of the runs that came due waits on, even when the front was
        # settled on delivery.
        bulk.insert_rows("broker_inflight", inflight.IN_FLIGHT_COLUMNS, self.rest)
        trace.record(self.events)


async def deliver_messages_async(
    principal: Principal,
    group_name: str,
    topic_name: str,
    member_id: str,
    max_messages: int,
    *,
    auto_ack: bool = False,
    max_wait_ms: int = 0,
) -> DeliveryResult:
    """deliver_messages, waiting up to max_wait_ms for something to deliver."""
    log.validate_max_wait(max_wait_ms)
    return await events.long_poll(
        lambda: dbthreads.run(
            functools.partial(
                deliver_messages,
                principal,
                group_name,
                topic_name,
                member_id,
                max_messages,
                auto_ack=auto_ack,
            )
        ),
        is_empty=lambda r: not r.deliveries and not r.filtered and not r.expired,
        topic_id_of=lambda r: r.topic_id,
        max_wait_ms=max_wait_ms,
    )
