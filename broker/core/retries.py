"""Retries and dead letters: backoff, moving to the dead-letter queue, browse, redrive, purge.

See docs/semantics.md#retries-and-dead-letters. Functions that change InFlight rows expect the
caller to hold the group offset locks of their partitions (inflight.locked_offsets), the lock
that keeps the committed offset the lowest unsettled one.
"""

from collections.abc import Iterable
from typing import Protocol

import orjson
from django.db import transaction
from django.db.models import QuerySet

from broker import models
from broker.core import bulk, deadletters, errors, inflight, keys, log, membership, trace
from broker.core.records import (
    DeadLetterInfo,
    DeadLetterPage,
    Principal,
    RedriveResult,
    StoredMessage,
)

SECOND = 1000
MINUTE = 60 * SECOND
# RocketMQ's retry levels (its delay levels 3 to 18): the wait after the n-th failed attempt.
DEFAULT_DELAYS_MS = (
    10 * SECOND,
    30 * SECOND,
    *(n * MINUTE for n in range(1, 11)),
    20 * MINUTE,
    30 * MINUTE,
    60 * MINUTE,
    120 * MINUTE,
)
REASONS = ("max_attempts", "rejected", "expired", "removed")
MAX_ERROR_CHARS = 2000
MAX_PAGE = 1000


def backoff_ms(delays_ms: Iterable[int], attempt: int) -> int:
    """The wait before redelivery after attempt n failed: the n-th delay, the last one after."""
    levels = tuple(delays_ms) or DEFAULT_DELAYS_MS
    return levels[min(max(attempt, 1), len(levels)) - 1]


class WholeRun(inflight.Run, Protocol):
    """A run a settlement named whole: its row's fields, its topic's id and trace flag, and its
    partition's number."""

    @property
    def topic_id(self) -> int: ...
    @property
    def partition(self) -> int: ...
    @property
    def trace(self) -> bool: ...


def exhausted(group: models.ConsumerGroup, attempt: int) -> bool:
    """Whether a failed attempt goes to the dead letters, not to another retry."""
    return attempt >= group.max_attempts


def _wait_ms(group: models.ConsumerGroup, attempt: int, delay_ms: int | None) -> int:
    """How long a failed attempt waits for its retry: the nack's delay, else the backoff."""
    return delay_ms if delay_ms is not None else backoff_ms(group.retry_delays_ms, attempt)


def waits_whole(run: WholeRun, group: models.ConsumerGroup) -> bool:
    """Whether a nack of the whole run may leave it one row waiting for its retry (wait_runs):
    it is delivered, none of its messages goes to the dead letters, and its topic does not
    trace (that records a nacked event for each message, which fail() writes)."""
    return (
        run.state == models.InFlight.State.DELIVERED
        and not run.trace
        and not exhausted(group, run.attempt)
    )


def wait_runs(
    runs: Iterable[WholeRun],
    group: models.ConsumerGroup,
    *,
    error: str,
    delay_ms: int | None,
    now: int,
) -> None:
    """fail() of whole delivered runs short of the dead letters, for a nack (those waits_whole()
    allows) or an expired deadline: each waits for its retry as one row, as a leaver's release
    leaves one (the delivery hands it out again whole), and each message's retry_scheduled
    event is recorded (for every topic, as fail() records it). Caller holds the runs' group
    offset locks."""
    error = error[:MAX_ERROR_CHARS]
    by_due: dict[int, list[WholeRun]] = {}
    for run in runs:
        by_due.setdefault(now + _wait_ms(group, run.attempt, delay_ms), []).append(run)
    _wait({due: [run.id for run in same] for due, same in by_due.items()}, error)
    trace.record(
        [
            trace.event(
                run.topic_id,
                run.partition,
                offset,
                "retry_scheduled",
                group=group.name,
                member_id=run.member_id,
                attempt=run.attempt,
                at_ms=now,
                due_ms=due,
                error=error,
            )
            for due, same in by_due.items()
            for run in same
            for offset in range(run.offset, run.last_offset + 1)
        ]
    )


# In-flight rows made to wait for their retry, by id. Raw SQL with the caller's next statement:
# the ORM's bulk_update of a nack's rows cost milliseconds.
WAIT = (  # bulk.for_ids
    "UPDATE broker_inflight SET state = %s, deadline_ms = %s, last_error = %s WHERE id = ANY(%s)"
)


def _wait(ids_by_due: dict[int, list[int]], error: str) -> None:
    """Make these rows wait for their retry until each due time, with the error."""
    state = models.InFlight.State.RETRY_WAIT.value
    for due, ids in ids_by_due.items():
        params = (state, due, error, bulk.id_array(ids))
        bulk.defer(bulk.for_ids(WAIT), params, table="broker_inflight")


def fail(
    rows: list[models.InFlight],
    group: models.ConsumerGroup,
    topic: models.Topic,
    *,
    event: str,
    error: str,
    delay_ms: int | None,
    now: int,
) -> int:
    """A nack or an expired deadline: retry each row after its backoff, or dead-letter it.

    Caller holds the rows' group offset locks. Returns how many went to the dead-letter queue.
    """
    error = error[:MAX_ERROR_CHARS]
    waiting, dead, events = [], [], []
    for row in rows:
        row.last_error = error
        if event == "nacked" and topic.trace:
            events.append(_event(topic, row, group, "nacked", now, error=error))
        if exhausted(group, row.attempt):
            dead.append(row)
            continue
        row.state = models.InFlight.State.RETRY_WAIT
        row.deadline_ms = now + _wait_ms(group, row.attempt, delay_ms)
        waiting.append(row)
        events.append(
            _event(topic, row, group, "retry_scheduled", now, due_ms=row.deadline_ms, error=error)
        )
    by_due: dict[int, list[int]] = {}
    for row in waiting:
        by_due.setdefault(row.deadline_ms, []).append(row.id)
    _wait(by_due, error)
    trace.record(events)
    dead_letter_rows(dead, group, topic, "max_attempts", now)
    return len(dead)


def _event(
    topic: models.Topic,
    row: models.InFlight,
    group: models.ConsumerGroup,
    name: str,
    now: int,
    **detail: object,
) -> models.TraceEvent:
    return trace.event(
        topic.id,
        row.partition.number,
        row.offset,
        name,
        group=group.name,
        member_id=row.member_id,
        attempt=row.attempt,
        at_ms=now,
        **detail,
    )


def dead_letter_rows(
    rows: list[models.InFlight],
    group: models.ConsumerGroup,
    topic: models.Topic,
    reason: str,
    now: int,
) -> None:
    """Move in-flight rows to the group's dead-letter queue with a copy of their messages.

    Caller holds the rows' group offset locks and recomputes the committed offsets after.
    """
    if not rows:
        return
    by_partition: dict[int, list[int]] = {}
    for row in rows:
        by_partition.setdefault(row.partition_id, []).append(row.offset)
    numbers = {row.partition_id: row.partition.number for row in rows}
    found = {pid: inflight.read_at(pid, numbers[pid], offs) for pid, offs in by_partition.items()}
    letters, events = [], []
    for row in rows:
        message = found[row.partition_id].get(row.offset)
        letters.append(
            deadletters.letter(
                group, topic, row.subscriber, row.partition.number, row.offset, message
            )
        )
        letters[-1].reason, letters[-1].attempts = reason, row.attempt
        letters[-1].last_error, letters[-1].dead_ms = row.last_error, now
        events.append(
            _event(topic, row, group, "dead_lettered", now, reason=reason, error=row.last_error)
        )
    models.DeadLetter.objects.bulk_create(letters)
    models.InFlight.objects.filter(id__in=[row.id for row in rows]).delete()
    trace.record(events)


def _letters(
    principal: Principal, group_name: str, topic_name: str | None, reason: str | None
) -> QuerySet[models.DeadLetter]:
    membership.validate_group_name(group_name)
    if topic_name is not None:
        keys.require(principal, topic_name, "consume")
    if reason is not None and reason not in REASONS:
        raise errors.InvalidRequest(f"reason is one of {', '.join(REASONS)}.", reason=reason)
    group = models.ConsumerGroup.objects.filter(name=group_name).first()
    if group is None:
        raise errors.GroupNotFound(group=group_name)
    letters = models.DeadLetter.objects.filter(group=group).select_related("topic", "group")
    if topic_name is not None:
        letters = letters.filter(topic__name=topic_name)
    if reason is not None:
        letters = letters.filter(reason=reason)
    # Only the topics this key may consume.
    names = set(letters.values_list("topic__name", flat=True).distinct())
    hidden = [name for name in names if not keys.allows(principal, name, "consume")]
    return letters.exclude(topic__name__in=hidden) if hidden else letters


def list_dead_letters(
    principal: Principal,
    group_name: str,
    *,
    topic_name: str | None = None,
    reason: str | None = None,
    after_id: int | None = None,
    limit: int = 100,
) -> DeadLetterPage:
    """A page of a group's dead letters, oldest first, filtered by topic and reason."""
    if not 1 <= limit <= MAX_PAGE:
        raise errors.InvalidRequest(f"limit is 1 to {MAX_PAGE}.", limit=limit)
    letters = _letters(principal, group_name, topic_name, reason)
    total = letters.count()
    page_qs = letters.order_by("id")
    if after_id is not None:
        page_qs = page_qs.filter(id__gt=after_id)
    page = list(page_qs[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return DeadLetterPage(
        items=tuple(_info(letter) for letter in page),
        total=total,
        next_after_id=page[-1].id if more and page else None,
    )


def _info(letter: models.DeadLetter) -> DeadLetterInfo:
    return DeadLetterInfo(
        id=letter.id,
        group=letter.group.name,
        topic=letter.topic.name,
        subscriber=letter.subscriber,
        partition=letter.partition_number,
        offset=letter.offset,
        reason=letter.reason,
        attempts=letter.attempts,
        last_error=letter.last_error,
        dead_ms=letter.dead_ms,
        message=StoredMessage(
            letter.partition_number,
            letter.offset,
            letter.timestamp_ms,
            letter.key,
            letter.tag,
            orjson.dumps(letter.headers).decode(),
            bytes(letter.value),
            letter.is_json,
            letter.client_id,
        ),
    )


def select_dead_letters(
    principal: Principal,
    group_name: str,
    ids: list[int] | None = None,
    *,
    topic_name: str | None = None,
    reason: str | None = None,
) -> QuerySet[models.DeadLetter]:
    """The dead letters a redrive or purge would act on, checked like them (core/redrives.py).

    ids names letters (DeadLetterNotFound if one is not in the queue or not visible); None
    selects all that match topic and reason on the topics principal may consume.
    """
    letters = _letters(principal, group_name, topic_name, reason)
    if ids is None:
        return letters
    if not ids:
        raise errors.InvalidRequest("Name at least one dead letter, or select all.")
    chosen = letters.filter(id__in=ids)
    missing = set(ids) - set(chosen.values_list("id", flat=True))
    if missing:
        raise errors.DeadLetterNotFound(group=group_name, id=min(missing))
    return chosen


def redrive_dead_letters(
    principal: Principal,
    group_name: str,
    ids: list[int] | None = None,
    *,
    topic_name: str | None = None,
    reason: str | None = None,
) -> RedriveResult:
    """Send dead letters back to their group: one, a selection (ids), or all that match.

    A redriven message is redelivered to the group at once with a fresh attempt count, even past
    its topic's TTL. One whose original retention already removed, or that a plain poll (which
    takes no retries) has moved the group past, stays in the queue and is reported as missing.
    """
    now = log.now_ms()
    with transaction.atomic(durable=True):
        letters = list(
            select_dead_letters(
                principal, group_name, ids, topic_name=topic_name, reason=reason
            ).order_by("id")
        )
        result, topic_ids = redrive_in_transaction(principal, letters, now)
    for topic_id in topic_ids:
        inflight.wake(topic_id)
    return result


def redrive_in_transaction(
    principal: Principal, letters: list[models.DeadLetter], now: int
) -> tuple[RedriveResult, set[int]]:
    """Redrive these letters of one group (select_related group); caller holds the transaction.

    Takes the group offset locks. Returns the result and the topics whose waiting consumers to
    wake (inflight.wake) after commit.
    """
    if not letters:
        return RedriveResult(redriven=0), set()
    group = letters[0].group
    partitions = {
        (p.topic_id, p.number): p
        for p in models.Partition.objects.filter(
            topic_id__in={letter.topic_id for letter in letters}
        )
    }
    keys_ = {
        (group.id, partitions[(letter.topic_id, letter.partition_number)].id, letter.subscriber)
        for letter in letters
        if (letter.topic_id, letter.partition_number) in partitions
    }
    offsets = inflight.locked_offsets(keys_)
    redriven, missing, rows, events, done = 0, [], [], [], []
    token = inflight.new_token()
    for letter in letters:
        p = partitions.get((letter.topic_id, letter.partition_number))
        position = offsets.get((group.id, p.id, letter.subscriber)) if p else None
        if p is None or letter.offset < p.start_offset or position is None:
            missing.append(letter.id)
            continue
        if position.delivered_offset < position.committed_offset and (
            letter.offset < position.committed_offset
        ):
            # A plain poll moved the group past it, and a plain poll takes no retries: only a
            # reset of the group's offset reads it again. It stays in the queue, reported.
            missing.append(letter.id)
            continue
        done.append(letter.id)
        redriven += 1
        events.append(
            trace.event(
                letter.topic_id,
                letter.partition_number,
                letter.offset,
                "redriven",
                group=group.name,
                at_ms=now,
                by=principal.name,
                dead_letter_id=letter.id,
            )
        )
        # At or past the delivered offset it is delivered again anyway, as a new message.
        if letter.offset >= position.delivered_offset:
            continue
        rows.append(
            models.InFlight(
                group=group,
                partition=p,
                subscriber=letter.subscriber,
                offset=letter.offset,
                last_offset=letter.offset,
                state=models.InFlight.State.RETRY_WAIT,
                member_id="",
                token=token,
                attempt=0,
                deadline_ms=now,
                redriven=True,
            )
        )
    # A message already back in flight (redriven twice) keeps its row.
    models.InFlight.objects.bulk_create(rows, ignore_conflicts=True)
    models.DeadLetter.objects.filter(id__in=done).delete()
    trace.record(events)
    inflight.recompute_committed(offsets)
    done_ids = set(done)
    woken = {letter.topic_id for letter in letters if letter.id in done_ids}
    return RedriveResult(redriven=redriven, missing=tuple(missing)), woken


def purge_dead_letters(
    principal: Principal,
    group_name: str,
    ids: list[int] | None = None,
    *,
    topic_name: str | None = None,
    reason: str | None = None,
) -> int:
    """Delete dead letters for good: a selection (ids) or all that match; returns how many."""
    with transaction.atomic(durable=True):
        count, _ = select_dead_letters(
            principal, group_name, ids, topic_name=topic_name, reason=reason
        ).delete()
    return int(count)
