"""A transaction's life: begin (fencing), half messages, carried offsets and acks, commit, rollback.

See docs/transactions.md and ADR 0015. Half messages wait in StagedMessage, a table no reader
reads; a commit appends them through the log's own append path (log.append_in_transaction:
offsets assigned at commit, dedup, capacity) together with the carried group offset commits and
acks, in one database transaction, and deletes them; a rollback deletes them.
"""

import re
import urllib.parse
from collections.abc import Iterable

import orjson

from broker import models
from broker import settings as ferry_settings
from broker.core import bulk, errors, groups, inflight, keys, log, membership
from broker.core.records import (
    NewMessage,
    Principal,
    TransactionInfo,
)
from broker.core.transactions import shared

State = models.Transaction.State
Kind = models.Transaction.Kind
STATES = tuple(State.values)
PRODUCER_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")
MAX_TRANSACTION_MESSAGES = 100_000


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


def end(row: models.Transaction, state: str, reason: str, now: int) -> None:
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
    with shared.atomic():
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
            end(row, State.ROLLED_BACK, "fenced", now)
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
            stage(row.id, first, messages)
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


def stage(row_id: int, topic: models.Topic, messages: list[NewMessage]) -> None:
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
    with shared.atomic():
        row = _locked_open(principal, transaction_id)
        _check_room(row.message_count, len(messages))
        stage(row.id, topic, messages)
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
    with shared.atomic():
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
    with shared.atomic():
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


def operated_by(principal: Principal, row: models.Transaction) -> str:
    """The reason a commit or rollback records: its producer's own, or an operator's."""
    if row.owner_key_id is not None and principal.key_id == row.owner_key_id:
        return "producer"
    if row.owner_key_id is None and row.owner == keys.actor_name(principal):
        return "producer"
    return "operator"


def rollback_transaction(principal: Principal, transaction_id: int) -> TransactionInfo:
    """Discard the half messages, offsets and acks. Rolling back a rolled-back one answers it."""
    with shared.atomic():
        row = _locked(principal, transaction_id)
        if row.state == State.ROLLED_BACK and row.reason != "fenced":
            return _info(row)
        if row.state != State.OPEN:
            raise _not_open(row)
        end(row, State.ROLLED_BACK, operated_by(principal, row), log.now_ms())
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
