"""Committing a transaction: its half messages appended, its offsets and acks applied, at once.

See docs/transactions.md#guarantees and ADR 0015. commit_locked appends the staged messages
through log.append_in_transaction (the produce path: partition locks, offsets, dedup,
capacity, the wake-up on commit), topic by topic in id order, then commits the carried offsets
and acks, deletes the staged rows and ends the transaction, in the caller's transaction.
"""

from typing import Any

import orjson
from django.db import IntegrityError, connection

from broker import models
from broker.core import delivery, errors, groups, keys, log
from broker.core.records import AppendResult, NewMessage, Principal, TransactionResult
from broker.core.transactions import shared, staging

State = models.Transaction.State
_COMMIT_ATTEMPTS = 3


class Abort(Exception):
    """The commit cannot take effect as a whole: roll the transaction back, with this reason."""

    def __init__(self, reason: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.detail = detail


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


def commit_locked(
    principal: Principal, row: models.Transaction, reason: str, now: int
) -> TransactionResult:
    """Append the half messages, apply the carried offsets and acks, staging.end the transaction.

    Caller holds the write transaction and the transaction's row lock. Raises Abort when the
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
        raise Abort(
            "topic_deleted",
            "A topic of the transaction was deleted while it was open.",
            id=row.id,
        )
    topics_by_id = models.Topic.objects.in_bulk({topic_id for topic_id, _ in staged})
    # A topic marked for deletion keeps its rows (staged ones too) until the deletion job
    # reaches them (topics.delete_topic): it is as gone for a commit as for everyone else.
    if any(t.deleting_since_ms is not None for t in topics_by_id.values()) or any(
        o.topic.deleting_since_ms is not None for o in offsets
    ):
        raise Abort(
            "topic_deleted",
            "A topic of the transaction was deleted while it was open.",
            id=row.id,
        )
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
            raise Abort(
                "stale_receipts",
                "The transaction carries acks of deliveries that are no longer in flight "
                "(redelivered, settled or expired): its work must be redone.",
                id=row.id,
                group=group_name,
                receipts=stale[:10],
            )
    staging.end(row, State.COMMITTED, reason, now)
    return TransactionResult(
        transaction=staging._info(row, {t.name for t in topics_by_id.values()}),
        results=tuple(r for r in results if r is not None),
    )


def rollback_aborted(transaction_id: int, abort: Abort) -> None:
    with shared.atomic():
        row = models.Transaction.objects.select_for_update().filter(id=transaction_id).first()
        if row is not None and row.state in (State.OPEN, State.PREPARED):
            staging.end(row, State.ROLLED_BACK, abort.reason, log.now_ms())


def commit_transaction(principal: Principal, transaction_id: int) -> TransactionResult:
    """Make every half message visible at once, with the carried offsets and acks.

    Committing a committed transaction again answers it (a retried commit), without results.
    """
    for attempt in range(_COMMIT_ATTEMPTS):
        try:
            with shared.atomic():
                row = staging._locked(principal, transaction_id)
                if row.state == State.COMMITTED:
                    return TransactionResult(transaction=staging._info(row))
                if row.state != State.OPEN:
                    raise staging._not_open(row)
                return commit_locked(
                    principal, row, staging.operated_by(principal, row), log.now_ms()
                )
        except Abort as abort:
            rollback_aborted(transaction_id, abort)
            raise errors.TransactionAborted(
                abort.message, reason=abort.reason, **abort.detail
            ) from None
        except IntegrityError:
            # PostgreSQL only: a concurrent producer stored one of these client ids between
            # the dedup lookup and the insert (as in log.append_messages); the retry sees it.
            if attempt == _COMMIT_ATTEMPTS - 1:
                raise errors.BrokerError("Could not commit the transaction; retry it.") from None
    raise AssertionError("unreachable")
