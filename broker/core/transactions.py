"""Transactions: half messages, fencing, carried offsets and acks, check-back, the outbox.

See docs/transactions.md and docs/architecture.md#transactions (ADR 0015). Half messages wait in
StagedMessage, a table no reader reads; a commit appends them through the log's own append path
(log.append_in_transaction: offsets assigned at commit, dedup, capacity) together with the
carried group offset commits and acks, in one database transaction, and deletes them; a rollback
deletes them. Lock order: producer row → transaction row → topic → partition → group → message.

Each public write is one transaction (`_atomic()`: durable), except that calls made through
call_async may share one, a savepoint each (run_shared), and the outbox's stage_outbox, which
joins the caller's transaction on purpose.
"""

import asyncio
import collections
import functools
import json
import logging
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from django.db import IntegrityError, connection, transaction
from django.db.models import F

from broker import models
from broker import settings as ferry_settings
from broker.core import bulk, dbthreads, delivery, errors, groups, inflight, keys, log, membership
from broker.core.records import (
    AppendResult,
    NewMessage,
    Principal,
    TransactionCheck,
    TransactionInfo,
    TransactionResult,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

State = models.Transaction.State
Kind = models.Transaction.Kind
STATES = tuple(State.values)
PRODUCER_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")
MAX_TRANSACTION_MESSAGES = 100_000
_COMMIT_ATTEMPTS = 3
# Check-back waits at most this long between two checks of one transaction.
MAX_CHECK_BACKOFF_MS = 60_000
# Open transactions claimed per check round, and ended ones purged per round.
CHECK_BATCH = 20
PURGE_BATCH = 1000
ANSWERS = ("commit", "rollback", "unknown")


# Shared commits (run_shared, call_async): a transactional producer's begin, add and commit
# are small writes each waiting for the disk; requests that arrive together share one database
# transaction, each in a savepoint of its own, as produces do (groupcommit.py).
_shared = threading.local()
# Operations per shared commit at most.
MAX_SHARED = 32


def _atomic() -> Any:
    """An operation's transaction: its own (durable), or its savepoint inside run_shared."""
    if getattr(_shared, "active", False):
        return transaction.atomic()
    return transaction.atomic(durable=True)


def run_shared(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run transaction operations in one database transaction, each all or nothing on its own.

    Each outcome is the call's result or the BrokerError that refused it (its savepoint rolled
    back, the others commit).
    """
    outcomes: list[Any] = []
    _shared.active = True
    try:
        with transaction.atomic(durable=True):
            for call in calls:
                try:
                    outcomes.append(call())
                except errors.BrokerError as exc:
                    outcomes.append(exc)
    finally:
        _shared.active = False
    return outcomes


@dataclass
class _Queue:
    waiting: "collections.deque[tuple[Callable[[], Any], asyncio.Future[Any]]]" = field(
        default_factory=collections.deque
    )
    draining: bool = False
    tasks: set["asyncio.Task[None]"] = field(default_factory=set)


_queues: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue]" = (
    weakref.WeakKeyDictionary()
)


async def call_async(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a database thread, sharing a commit with the calls arriving alongside."""
    loop = asyncio.get_running_loop()
    queue = _queues.setdefault(loop, _Queue())
    future: asyncio.Future[T] = loop.create_future()
    queue.waiting.append((functools.partial(fn, *args), future))
    if not queue.draining:
        queue.draining = True
        task = loop.create_task(_drain(queue))
        queue.tasks.add(task)
        task.add_done_callback(queue.tasks.discard)
    return await future


async def _drain(queue: _Queue) -> None:
    try:
        while queue.waiting:
            group = [queue.waiting.popleft() for _ in range(min(MAX_SHARED, len(queue.waiting)))]
            try:
                outcomes = await dbthreads.run(run_shared, [call for call, _ in group])
            except Exception:
                # The shared commit failed as a whole (a deadlock between processes on
                # PostgreSQL, a lost connection): each call again on its own.
                for call, future in group:
                    try:
                        result = await dbthreads.run(call)
                    except Exception as exc:
                        if not future.done():
                            future.set_exception(exc)
                    else:
                        if not future.done():
                            future.set_result(result)
                continue
            for (_, future), outcome in zip(group, outcomes, strict=True):
                if future.done():
                    continue  # the caller went away
                if isinstance(outcome, errors.BrokerError):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
    finally:
        queue.draining = False


class _Abort(Exception):
    """The commit cannot take effect as a whole: roll the transaction back, with this reason."""

    def __init__(self, reason: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.detail = detail


def _is_superuser(principal: Principal) -> bool:
    try:
        keys.require_superuser(principal)
    except errors.PermissionDenied:
        return False
    return True


def _may_see(principal: Principal, row: models.Transaction) -> bool:
    """The key that began a transaction sees and operates it; so do admin:* keys and the console."""
    if _is_superuser(principal):
        return True
    if row.owner_key_id is not None:
        return principal.key_id == row.owner_key_id
    return row.owner == keys.actor_name(principal)


def _info(row: models.Transaction, topic_names: Iterable[str] = ()) -> TransactionInfo:
    return TransactionInfo(
        id=row.id,
        kind=row.kind,
        producer_id=row.producer_id,
        epoch=row.epoch,
        state=row.state,
        reason=row.reason,
        owner=row.owner,
        timeout_ms=row.timeout_ms,
        check_url=row.check_url,
        created_ms=row.created_ms,
        deadline_ms=row.deadline_ms,
        ended_ms=row.ended_ms,
        messages=row.message_count,
        offsets=row.offset_count,
        acks=row.ack_count,
        checks=row.checks,
        next_check_ms=row.next_check_ms,
        last_check=row.last_check,
        topics=tuple(sorted(set(topic_names))),
    )


def _topics_of(ids: list[int]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    rows = (
        models.StagedMessage.objects.filter(transaction_id__in=ids)
        .values_list("transaction_id", "topic__name")
        .distinct()
    )
    for transaction_id, name in rows:
        found.setdefault(transaction_id, []).append(name)
    return found


def _not_open(row: models.Transaction) -> errors.BrokerError:
    if row.reason == "fenced":
        current = (
            models.TransactionProducer.objects.filter(producer_id=row.producer_id)
            .values_list("epoch", flat=True)
            .first()
        )
        return errors.Fenced(
            id=row.id, producer_id=row.producer_id, epoch=current, fenced_epoch=row.epoch
        )
    return errors.TransactionNotOpen(id=row.id, state=row.state, reason=row.reason)


def _locked(principal: Principal, transaction_id: int) -> models.Transaction:
    """The transaction's row, locked. Caller holds the write transaction."""
    # Transaction row lock: serializes adds, commit, rollback, fencing and checks of it.
    row = (
        models.Transaction.objects.select_for_update()
        .filter(id=transaction_id, kind=Kind.PRODUCER)
        .first()
    )
    if row is None or not _may_see(principal, row):
        raise errors.TransactionNotFound(id=transaction_id)
    return row


def _locked_open(principal: Principal, transaction_id: int) -> models.Transaction:
    row = _locked(principal, transaction_id)
    if row.state != State.OPEN:
        raise _not_open(row)
    return row


def _end(row: models.Transaction, state: str, reason: str, now: int) -> None:
    """Delete what it staged and record how it ended. Caller holds its row lock."""
    # The counts are kept with the rows: a table with none of this transaction's is not asked.
    if row.message_count:
        models.StagedMessage.objects.filter(transaction_id=row.id).delete()
    if row.offset_count:
        models.StagedOffset.objects.filter(transaction_id=row.id).delete()
    if row.ack_count:
        models.StagedAck.objects.filter(transaction_id=row.id).delete()
    row.state = state
    row.reason = reason
    row.ended_ms = now
    row.next_check_ms = None
    row.checking_until_ms = None
    row.save(update_fields=["state", "reason", "ended_ms", "next_check_ms", "checking_until_ms"])


def _validate_begin(producer_id: str, timeout_ms: int, check_url: str | None) -> None:
    if not PRODUCER_ID_RE.fullmatch(producer_id or ""):
        raise errors.InvalidRequest(
            "Producer ids are 1 to 200 characters from A-Z, a-z, 0-9, '.', '_', ':' and '-'.",
            producer_id=producer_id,
        )
    limit = ferry_settings.get("MAX_TRANSACTION_TIMEOUT_MS")
    if not 1 <= timeout_ms <= limit:
        raise errors.InvalidRequest(
            f"timeout_ms is 1 to {limit}.", timeout_ms=timeout_ms, max_timeout_ms=limit
        )
    if check_url is not None:
        parsed = urllib.parse.urlsplit(check_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or len(check_url) > 2000:
            raise errors.InvalidRequest(
                "check_url is an http:// or https:// URL of at most 2000 characters.",
                check_url=check_url[:200],
            )


def begin_transaction(
    principal: Principal,
    producer_id: str,
    timeout_ms: int,
    check_url: str | None = None,
    topic_name: str | None = None,
    messages: list[NewMessage] | None = None,
) -> TransactionInfo:
    """Open a transaction for producer_id at its next epoch; its open older one is fenced.

    With topic_name and messages, the first add is made in the same database transaction (one
    round trip and one commit fewer for a producer that knows its first messages).
    """
    _validate_begin(producer_id, timeout_ms, check_url)
    first = None
    if topic_name is not None or messages:
        if topic_name is None or not messages:
            raise errors.InvalidRequest("Give topic and messages together, or neither.")
        first = log.checked_batch(principal, topic_name, messages)[0]
        _check_room(0, len(messages))
    actor = keys.actor_name(principal)
    now = log.now_ms()
    with _atomic():
        models.TransactionProducer.objects.bulk_create(
            [models.TransactionProducer(producer_id=producer_id, owner=actor, updated_ms=now)],
            ignore_conflicts=True,
        )
        # Producer row lock: serializes begins of one producer id, so epochs only grow.
        producer = models.TransactionProducer.objects.select_for_update().get(
            producer_id=producer_id
        )
        if producer.owner != actor and not _is_superuser(principal):
            raise errors.PermissionDenied(
                f"Producer id {producer_id!r} belongs to another key.", producer_id=producer_id
            )
        producer.epoch += 1
        producer.updated_ms = now
        producer.save(update_fields=["epoch", "updated_ms"])
        older = (
            models.Transaction.objects.select_for_update()
            .filter(producer_id=producer_id, kind=Kind.PRODUCER, state=State.OPEN)
            .order_by("id")
        )
        for row in older:
            _end(row, State.ROLLED_BACK, "fenced", now)
        row = models.Transaction.objects.create(
            kind=Kind.PRODUCER,
            producer_id=producer_id,
            epoch=producer.epoch,
            owner=actor,
            owner_key_id=principal.key_id,
            timeout_ms=timeout_ms,
            check_url=check_url or "",
            created_ms=now,
            deadline_ms=now + timeout_ms,
        )
        if first is not None and messages:
            _stage(row.id, first, messages)
            row.message_count = len(messages)
            row.save(update_fields=["message_count"])
    return _info(row, [first.name] if first is not None else [])


STAGED_COLUMNS = (
    "transaction_id",
    "topic_id",
    "partition_number",
    "key",
    "tag",
    "headers",
    "value",
    "is_json",
    "client_id",
    "delay_ms",
    "deliver_at_ms",
    "delay_level",
    "timestamp_ms",
)


def _stage(row_id: int, topic: models.Topic, messages: list[NewMessage]) -> None:
    """Insert half messages in bulk (bulk.insert_rows, as the log's own insert does)."""
    bulk.insert_rows(
        "broker_stagedmessage",
        STAGED_COLUMNS,
        [
            (
                row_id,
                topic.id,
                m.partition,
                m.key,
                m.tag,
                orjson.dumps(m.headers).decode() if m.headers else "{}",
                m.value,
                m.is_json,
                m.client_id,
                m.delay_ms,
                m.deliver_at_ms,
                m.delay_level,
                m.timestamp_ms,
            )
            for m in messages
        ],
    )


def _check_room(count: int, adding: int) -> None:
    if count + adding > MAX_TRANSACTION_MESSAGES:
        raise errors.BatchTooLarge(
            f"A transaction holds at most {MAX_TRANSACTION_MESSAGES} messages.",
            messages=count + adding,
            limit=MAX_TRANSACTION_MESSAGES,
        )


def add_messages(
    principal: Principal, transaction_id: int, topic_name: str, messages: list[NewMessage]
) -> TransactionInfo:
    """Stage half messages: checked as a produce checks them, invisible until commit."""
    # Permission, topic, batch size, partitions, sizes and delays: checked before any write.
    topic, _ = log.checked_batch(principal, topic_name, messages)
    with _atomic():
        row = _locked_open(principal, transaction_id)
        _check_room(row.message_count, len(messages))
        _stage(row.id, topic, messages)
        row.message_count += len(messages)
        row.save(update_fields=["message_count"])
        names = _topics_of([row.id]).get(row.id, [])
    return _info(row, names)


def add_offsets(
    principal: Principal,
    transaction_id: int,
    group_name: str,
    topic_name: str,
    offsets: dict[int, int],
) -> TransactionInfo:
    """Carry a group's offset commit: it takes effect with the commit, not before."""
    membership.validate_group_name(group_name)
    topic = groups.topic_for_consume(principal, topic_name)
    if not offsets:
        raise errors.InvalidRequest("Name at least one partition's offset to commit.")
    for number, offset in offsets.items():
        if not 0 <= number < topic.partition_count:
            raise errors.PartitionNotFound(topic=topic_name, partition=number)
        if offset < 0:
            raise errors.OffsetOutOfRange(
                f"Offset {offset} is negative.", partition=number, offset=offset
            )
    with _atomic():
        row = _locked_open(principal, transaction_id)
        # The last offset carried for a partition wins, as with repeated commits.
        models.StagedOffset.objects.filter(
            transaction_id=row.id,
            group_name=group_name,
            topic_id=topic.id,
            partition_number__in=list(offsets),
        ).delete()
        models.StagedOffset.objects.bulk_create(
            models.StagedOffset(
                transaction_id=row.id,
                group_name=group_name,
                topic_id=topic.id,
                partition_number=number,
                offset=offset,
            )
            for number, offset in sorted(offsets.items())
        )
        row.offset_count = models.StagedOffset.objects.filter(transaction_id=row.id).count()
        row.save(update_fields=["offset_count"])
        names = _topics_of([row.id]).get(row.id, [])
    return _info(row, names)


def add_acks(
    principal: Principal, transaction_id: int, group_name: str, receipts: list[str]
) -> TransactionInfo:
    """Carry acks of delivered messages: they settle with the commit, not before."""
    membership.validate_group_name(group_name)
    limit = ferry_settings.get("MAX_FETCH_MESSAGES")
    if not receipts or len(receipts) > limit:
        raise errors.InvalidRequest(f"Name 1 to {limit} receipts.", count=len(receipts))
    malformed = [r for r in receipts if inflight._parse_receipt(r) is None or len(r) > 40]
    if malformed:
        raise errors.InvalidRequest(
            f"{malformed[0]!r} is not a receipt (token.partition.offset, in hex).",
            receipts=malformed[:10],
        )
    unique = list(dict.fromkeys(receipts))
    with _atomic():
        row = _locked_open(principal, transaction_id)
        models.StagedAck.objects.bulk_create(
            [
                models.StagedAck(transaction_id=row.id, group_name=group_name, receipt=r)
                for r in unique
            ],
            ignore_conflicts=True,
        )
        row.ack_count = models.StagedAck.objects.filter(transaction_id=row.id).count()
        row.save(update_fields=["ack_count"])
        names = _topics_of([row.id]).get(row.id, [])
    return _info(row, names)


# Raw SQL on the commit path: model instances for every half message cost more than the
# append itself (docs/benchmarks.md#transactions). Plain SQL for SQLite and PostgreSQL.
SELECT_STAGED = (
    'SELECT topic_id, partition_number, "key", tag, headers, value, is_json, client_id, '
    "delay_ms, deliver_at_ms, delay_level, timestamp_ms FROM broker_stagedmessage "
    "WHERE transaction_id = %s ORDER BY id"
)


def _staged(transaction_id: int) -> list[tuple[int, NewMessage]]:
    """The transaction's half messages in the order added: (topic id, message)."""
    with connection.cursor() as cursor:
        cursor.execute(SELECT_STAGED, [transaction_id])
        rows = cursor.fetchall()
    staged = []
    for topic_id, number, key, tag, headers, value, is_json, client_id, *later in rows:
        if isinstance(headers, str | bytes):
            headers = orjson.loads(headers)
        staged.append(
            (
                topic_id,
                NewMessage(
                    bytes(value),
                    bool(is_json),
                    key,
                    tag,
                    headers or {},
                    number,
                    client_id,
                    *later,
                ),
            )
        )
    return staged


def _commit_locked(
    principal: Principal, row: models.Transaction, reason: str, now: int
) -> TransactionResult:
    """Append the half messages, apply the carried offsets and acks, end the transaction.

    Caller holds the write transaction and the transaction's row lock. Raises _Abort when the
    commit can never take effect (a deleted topic, a stale receipt); a BrokerError (a full
    topic) leaves the transaction open.
    """
    staged = _staged(row.id)
    offsets = (
        list(
            models.StagedOffset.objects.filter(transaction_id=row.id)
            .select_related("topic")
            .order_by("group_name", "topic_id", "partition_number")
        )
        if row.offset_count
        else []
    )
    if len(staged) != row.message_count or len(offsets) != row.offset_count:
        raise _Abort(
            "topic_deleted",
            "A topic of the transaction was deleted while it was open.",
            id=row.id,
        )
    topics_by_id = models.Topic.objects.in_bulk({topic_id for topic_id, _ in staged})
    by_topic: dict[int, list[int]] = {}
    for index, (topic_id, _) in enumerate(staged):
        by_topic.setdefault(topic_id, []).append(index)
    results: list[tuple[str, AppendResult] | None] = [None] * len(staged)
    # Topics in id order, each one's partitions in number order (log): one lock order for all.
    for topic_id in sorted(by_topic):
        topic, indexes = topics_by_id[topic_id], by_topic[topic_id]
        keys.require(principal, topic.name, "produce")
        appended = log.append_in_transaction(topic, [staged[i][1] for i in indexes])
        for i, result in zip(indexes, appended, strict=True):
            results[i] = (topic.name, result)
    carried: dict[tuple[str, int], tuple[models.Topic, dict[int, int]]] = {}
    for o in offsets:
        carried.setdefault((o.group_name, o.topic_id), (o.topic, {}))[1][o.partition_number] = (
            o.offset
        )
    for (group_name, _), (topic, moves) in sorted(carried.items()):
        keys.require(principal, topic.name, "consume")
        groups.commit_offsets_in_transaction(group_name, topic, moves)
    acks: dict[str, list[str]] = {}
    for group_name, receipt in (
        models.StagedAck.objects.filter(transaction_id=row.id)
        .order_by("group_name", "id")
        .values_list("group_name", "receipt")
        if row.ack_count
        else []
    ):
        acks.setdefault(group_name, []).append(receipt)
    for group_name, receipts in sorted(acks.items()):
        try:
            settled = delivery.ack_in_transaction(principal, group_name, receipts)
        except errors.GroupNotFound:
            settled = None
        stale = list(receipts) if settled is None else list(settled.stale)
        if stale:
            raise _Abort(
                "stale_receipts",
                "The transaction carries acks of deliveries that are no longer in flight "
                "(redelivered, settled or expired): its work must be redone.",
                id=row.id,
                group=group_name,
                receipts=stale[:10],
            )
    _end(row, State.COMMITTED, reason, now)
    return TransactionResult(
        transaction=_info(row, {t.name for t in topics_by_id.values()}),
        results=tuple(r for r in results if r is not None),
    )


def _rollback_aborted(transaction_id: int, abort: _Abort) -> None:
    with _atomic():
        row = models.Transaction.objects.select_for_update().filter(id=transaction_id).first()
        if row is not None and row.state in (State.OPEN, State.PREPARED):
            _end(row, State.ROLLED_BACK, abort.reason, log.now_ms())


def _operated_by(principal: Principal, row: models.Transaction) -> str:
    """The reason a commit or rollback records: its producer's own, or an operator's."""
    if row.owner_key_id is not None and principal.key_id == row.owner_key_id:
        return "producer"
    if row.owner_key_id is None and row.owner == keys.actor_name(principal):
        return "producer"
    return "operator"


def commit_transaction(principal: Principal, transaction_id: int) -> TransactionResult:
    """Make every half message visible at once, with the carried offsets and acks.

    Committing a committed transaction again answers it (a retried commit), without results.
    """
    for attempt in range(_COMMIT_ATTEMPTS):
        try:
            with _atomic():
                row = _locked(principal, transaction_id)
                if row.state == State.COMMITTED:
                    return TransactionResult(transaction=_info(row))
                if row.state != State.OPEN:
                    raise _not_open(row)
                return _commit_locked(principal, row, _operated_by(principal, row), log.now_ms())
        except _Abort as abort:
            _rollback_aborted(transaction_id, abort)
            raise errors.TransactionAborted(
                abort.message, reason=abort.reason, **abort.detail
            ) from None
        except IntegrityError:
            # PostgreSQL only: a concurrent producer stored one of these client ids between
            # the dedup lookup and the insert (as in log.append_messages); the retry sees it.
            if attempt == _COMMIT_ATTEMPTS - 1:
                raise errors.BrokerError("Could not commit the transaction; retry it.") from None
    raise AssertionError("unreachable")


def rollback_transaction(principal: Principal, transaction_id: int) -> TransactionInfo:
    """Discard the half messages, offsets and acks. Rolling back a rolled-back one answers it."""
    with _atomic():
        row = _locked(principal, transaction_id)
        if row.state == State.ROLLED_BACK and row.reason != "fenced":
            return _info(row)
        if row.state != State.OPEN:
            raise _not_open(row)
        _end(row, State.ROLLED_BACK, _operated_by(principal, row), log.now_ms())
    return _info(row)


def get_transaction(principal: Principal, transaction_id: int) -> TransactionInfo:
    row = models.Transaction.objects.filter(id=transaction_id).first()
    if row is None or not _may_see(principal, row):
        raise errors.TransactionNotFound(id=transaction_id)
    return _info(row, _topics_of([row.id]).get(row.id, []))


def list_transactions(
    principal: Principal,
    state: str | None = None,
    producer_id: str | None = None,
    limit: int = 100,
) -> list[TransactionInfo]:
    """Transactions newest first: the key's own, or every one for admin:* and the console."""
    if state is not None and state not in STATES:
        raise errors.InvalidRequest(
            f"state is one of {', '.join(STATES)}.", state=state, states=list(STATES)
        )
    if not 1 <= limit <= 1000:
        raise errors.InvalidRequest("limit is 1 to 1000.", limit=limit)
    rows = models.Transaction.objects.all()
    if not _is_superuser(principal):
        if principal.key_id is None:
            rows = rows.filter(owner=keys.actor_name(principal), owner_key_id__isnull=True)
        else:
            rows = rows.filter(owner_key_id=principal.key_id)
    if state is not None:
        rows = rows.filter(state=state)
    if producer_id is not None:
        rows = rows.filter(producer_id=producer_id)
    found = list(rows.order_by("-id")[:limit])
    names = _topics_of([r.id for r in found])
    return [_info(r, names.get(r.id, [])) for r in found]


# Check-back and timeouts (the check_transactions job).


def _ask(row: models.Transaction) -> tuple[str, str]:
    """POST the check to the producer's check_url: (answer, what happened). No lock held."""
    body = json.dumps(
        {
            "transaction_id": row.id,
            "producer_id": row.producer_id,
            "epoch": row.epoch,
            "created_ms": row.created_ms,
            "checks": row.checks + 1,
            "messages": row.message_count,
        }
    ).encode()
    request = urllib.request.Request(  # noqa: S310 (http and https only: _validate_begin)
        row.check_url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "ferry-check-back"},
    )
    timeout = float(ferry_settings.get("TRANSACTION_CHECK_TIMEOUT_SECONDS"))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            text = response.read(4096).decode(errors="replace").strip()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return "failed", f"check failed: {exc}"[:500]
    answer = text.lower()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("status"), str):
        answer = parsed["status"].lower()
    if answer not in ANSWERS:
        return "failed", f"check answered {text[:100]!r}, not commit, rollback or unknown"
    return answer, f"check answered {answer}"


def _claim_checks(now: int) -> list[models.Transaction]:
    """Open transactions past their deadline whose check is due, held by this runner a while."""
    lease_ms = int(float(ferry_settings.get("TRANSACTION_CHECK_TIMEOUT_SECONDS")) * 2000) + 1000
    with transaction.atomic(durable=True):
        # SKIP LOCKED: each transaction is checked by one runner at a time (the lease).
        claimed = list(
            models.Transaction.objects.select_for_update(skip_locked=True)
            .filter(kind=Kind.PRODUCER, state=State.OPEN, deadline_ms__lte=now)
            .exclude(check_url="")
            .exclude(next_check_ms__gt=now)
            .exclude(checking_until_ms__gt=now)
            .order_by("deadline_ms", "id")[:CHECK_BATCH]
        )
        models.Transaction.objects.filter(id__in=[r.id for r in claimed]).update(
            checking_until_ms=now + lease_ms
        )
    return claimed


def _resolve(claimed: models.Transaction, answer: str, what: str, tally: dict[str, int]) -> None:
    now = log.now_ms()
    try:
        with transaction.atomic(durable=True):
            row = models.Transaction.objects.select_for_update().filter(id=claimed.id).first()
            if row is None or row.state != State.OPEN:
                return  # its producer (or an operator) ended it meanwhile
            row.checks += 1
            row.last_check = what
            if answer == "commit":
                _commit_locked(keys.CONSOLE, row, "check_back", now)
                row.save(update_fields=["checks", "last_check"])
                tally["committed"] += 1
                return
            if answer == "rollback":
                row.save(update_fields=["checks", "last_check"])
                _end(row, State.ROLLED_BACK, "check_back", now)
                tally["rolled_back"] += 1
                return
            _after_unknown(row, now, tally)
    except _Abort as abort:
        _rollback_aborted(claimed.id, abort)
        tally["rolled_back"] += 1
    except errors.BrokerError as exc:
        # The callback said commit and the commit failed (a full topic): count it as a check.
        with transaction.atomic(durable=True):
            row = models.Transaction.objects.select_for_update().filter(id=claimed.id).first()
            if row is not None and row.state == State.OPEN:
                row.checks += 1
                row.last_check = f"commit failed: {exc.code}: {exc.message}"[:500]
                _after_unknown(row, now, tally)


def _after_unknown(row: models.Transaction, now: int, tally: dict[str, int]) -> None:
    """An unknown or failed check: try later, or roll back after the last. Caller holds the lock."""
    if row.checks >= int(ferry_settings.get("TRANSACTION_MAX_CHECKS")):
        row.save(update_fields=["checks", "last_check"])
        _end(row, State.ROLLED_BACK, "check_back_unresolved", now)
        tally["rolled_back"] += 1
        return
    backoff = int(ferry_settings.get("TRANSACTION_CHECK_BACKOFF_MS")) * 2 ** (row.checks - 1)
    row.next_check_ms = now + min(MAX_CHECK_BACKOFF_MS, backoff)
    row.checking_until_ms = None
    row.save(update_fields=["checks", "last_check", "next_check_ms", "checking_until_ms"])


def _roll_back_timed_out(now: int) -> int:
    """Open transactions past their deadline with nobody to ask: rolled back (reason timeout)."""
    with transaction.atomic(durable=True):
        rows = list(
            models.Transaction.objects.select_for_update(skip_locked=True)
            .filter(kind=Kind.PRODUCER, state=State.OPEN, deadline_ms__lte=now, check_url="")
            .order_by("id")[:PURGE_BATCH]
        )
        for row in rows:
            _end(row, State.ROLLED_BACK, "timeout", now)
    return len(rows)


def _purge_ended(now: int) -> int:
    cutoff = now - int(ferry_settings.get("TRANSACTION_RETENTION_SECONDS")) * 1000
    with transaction.atomic(durable=True):
        ids = list(
            models.Transaction.objects.filter(
                state__in=[State.COMMITTED, State.ROLLED_BACK], ended_ms__lt=cutoff
            ).values_list("id", flat=True)[:PURGE_BATCH]
        )
        models.Transaction.objects.filter(id__in=ids).delete()
    return len(ids)


def check_transactions() -> int:
    """The periodic job (run_checks); returns how many transactions it promoted or ended."""
    done = run_checks()
    return done.committed + done.rolled_back + done.promoted + done.purged


def run_checks() -> TransactionCheck:
    """Promote committed outbox writes, time out, check back, purge old ended transactions."""
    now = log.now_ms()
    promoted = promote_prepared()
    rolled_back = _roll_back_timed_out(now)
    tally = {"committed": 0, "rolled_back": 0}
    claimed = _claim_checks(now)
    for row in claimed:
        answer, what = _ask(row)
        _resolve(row, answer, what, tally)
    return TransactionCheck(
        committed=tally["committed"],
        rolled_back=rolled_back + tally["rolled_back"],
        checked=len(claimed),
        promoted=promoted,
        purged=_purge_ended(now),
    )


# The outbox: publishing inside the caller's own database transaction (docs/transactions.md).


def stage_outbox(topic_name: str, messages: list[NewMessage]) -> int:
    """Stage messages in the caller's transaction.atomic(); returns the outbox transaction id.

    The one core write that is not durable=True: it joins the caller's transaction on purpose,
    so the staged rows commit or roll back with the caller's own rows. After the caller's
    commit, promote_outbox appends them (on_commit), else the check job's sweeper does.
    """
    topic, _ = log.checked_batch(keys.CONSOLE, topic_name, messages)
    with transaction.atomic():
        transaction_id = _current_outbox()
        _stage(transaction_id, topic, messages)
        models.Transaction.objects.filter(id=transaction_id).update(
            message_count=F("message_count") + len(messages)
        )
    return transaction_id


def _current_outbox() -> int:
    """This database transaction's outbox transaction row, made on the first publish.

    The id is remembered on the connection until the commit; a row a rolled-back transaction
    or savepoint made is gone, so a remembered id whose row cannot be seen starts a new one.
    """
    remembered = getattr(connection, "ferry_outbox_id", None)
    if (
        remembered is not None
        and models.Transaction.objects.filter(id=remembered, state=State.PREPARED).exists()
    ):
        return int(remembered)
    now = log.now_ms()
    row = models.Transaction.objects.create(
        kind=Kind.OUTBOX,
        owner="outbox",
        state=State.PREPARED,
        created_ms=now,
        deadline_ms=now,
    )
    connection.ferry_outbox_id = row.id  # type: ignore[attr-defined]

    def promote_after_commit() -> None:
        if getattr(connection, "ferry_outbox_id", None) == row.id:
            connection.ferry_outbox_id = None  # type: ignore[attr-defined]
        try:
            promote_outbox(row.id)
        except Exception:
            # The caller's commit stands; the check job's sweeper appends it on its next round.
            logger.exception("outbox transaction %s: promotion failed; the sweeper retries", row.id)

    transaction.on_commit(promote_after_commit)
    return row.id


def promote_outbox(transaction_id: int) -> bool:
    """Append a committed outbox transaction's messages; False when already done (or gone)."""
    try:
        with transaction.atomic(durable=True):
            # Transaction row lock: the on-commit promotion and the sweeper append it once.
            row = (
                models.Transaction.objects.select_for_update()
                .filter(id=transaction_id, kind=Kind.OUTBOX, state=State.PREPARED)
                .first()
            )
            if row is None:
                return False
            _commit_locked(keys.CONSOLE, row, "outbox", log.now_ms())
            return True
    except _Abort as abort:
        _rollback_aborted(transaction_id, abort)
        logger.warning("outbox transaction %s rolled back: %s", transaction_id, abort.message)
        return False


def promote_prepared() -> int:
    """The sweeper: promote outbox transactions whose on-commit promotion did not happen."""
    ids = list(
        models.Transaction.objects.filter(kind=Kind.OUTBOX, state=State.PREPARED)
        .order_by("id")
        .values_list("id", flat=True)[:PURGE_BATCH]
    )
    promoted = 0
    for transaction_id in ids:
        try:
            promoted += promote_outbox(transaction_id)
        except errors.BrokerError as exc:
            logger.warning("outbox transaction %s not promoted yet: %s", transaction_id, exc)
    return promoted
