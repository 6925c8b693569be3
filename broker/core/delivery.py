"""Acknowledged delivery: deliver to members, ack, nack, reject, extend, deadline sweep.

See docs/semantics.md#acknowledgements and docs/architecture.md#locks. Every write here locks
the group offset rows (GroupOffset, in id order) of the partitions it touches before it reads or
changes their InFlight rows: that lock serializes deliveries, settlements, the deadline sweep and
redrives of one (group, partition, subscriber), so a message is never handed out twice while in
flight and the committed offset is always the lowest unsettled offset.
"""

import bisect
import functools
import itertools
import secrets
import threading
from collections.abc import Iterable
from typing import Any, NamedTuple

import orjson
from django.db import connection
from django.db.models import F, Min, Q

from broker import models
from broker import settings as ferry_settings
from broker.core import (
    bulk,
    dbthreads,
    errors,
    events,
    filters,
    groups,
    keys,
    log,
    membership,
    retries,
    trace,
)
from broker.core.records import (
    Delivery,
    DeliveryResult,
    Principal,
    SettleResult,
    StoredMessage,
)

OffsetKey = tuple[int, int, str]  # (group id, partition id, subscriber)
IN_FLIGHT_COLUMNS = (
    "group_id",
    "partition_id",
    "subscriber",
    "offset",
    "last_offset",
    "state",
    "member_id",
    "token",
    "attempt",
    "deadline_ms",
    "last_error",
)

# A poll reads at most this many messages past what a selective filter skips, then answers.
SCAN_LIMIT = 10_000
RECEIPT_MAX = 40

_turn = itertools.count()
_turn_lock = threading.Lock()


def new_token() -> str:
    """A random token for one delivery batch; receipt() adds where each message is."""
    return secrets.token_hex(8)


def receipt(token: str, partition_id: int, offset: int) -> str:
    return f"{token}.{partition_id:x}.{offset:x}"


def _parse_receipt(text: str) -> tuple[str, int, int] | None:
    """(token, partition id, offset) of a receipt, or None for a string that is not one."""
    parts = text.split(".")
    if len(parts) != 3:
        return None
    try:
        return parts[0], int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


def _row(r: models.InFlight, first: int, last: int) -> tuple[object, ...]:
    """The columns of a piece [first, last] of a run, its other fields unchanged."""
    return (
        r.group_id,
        r.partition_id,
        r.subscriber,
        first,
        last,
        r.state,
        r.member_id,
        r.token,
        r.attempt,
        r.deadline_ms,
        r.last_error,
    )


def _split(rows: Iterable[models.InFlight], removed: dict[int, set[int]] | None = None) -> None:
    """Split runs into one row per offset, leaving out removed[row id]. Caller holds the locks.

    Settling part of a run, and the slower paths (nack, reject, extend, retries, the deadline
    sweep), work on single messages; the runs they touch are split first.
    """
    runs = [r for r in rows if r.last_offset > r.offset or (removed and r.id in removed)]
    if not runs:
        return
    models.InFlight.objects.filter(id__in=[r.id for r in runs]).delete()
    gone = removed or {}
    bulk.insert_rows(
        "broker_inflight",
        IN_FLIGHT_COLUMNS,
        [
            _row(r, o, o)
            for r in runs
            for o in range(r.offset, r.last_offset + 1)
            if o not in gone.get(r.id, ())
        ],
    )


def wake(topic_id: int) -> None:
    """Wake the topic's long polls after commit: messages are deliverable again."""
    events.messages_returned(topic_id)


def _parsed_filter(spec: dict[str, Any] | None) -> filters.Filter:
    if spec is None:
        return filters.EVERYTHING
    return _parse_cached(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS).decode())


@functools.lru_cache(maxsize=256)
def _parse_cached(spec_json: str) -> filters.Filter:
    return filters.parse_filter(orjson.loads(spec_json))


def read_at(partition_id: int, number: int, offsets: Iterable[int]) -> dict[int, StoredMessage]:
    """The stored messages at these offsets of a partition (those retention kept)."""
    rows = models.Message.objects.filter(
        partition_id=partition_id, offset__in=list(offsets)
    ).values_list(
        "offset", "timestamp_ms", "key", "tag", "headers", "value", "is_json", "client_id"
    )

    return {
        o: StoredMessage(
            number, o, ts, key, tag, orjson.dumps(headers).decode(), bytes(v), is_json, cid
        )
        for o, ts, key, tag, headers, v, is_json, cid in rows
    }


def locked_offsets(keys_: Iterable[OffsetKey]) -> dict[OffsetKey, models.GroupOffset]:
    """Lock the group offset rows of these keys, in id order. Caller holds the transaction."""
    wanted = sorted(set(keys_))
    if not wanted:
        return {}
    match = Q()
    for group_id, partition_id, subscriber in wanted:
        match |= Q(group_id=group_id, partition_id=partition_id, subscriber=subscriber)
    # Group offset locks: serialize everything that reads or changes these partitions' InFlight.
    rows = (
        models.GroupOffset.objects.select_for_update(no_key=True)
        .filter(match)
        .select_related("partition")
        .order_by("id")
    )
    return {(r.group_id, r.partition_id, r.subscriber): r for r in rows}


def recompute_committed(rows: dict[OffsetKey, models.GroupOffset]) -> None:
    """Set each row's committed offset to its lowest in-flight offset, or its delivered offset.

    Caller holds the rows' locks (locked_offsets).
    """
    if not rows:
        return
    match = Q()
    for group_id, partition_id, subscriber in rows:
        match |= Q(group_id=group_id, partition_id=partition_id, subscriber=subscriber)
    lowest = {
        (g, p, s): low
        for g, p, s, low in models.InFlight.objects.filter(match)
        .values("group_id", "partition_id", "subscriber")
        .annotate(low=Min("offset"))
        .values_list("group_id", "partition_id", "subscriber", "low")
    }
    changed = []
    for key, row in rows.items():
        low = lowest.get(key)
        # Without anything in flight, a position a plain (non-member) poll moved on stands.
        target = low if low is not None else max(row.delivered_offset, row.committed_offset)
        if target != row.committed_offset:
            row.committed_offset = target
            changed.append(row)
    models.GroupOffset.objects.bulk_update(changed, ["committed_offset"])


def _validate_max_messages(max_messages: int) -> None:
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
    groups.validate_group_name(group_name)
    _validate_max_messages(max_messages)
    topic = groups.topic_for_consume(principal, topic_name)
    now = log.now_ms()
    with bulk.bookkeeping():
        group, member = membership.touch_member(group_name, member_id, topic.id)
        broadcast = group.mode == models.ConsumerGroup.Mode.BROADCAST
        subscriber = member_id if broadcast else ""
        partition_ids = membership.held_partitions(group, member)
        offsets = locked_offsets((group.id, pid, subscriber) for pid in partition_ids)
        if len(offsets) < len(partition_ids):
            # First delivery from some partition: its offsets start where the group does.
            groups.ensure_offsets(group, partition_ids, subscriber)
            offsets = locked_offsets((group.id, pid, subscriber) for pid in partition_ids)
        batch = _Batch(group, topic, member, subscriber, now, max_messages, auto_ack)
        batch.before = {
            r.partition_id: (r.committed_offset, r.delivered_offset, r.filtered_count)
            for r in offsets.values()
        }
        batch.take_retries(offsets)
        batch.take_new(offsets)
        batch.store()
        batch.save_offsets(offsets)
    return DeliveryResult(
        topic_id=topic.id,
        group=group_name,
        topic=topic_name,
        member_id=member_id,
        generation=group.generation,
        deliveries=tuple(batch.deliveries),
        filtered=batch.filtered,
        expired=batch.expired,
    )


# Raw SQL: most deliveries find no due retry, and this check costs a tenth of the ORM query.
ANY_DUE = (
    "SELECT 1 FROM broker_inflight WHERE group_id = %s AND subscriber = %s AND state = %s "
    "AND deadline_ms <= %s AND partition_id IN ({}) LIMIT 1"
)


def _any_due(batch: "_Batch", partition_ids: list[int]) -> bool:
    sql = ANY_DUE.format(", ".join(["%s"] * len(partition_ids)))
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            (
                batch.group.id,
                batch.subscriber,
                models.InFlight.State.RETRY_WAIT.value,
                batch.now,
                *partition_ids,
            ),
        )
        return cursor.fetchone() is not None


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
        self.token = new_token()
        self.match = _parsed_filter(member.filter)
        self.deliveries: list[Delivery] = []
        self.new_rows: list[tuple[object, ...]] = []
        self.redelivered: list[models.InFlight] = []
        self.events: list[models.TraceEvent] = []
        self.filtered = 0
        self.expired = 0
        # Whether in-flight rows were deleted (gone, expired, auto-acked retries), and the first
        # offset of each partition's new run: what the committed offsets depend on.
        self.deleted = False
        self.first_new: dict[int, int] = {}
        self.before: dict[int, tuple[int, int, int]] = {}
        # Ordered mode: partitions with a message in flight deliver nothing new.
        self.blocked: set[int] = set()

    @property
    def room(self) -> int:
        return self.max_messages - len(self.deliveries)

    def _expired(self, m: StoredMessage) -> bool:
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

    def take_retries(self, offsets: dict[OffsetKey, models.GroupOffset]) -> None:
        """Redeliver due retries (nacked, expired deadline, redriven, released by a leaver)."""
        pids = [key[1] for key in offsets]
        if not pids or (not self.group.ordered and not _any_due(self, pids)):
            return
        pending = models.InFlight.objects.filter(
            group=self.group, subscriber=self.subscriber, partition_id__in=pids
        ).select_related("partition")
        waiting = pending.filter(state=models.InFlight.State.RETRY_WAIT, deadline_ms__lte=self.now)
        if not self.group.ordered:
            due = list(waiting.order_by("deadline_ms", "id")[: self.max_messages])
            if not due:
                return
            runs = [row for row in due if row.last_offset > row.offset]
            if runs:
                # Retries go out one message at a time: split the runs that came due.
                _split(runs)
                due = list(waiting.order_by("deadline_ms", "id")[: self.max_messages])
        else:
            _split(list(waiting.filter(last_offset__gt=F("offset"))))
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
        by_partition: dict[int, list[models.InFlight]] = {}
        for row in due:
            by_partition.setdefault(row.partition_id, []).append(row)
        gone, expired = [], []
        for pid, rows in by_partition.items():
            found = read_at(pid, rows[0].partition.number, [r.offset for r in rows])
            for row in rows:
                m = found.get(row.offset)
                if m is None:
                    gone.append(row.id)  # retention removed it: nothing left to deliver
                elif self._expired(m):
                    expired.append(row)
                elif self.room > 0:
                    row.state = models.InFlight.State.DELIVERED
                    row.attempt += 1
                    row.member_id = self.member.member_id
                    row.token = self.token
                    row.deadline_ms = self.deadline_ms
                    self.redelivered.append(row)
                    self._hand_out(
                        m, receipt(self.token, row.partition_id, row.offset), row.attempt
                    )
        models.InFlight.objects.filter(id__in=gone).delete()
        self.deleted = self.deleted or bool(gone or expired)
        self.expired += len(expired)
        retries.dead_letter_rows(expired, self.group, self.topic, "expired", self.now)

    def take_new(self, offsets: dict[OffsetKey, models.GroupOffset]) -> None:
        """Hand out messages never delivered, from each partition's delivered offset on."""
        rows = list(offsets.values())
        if not rows:
            return
        with _turn_lock:
            turn = next(_turn) % len(rows)
        # Rotate the first partition read so one busy partition cannot starve the rest.
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
        while taken < wanted and position < p.next_offset and scanned < SCAN_LIMIT:
            chunk = log.read_partition(
                p.id, p.number, position, wanted - taken if everything else 500
            )
            if not chunk:
                break
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
        if expired:
            self.expired += len(expired)
            retries.dead_letter_messages(
                self.group, self.topic, self.subscriber, expired, "expired", self.now
            )

    def _receipt(self, partition_id: int, offset: int) -> str:
        return "" if self.auto_ack else receipt(self.token, partition_id, offset)

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

    def save_offsets(self, offsets: dict[OffsetKey, models.GroupOffset]) -> None:
        """Store the moved offsets; the committed ones computed here when nothing was deleted.

        Without deletions the lowest in-flight offset of a partition that had some is
        unchanged (committed < delivered tells it had some), and one that had none now starts
        at its first new run, or at its delivered offset.
        """
        if self.deleted:
            for row in offsets.values():
                row.save(update_fields=["delivered_offset", "filtered_count", "updated_at"])
            recompute_committed(offsets)
            return
        for row in offsets.values():
            before = self.before[row.partition_id]
            if before[0] >= before[1]:
                first = self.first_new.get(row.partition_id)
                if first is not None:
                    row.committed_offset = first
                else:
                    row.committed_offset = max(row.delivered_offset, row.committed_offset)
            if (row.committed_offset, row.delivered_offset, row.filtered_count) != before:
                row.save(
                    update_fields=[
                        "committed_offset",
                        "delivered_offset",
                        "filtered_count",
                        "updated_at",
                    ]
                )

    def store(self) -> None:
        if self.auto_ack:
            # Settled on delivery: the redelivered rows are done with too.
            models.InFlight.objects.filter(id__in=[r.id for r in self.redelivered]).delete()
            self.deleted = self.deleted or bool(self.redelivered)
        else:
            models.InFlight.objects.bulk_update(
                self.redelivered, ["state", "attempt", "member_id", "token", "deadline_ms"]
            )
            bulk.insert_rows("broker_inflight", IN_FLIGHT_COLUMNS, self.new_rows)
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


def _validate_receipts(receipts: list[str]) -> list[str]:
    limit = ferry_settings.get("MAX_FETCH_MESSAGES")
    if not receipts:
        raise errors.InvalidRequest("Name at least one receipt.")
    if len(receipts) > limit:
        raise errors.InvalidRequest(f"At most {limit} receipts per call.", count=len(receipts))
    if any(not isinstance(r, str) or not 0 < len(r) <= RECEIPT_MAX for r in receipts):
        raise errors.InvalidRequest(f"A receipt is a string of 1 to {RECEIPT_MAX} characters.")
    return list(dict.fromkeys(receipts))


class _Named(NamedTuple):
    """An in-flight run a settle call names, with its topic."""

    id: int
    group_id: int
    partition_id: int
    subscriber: str
    token: str
    offset: int
    last_offset: int
    member_id: str
    attempt: int
    state: str
    partition: int
    topic_id: int
    topic: str
    trace: bool


# Raw SQL on the ack hot path: no model instances for a thousand receipts. A receipt names
# its partition and offset, so the rows come from the (group, partition, subscriber, offset)
# index, one range per partition; the stored receipt must then match exactly.
SELECT_NAMED = (
    'SELECT i.id, i.group_id, i.partition_id, i.subscriber, i.token, i."offset", i.last_offset, '
    "i.member_id, i.attempt, i.state, p.number, t.id, t.name, t.trace FROM broker_inflight i "
    "JOIN broker_partition p ON p.id = i.partition_id JOIN broker_topic t ON t.id = p.topic_id "
    'WHERE i.group_id = %s AND i.partition_id = %s AND i."offset" <= %s AND i.last_offset >= %s'
)
DELETE_IN_FLIGHT = {
    "sqlite": "DELETE FROM broker_inflight WHERE id IN (SELECT value FROM json_each(%s))",
    "postgresql": "DELETE FROM broker_inflight WHERE id = ANY(%s)",
}


def _array(values: list[Any]) -> Any:
    return orjson.dumps(values).decode() if connection.vendor == "sqlite" else values


def _named(group_id: int, receipts: list[str]) -> dict[_Named, list[tuple[str, int]]]:
    """The runs the receipts name, each with its named (receipt, offset) pairs."""
    by_partition: dict[int, list[tuple[str, str, int]]] = {}
    for text in receipts:
        where = _parse_receipt(text)
        if where is not None:
            token, partition_id, offset = where
            by_partition.setdefault(partition_id, []).append((text, token, offset))
    found: dict[_Named, list[tuple[str, int]]] = {}
    with connection.cursor() as cursor:
        for partition_id, named in sorted(by_partition.items()):
            low, high = min(n[2] for n in named), max(n[2] for n in named)
            cursor.execute(SELECT_NAMED, (group_id, partition_id, high, low))
            # Runs of one token do not overlap; broadcast members' runs may share offsets.
            by_token: dict[str, list[_Named]] = {}
            for row in cursor.fetchall():
                run = _Named._make((*row[:13], bool(row[13])))
                by_token.setdefault(run.token, []).append(run)
            starts = {}
            for token, runs in by_token.items():
                runs.sort(key=lambda r: r.offset)
                starts[token] = [r.offset for r in runs]
            for text, token, offset in named:
                runs = by_token.get(token, [])
                i = bisect.bisect_right(starts.get(token, []), offset) - 1
                if i >= 0 and runs[i].last_offset >= offset:
                    found.setdefault(runs[i], []).append((text, offset))
    return found


def _delete_in_flight(ids: list[int]) -> None:
    if ids:
        with connection.cursor() as cursor:
            cursor.execute(DELETE_IN_FLIGHT[connection.vendor], (_array(ids),))


class _Settling:
    """The in-flight runs a settle call names, locked."""

    def __init__(self, principal: Principal, group_name: str, receipts: list[str]) -> None:
        groups.validate_group_name(group_name)
        self.receipts = _validate_receipts(receipts)
        group = models.ConsumerGroup.objects.filter(name=group_name).first()
        if group is None:
            raise errors.GroupNotFound(group=group_name)
        self.group: models.ConsumerGroup = group
        found = _named(group.id, self.receipts)
        for topic_name in sorted({run.topic for run in found}):
            keys.require(principal, topic_name, "consume")
        self.offsets = locked_offsets((r.group_id, r.partition_id, r.subscriber) for r in found)
        # Read again under the locks: a run may have been settled or redelivered meanwhile.
        # (SQLite already serialized this transaction's writes before the first read.)
        self.runs = found if connection.vendor == "sqlite" else _named(group.id, self.receipts)
        matched = {text for named in self.runs.values() for text, _ in named}
        self.stale = tuple(r for r in self.receipts if r not in matched)
        self.count = len(matched)

    def single_rows(self) -> dict[int, tuple[models.Topic, list[models.InFlight]]]:
        """The named messages as one model row each, by topic (nack, reject, extend).

        Splits the runs they are in first.
        """
        runs = models.InFlight.objects.filter(id__in=[r.id for r in self.runs])
        _split(list(runs))
        match = Q(pk__in=[])
        for run, named in self.runs.items():
            match |= Q(
                group_id=run.group_id,
                partition_id=run.partition_id,
                subscriber=run.subscriber,
                offset__in=[offset for _, offset in named],
            )
        out: dict[int, tuple[models.Topic, list[models.InFlight]]] = {}
        rows = models.InFlight.objects.filter(match).select_related("partition__topic")
        for row in rows.order_by("id"):
            topic = row.partition.topic
            out.setdefault(topic.id, (topic, []))[1].append(row)
        return out


def _trace_each(
    topic: models.Topic, rows: list[models.InFlight], name: str, group: str, now: int, **detail: str
) -> None:
    if topic.trace:
        trace.record(
            [
                trace.event(
                    topic.id,
                    row.partition.number,
                    row.offset,
                    name,
                    group=group,
                    member_id=row.member_id,
                    attempt=row.attempt,
                    at_ms=now,
                    **detail,
                )
                for row in rows
            ]
        )


def ack_messages(principal: Principal, group_name: str, receipts: list[str]) -> SettleResult:
    """Settle delivered messages for good; the committed offsets move to the lowest unsettled."""
    now = log.now_ms()
    with bulk.bookkeeping():
        settling = _Settling(principal, group_name, receipts)
        whole, partial = [], {}
        for run, named in settling.runs.items():
            if len(named) == run.last_offset - run.offset + 1:
                whole.append(run.id)
            else:
                partial[run.id] = {offset for _, offset in named}
        _delete_in_flight(whole)
        if partial:
            _split(list(models.InFlight.objects.filter(id__in=partial)), partial)
        trace.record(
            [
                trace.event(
                    run.topic_id,
                    run.partition,
                    offset,
                    "acked",
                    group=group_name,
                    member_id=run.member_id,
                    attempt=run.attempt,
                    at_ms=now,
                )
                for run, named in settling.runs.items()
                if run.trace
                for _, offset in named
            ]
        )
        recompute_committed(settling.offsets)
    return SettleResult(settled=settling.count, stale=settling.stale)


def nack_messages(
    principal: Principal,
    group_name: str,
    receipts: list[str],
    *,
    error: str = "",
    delay_ms: int | None = None,
) -> SettleResult:
    """Fail delivered messages: each is redelivered after its backoff (or delay_ms), or goes to
    the dead-letter queue once it has had the group's max_attempts."""
    max_delay = ferry_settings.get("MAX_DELAY_SECONDS") * 1000
    if delay_ms is not None and not 0 <= delay_ms <= max_delay:
        raise errors.InvalidRequest(f"delay_ms is 0 to {max_delay}.", delay_ms=delay_ms)
    now = log.now_ms()
    dead = 0
    with bulk.bookkeeping():
        settling = _Settling(principal, group_name, receipts)
        for topic, rows in settling.single_rows().values():
            dead += retries.fail(
                rows, settling.group, topic, event="nacked", error=error, delay_ms=delay_ms, now=now
            )
            if delay_ms == 0:
                wake(topic.id)
        recompute_committed(settling.offsets)
    return SettleResult(settled=settling.count, stale=settling.stale, dead_lettered=dead)


def reject_messages(
    principal: Principal, group_name: str, receipts: list[str], *, error: str = ""
) -> SettleResult:
    """Send delivered messages straight to the group's dead-letter queue (no more retries)."""
    now = log.now_ms()
    with bulk.bookkeeping():
        settling = _Settling(principal, group_name, receipts)
        for topic, rows in settling.single_rows().values():
            error = error[: retries.MAX_ERROR_CHARS]
            for row in rows:
                row.last_error = error
            _trace_each(topic, rows, "rejected", group_name, now, error=error)
            retries.dead_letter_rows(rows, settling.group, topic, "rejected", now)
        recompute_committed(settling.offsets)
    n = settling.count
    return SettleResult(settled=n, stale=settling.stale, dead_lettered=n)


def extend_deadlines(
    principal: Principal, group_name: str, receipts: list[str], extend_ms: int
) -> SettleResult:
    """Give delivered messages more time: their deadlines become now + extend_ms."""
    validate_ack_deadline(extend_ms, "extend_ms")
    now = log.now_ms()
    with bulk.bookkeeping():
        settling = _Settling(principal, group_name, receipts)
        rows = [row for _, topic_rows in settling.single_rows().values() for row in topic_rows]
        live = [r for r in rows if r.state == models.InFlight.State.DELIVERED]
        models.InFlight.objects.filter(id__in=[r.id for r in live]).update(
            deadline_ms=now + extend_ms
        )
    # A message waiting for its retry is not with the consumer any more: nothing to extend.
    receipt_of = {
        (run.partition_id, offset): text
        for run, named in settling.runs.items()
        for text, offset in named
    }
    waiting = {receipt_of[(r.partition_id, r.offset)] for r in rows if r not in live}
    return SettleResult(settled=len(live), stale=settling.stale + tuple(sorted(waiting)))


def validate_ack_deadline(value_ms: int, name: str = "ack_deadline_ms") -> None:
    high = ferry_settings.get("MAX_ACK_DEADLINE_MS")
    if not 1000 <= value_ms <= high:
        raise errors.InvalidRequest(f"{name} is 1000 to {high}.", **{name: value_ms})


SWEEP_BATCH = 1000


def redeliver_expired() -> int:
    """Turn deliveries past their ack deadline into retries (or dead letters); returns how many.

    Also wakes long polls of topics whose retries are due, so they are redelivered promptly.
    """
    now = log.now_ms()
    expired = models.InFlight.objects.filter(
        state=models.InFlight.State.DELIVERED, deadline_ms__lt=now
    )
    handled = 0
    while True:
        found = list(
            expired.order_by("deadline_ms")
            .values_list("group_id", "partition_id", "subscriber")
            .distinct()[:SWEEP_BATCH]
        )
        if not found:
            break
        for group_id in sorted({g for g, _, _ in found}):
            handled += _sweep_group(group_id, [k for k in found if k[0] == group_id], now)
        if len(found) < SWEEP_BATCH:
            break
    due_topics = (
        models.InFlight.objects.filter(state=models.InFlight.State.RETRY_WAIT, deadline_ms__lte=now)
        .values_list("partition__topic_id", flat=True)
        .distinct()
    )
    for topic_id in list(due_topics):
        events.messages_returned(topic_id)
    return handled


def _sweep_group(group_id: int, keys_: list[OffsetKey], now: int) -> int:
    with bulk.bookkeeping():
        group = models.ConsumerGroup.objects.filter(id=group_id).first()
        if group is None:
            return 0
        offsets = locked_offsets(keys_)
        match = Q()
        for g, p, s in offsets:
            match |= Q(group_id=g, partition_id=p, subscriber=s)
        expired = models.InFlight.objects.filter(
            match, state=models.InFlight.State.DELIVERED, deadline_ms__lt=now
        )
        _split(list(expired.filter(last_offset__gt=F("offset"))))
        rows = list(expired.select_related("partition__topic"))
        by_topic: dict[int, tuple[models.Topic, list[models.InFlight]]] = {}
        for row in rows:
            by_topic.setdefault(row.partition.topic_id, (row.partition.topic, []))[1].append(row)
        for topic, topic_rows in by_topic.values():
            retries.fail(
                topic_rows,
                group,
                topic,
                event="expired",
                error="ack deadline passed",
                delay_ms=None,
                now=now,
            )
        recompute_committed(offsets)
    return len(rows)
