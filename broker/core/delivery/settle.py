"""Settling delivered messages by receipt: ack, nack, reject, extend their deadlines.

See docs/semantics.md#acknowledgements and docs/architecture.md#in-flight-by-runs.
"""

import bisect
import itertools
import threading
from collections.abc import Callable, Hashable
from typing import NamedTuple, TypeVar, cast

from django.db.models import F, Q

from broker import models
from broker import settings as ferry_settings
from broker.core import (
    bulk,
    errors,
    groups,
    inflight,
    keys,
    log,
    membership,
    memo,
    retries,
    trace,
)
from broker.core.records import Principal, SettleResult

RECEIPT_MAX = 40


def _validate_receipts(receipts: list[str]) -> list[str]:
    limit = ferry_settings.get("MAX_FETCH_MESSAGES")
    if not receipts:
        raise errors.InvalidRequest("Name at least one receipt.")
    if len(receipts) > limit:
        raise errors.InvalidRequest(f"At most {limit} receipts per call.", count=len(receipts))
    # map() and min/max: a thousand receipts checked without a Python loop.
    if not all(map(isinstance, receipts, itertools.repeat(str))) or not (
        min(map(len, receipts)) > 0 and max(map(len, receipts)) <= RECEIPT_MAX
    ):
        raise errors.InvalidRequest(f"A receipt is a string of 1 to {RECEIPT_MAX} characters.")
    # A malformed receipt is the client's mistake, not a stale delivery (docs/api.md).
    malformed = _groups(receipts)[1]
    if malformed:
        raise errors.InvalidRequest(
            f"{malformed[0]!r} is not a receipt (token.partition.offset, in hex).",
            receipts=malformed[:10],
        )
    return list(dict.fromkeys(receipts))


class NamedRun(NamedTuple):
    """An in-flight run a settle call names (or the deadline sweep finds), with its topic:
    a row of SELECT_RUNS."""

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
    deadline_ms: int
    last_error: str

    @property
    def size(self) -> int:
        """How many offsets the run holds: a settlement that names them all names it whole."""
        return self.last_offset - self.offset + 1


# Raw SQL on the ack hot path: no model instances for a thousand receipts. A receipt names
# its partition and offset, so the rows come from the (group, partition, subscriber, offset)
# index, one range per partition; the stored receipt must then match exactly.
SELECT_RUNS = (
    'SELECT i.id, i.group_id, i.partition_id, i.subscriber, i.token, i."offset", i.last_offset, '
    "i.member_id, i.attempt, i.state, p.number, t.id, t.name, t.trace, i.deadline_ms, i.last_error "
    "FROM broker_inflight i "
    "JOIN broker_partition p ON p.id = i.partition_id JOIN broker_topic t ON t.id = p.topic_id "
)
SELECT_NAMED = (
    SELECT_RUNS
    + 'WHERE i.group_id = %s AND i.partition_id = %s AND i."offset" <= %s AND i.last_offset >= %s'
)
DELETE_IN_FLIGHT = "DELETE FROM broker_inflight WHERE id = ANY(%s)"  # bulk.for_ids


_NamedReads = list[tuple[tuple[int, int, int, int], list[inflight.ReceiptGroup]]]
T = TypeVar("T")
# This thread's last answer of each _remembered function: a settlement looks at its receipts
# several times (the runs read ahead with the offsets' lock, the check, the runs).
_last = threading.local()


def _remembered(name: str, key: Hashable, compute: Callable[[], T]) -> T:
    """compute(), or what it gave for the same key at this thread's last call for name."""
    last = getattr(_last, name, None)
    if last is not None and last[0] == key:
        return cast(T, last[1])
    found = compute()
    setattr(_last, name, (key, found))
    return found


def _groups(receipts: list[str]) -> tuple[list[inflight.ReceiptGroup], list[str]]:
    """inflight.group_receipts(receipts), parsed once for the settlement that asks again."""
    return _remembered("groups", tuple(receipts), lambda: inflight.group_receipts(receipts))


def _named_reads(group_id: int, receipts: list[str]) -> _NamedReads:
    """The SELECT_NAMED parameters _named reads with, one per partition the receipts name,
    each with the receipts' groups in that partition."""
    return _remembered(
        "reads", (group_id, tuple(receipts)), lambda: _parse_named_reads(group_id, receipts)
    )


def _parse_named_reads(group_id: int, receipts: list[str]) -> _NamedReads:
    by_partition: dict[int, list[inflight.ReceiptGroup]] = {}
    for group in _groups(receipts)[0]:
        by_partition.setdefault(group.partition_id, []).append(group)
    return [
        (
            (
                group_id,
                partition_id,
                max(g.offsets[-1] for g in named),
                min(g.offsets[0] for g in named),
            ),
            named,
        )
        for partition_id, named in sorted(by_partition.items())
    ]


def read_named_ahead(group_id: int, receipts: list[str]) -> None:
    """Have the next statement (the offset rows' lock) bring the runs the receipts name
    (bulk.read_ahead): a round trip fewer for an ack on PostgreSQL."""
    for params, _ in _named_reads(group_id, receipts):
        bulk.read_ahead(SELECT_NAMED, params)


def _named(group_id: int, receipts: list[str]) -> dict[NamedRun, list[tuple[str, int]]]:
    """The runs the receipts name, each with its named (receipt, offset) pairs, in the order of
    their partitions and offsets."""
    found: list[tuple[NamedRun, list[tuple[str, int]]]] = []
    for params, named in _named_reads(group_id, receipts):
        # One group per token in a partition. Runs of one token do not overlap (broadcast
        # members' runs may share offsets, under tokens of their own): a run's receipts are
        # the slice of its token's group between its first and last offset.
        by_token = {g.token: g for g in named}
        runs = []
        for row in bulk.run(SELECT_NAMED, params):
            run = NamedRun._make((*row[:13], bool(row[13]), *row[14:]))
            group = by_token.get(run.token)
            if group is None:
                continue
            low = bisect.bisect_left(group.offsets, run.offset)
            high = bisect.bisect_right(group.offsets, run.last_offset, low)
            if low < high:
                pairs = list(zip(group.texts[low:high], group.offsets[low:high], strict=True))
                runs.append((run, pairs))
        runs.sort(key=lambda found_run: (found_run[0].offset, found_run[0].id))
        found.extend(runs)
    return dict(found)


def _receipt_partitions(receipts: list[str]) -> set[int]:
    return {group.partition_id for group in _groups(receipts)[0]}


def _delete_in_flight(ids: list[int]) -> None:
    if ids:
        # Nobody reads its rows: on PostgreSQL it goes with the next statement.
        sql, params = bulk.for_ids(DELETE_IN_FLIGHT), (bulk.id_array(ids),)
        bulk.defer(sql, params, table="broker_inflight")


class LocksOutOfOrder(Exception):
    """The runs a settlement names need offset locks its caller did not take first (internal:
    push.ack_and_deliver then settles and delivers in two transactions)."""


# By group name, on PostgreSQL: the id of the clustering group this process's last settlement
# of it found. The next one locks that group's offset rows and reads the runs its receipts name
# in the round trip that reads the group, instead of one of their own after it. Its rows are
# the group's own (subscriber ""), in the partitions the receipts name: the rows it would lock
# anyway. A stale entry (the group deleted, or made again under a new id) locks and reads
# nothing: ids come from a sequence, so no other group has that id. The rows are then locked
# after the group's read, as without the entry.
_clustering_ids: dict[str, int] = {}


def _lock_ahead(group_id: int, receipts: list[str]) -> None:
    """Announce the lock of a clustering group's offset rows in the partitions the receipts
    name, then the runs they name (bulk.read_ahead): both go after the transaction's next
    statement, in its round trip."""
    inflight.lock_ahead(_clustering_keys(group_id, receipts), None)
    read_named_ahead(group_id, receipts)


def _clustering_keys(group_id: int, receipts: list[str]) -> list[inflight.OffsetKey]:
    return [(group_id, partition_id, "") for partition_id in _receipt_partitions(receipts)]


class _Settling:
    """The in-flight runs a settle call names, locked."""

    def __init__(
        self,
        principal: Principal,
        group_name: str,
        receipts: list[str],
        group: models.ConsumerGroup | None = None,
        locked: dict[inflight.OffsetKey, models.GroupOffset] | None = None,
        lock_more: bool = True,
    ) -> None:
        """locked: offset rows the caller locked in this transaction already; with lock_more
        False, runs that need others raise LocksOutOfOrder before any is taken."""
        membership.validate_group_name(group_name)
        self.receipts = _validate_receipts(receipts)
        postgresql = bulk.vendor() == "postgresql"
        announced = None  # the group id whose offset rows' lock was announced
        if group is None:
            guessed = _clustering_ids.get(group_name) if postgresql and locked is None else None
            if guessed is not None:
                _lock_ahead(guessed, self.receipts)
                announced = guessed
            group = membership.find_group(group_name)
        if group is None:
            raise errors.GroupNotFound(group=group_name)
        self.group: models.ConsumerGroup = group
        clustering = group.mode == models.ConsumerGroup.Mode.CLUSTERING
        if postgresql and clustering:
            memo.remember(_clustering_ids, group_name, group.id)
        elif postgresql:
            _clustering_ids.pop(group_name, None)
        if locked is None and postgresql and clustering:
            # A clustering group's runs are the group's own (subscriber ""), in the partitions
            # the receipts name: lock those offset rows first and read the runs once, under them
            # (a round trip fewer than read, lock, read again), in the lock's round trip; or in
            # the group's, when they were announced with its read (a right guess, above).
            if announced != group.id:
                read_named_ahead(group.id, self.receipts)
            locked = inflight.locked_offsets(_clustering_keys(group.id, self.receipts))
        found = self._visible(principal, _named(group.id, self.receipts))
        needed = {(r.group_id, r.partition_id, r.subscriber) for r in found}
        held = locked if locked is not None else {}
        missing = needed - held.keys()
        if missing and postgresql and not lock_more:
            raise LocksOutOfOrder
        self.offsets = {key: held[key] for key in needed if key in held}
        self.offsets.update(inflight.locked_offsets(missing))
        # Read again when some locks came after the read: a run may have been settled or
        # redelivered meanwhile. (SQLite serialized this transaction's writes before the read.)
        self.runs = (
            self._visible(principal, _named(group.id, self.receipts))
            if missing and postgresql
            else found
        )
        # A receipt names one run at most (the receipts are unique, _validate_receipts).
        self.count = sum(map(len, self.runs.values()))
        self.stale: tuple[str, ...] = ()
        if self.count < len(self.receipts):
            matched = {text for named in self.runs.values() for text, _ in named}
            self.stale = tuple(r for r in self.receipts if r not in matched)

    @staticmethod
    def _visible(
        principal: Principal, found: dict[NamedRun, list[tuple[str, int]]]
    ) -> dict[NamedRun, list[tuple[str, int]]]:
        """Runs on topics the principal may consume; others' receipts are stale to it."""
        return {
            run: named
            for run, named in found.items()
            if keys.allows(principal, run.topic, "consume")
        }

    def single_rows(
        self, runs: dict[NamedRun, list[tuple[str, int]]] | None = None
    ) -> dict[int, tuple[models.Topic, list[models.InFlight]]]:
        """The named messages as one model row each, by topic (nack, reject, extend); of
        runs, some of self.runs, if given.

        Carves them out of the runs they are in first (inflight.carve).
        """
        runs = self.runs if runs is None else runs
        if not runs:
            return {}
        inflight.carve(
            (run, {offset for _, offset in named}) for run, named in runs.items() if run.size > 1
        )
        match = Q(pk__in=[])
        for run, named in runs.items():
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

    def delivered_rows(
        self, runs: dict[NamedRun, list[tuple[str, int]]] | None = None
    ) -> tuple[list[models.InFlight], list[models.InFlight]]:
        """The named messages' single rows (single_rows, of runs if given), and those still
        delivered: not waiting for a retry (extend, release)."""
        rows = [row for _, topic_rows in self.single_rows(runs).values() for row in topic_rows]
        return rows, [r for r in rows if r.state == models.InFlight.State.DELIVERED]


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
    with bulk.bookkeeping():
        return ack_in_transaction(principal, group_name, receipts)


def ack_in_transaction(
    principal: Principal,
    group_name: str,
    receipts: list[str],
    *,
    group: models.ConsumerGroup | None = None,
    locked: dict[inflight.OffsetKey, models.GroupOffset] | None = None,
    lock_more: bool = True,
    defer_committed: set[inflight.OffsetKey] | None = None,
) -> SettleResult:
    """ack_messages inside the caller's write transaction (transactions.commit_transaction).

    group: the group, if the caller read it in this transaction already. locked: offset rows
    the caller locked already; the rows this ack locks are added to it, and all it settles are
    kept up to date (for a delivery that follows). lock_more False: raise LocksOutOfOrder
    rather than lock rows besides those (push.ack_and_deliver). defer_committed: the committed
    offsets of the rows it settled are left for the caller to recompute before it commits
    (their keys are added to it), as a delivery that follows does in its own write.
    """
    now = log.now_ms()
    settling = _Settling(principal, group_name, receipts, group, locked, lock_more)
    # A run settled in part is deleted too, and what is left of it put back: no read of its
    # own, nor a round trip (on PostgreSQL both writes go with the next statement).
    partial = [
        (run, {offset for _, offset in named})
        for run, named in settling.runs.items()
        if len(named) < run.size
    ]
    _delete_in_flight([run.id for run in settling.runs])
    inflight.insert_rest(partial)
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
    if defer_committed is None:
        # Written with the COMMIT on PostgreSQL, unless the caller reads the rows afterwards.
        inflight.recompute_committed(settling.offsets, read_back=locked is not None)
    else:
        defer_committed.update(settling.offsets)
    if locked is not None:
        locked.update(settling.offsets)
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
        group = settling.group
        # A delivered run nacked whole waits for its retry as one row: no split, one UPDATE.
        whole: list[NamedRun] = []
        part: dict[NamedRun, list[tuple[str, int]]] = {}
        for run, named in settling.runs.items():
            if len(named) == run.size and retries.waits_whole(run, group):
                whole.append(run)
            else:
                part[run] = named
        retries.wait_runs(whole, group, error=error, delay_ms=delay_ms, now=now)
        for topic, rows in settling.single_rows(part).values():
            dead += retries.fail(
                rows, group, topic, event="nacked", error=error, delay_ms=delay_ms, now=now
            )
            if delay_ms == 0:
                inflight.wake(topic.id)
        if delay_ms == 0:
            for topic_id in sorted({run.topic_id for run in whole}):
                inflight.wake(topic_id)
        inflight.recompute_committed(settling.offsets)
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
        inflight.recompute_committed(settling.offsets)
    n = settling.count
    return SettleResult(settled=n, stale=settling.stale, dead_lettered=n)


def release_messages(principal: Principal, group_name: str, receipts: list[str]) -> SettleResult:
    """Hand delivered messages back to the group at once, as if they had not been delivered.

    For messages the server leased ahead for a subscriber and never sent it (the WebSocket
    read-ahead, docs/websocket.md#flow-control-credit): no attempt is counted as failed and no
    backoff applies, as when a member leaves (membership.sessions._release_in_flight). The
    committed offset stays: the messages are still unsettled. A receipt whose message was
    settled or redelivered meanwhile is stale.
    """
    now = log.now_ms()
    with bulk.bookkeeping():
        settling = _Settling(principal, group_name, receipts)
        _, live = settling.delivered_rows()
        # A waiting retry's attempt is the failed attempts so far and its redelivery adds one:
        # take back the one this delivery added.
        models.InFlight.objects.filter(id__in=[r.id for r in live]).update(
            state=models.InFlight.State.RETRY_WAIT, deadline_ms=now, attempt=F("attempt") - 1
        )
        for topic_id in sorted({r.partition.topic_id for r in live}):
            inflight.wake(topic_id)
    return SettleResult(settled=len(live), stale=settling.stale)


def extend_deadlines(
    principal: Principal, group_name: str, receipts: list[str], extend_ms: int
) -> SettleResult:
    """Give delivered messages more time: their deadlines become now + extend_ms."""
    groups.validate_ack_deadline(extend_ms, "extend_ms")
    now = log.now_ms()
    delivered = models.InFlight.State.DELIVERED
    with bulk.bookkeeping():
        settling = _Settling(principal, group_name, receipts)
        # A run named whole keeps its row and its deadline moves as one: a subscriber that
        # extends the batch it holds, then acks it, settles one row, not one per message.
        whole, part = {}, {}
        for run, named in settling.runs.items():
            if len(named) == run.size:
                whole[run] = named
            else:
                part[run] = named
        rows, live = settling.delivered_rows(part)
        moved = [r.id for r in live] + [run.id for run in whole if run.state == delivered]
        models.InFlight.objects.filter(id__in=moved).update(deadline_ms=now + extend_ms)
    # A message waiting for its retry is not with the consumer any more: nothing to extend.
    receipt_of = {
        (run.partition_id, offset): text for run, named in part.items() for text, offset in named
    }
    waiting = {receipt_of[(r.partition_id, r.offset)] for r in rows if r not in live}
    waiting.update(
        text for run, named in whole.items() if run.state != delivered for text, _ in named
    )
    extended = len(live) + sum(len(named) for run, named in whole.items() if run.state == delivered)
    return SettleResult(settled=extended, stale=settling.stale + tuple(sorted(waiting)))
