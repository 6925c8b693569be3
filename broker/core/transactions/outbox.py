"""The outbox: publishing inside the caller's own database transaction (docs/transactions.md).

broker/outbox.py is its face for project code. stage_outbox writes the transaction row and its
half messages in the caller's transaction; promote_outbox appends them after the caller's
commit, and promote_prepared (the check job's sweeper) does for those a crash left behind.
"""

import logging

from django.db import connection, transaction
from django.db.models import F

from broker import models
from broker.core import errors, keys, log
from broker.core.records import NewMessage
from broker.core.transactions import commit, staging

logger = logging.getLogger(__name__)

State = models.Transaction.State
Kind = models.Transaction.Kind
# Outbox transactions the sweeper promotes per round at most.
PROMOTE_BATCH = 1000


def stage_outbox(topic_name: str, messages: list[NewMessage]) -> int:
    """Stage messages in the caller's transaction.atomic(); returns the outbox transaction id.

    The one core write that is not durable=True: it joins the caller's transaction on purpose,
    so the staged rows commit or roll back with the caller's own rows. After the caller's
    commit, promote_outbox appends them (on_commit), else the check job's sweeper does.
    """
    topic, _ = log.checked_batch(keys.CONSOLE, topic_name, messages)
    with transaction.atomic():
        transaction_id = _current_outbox()
        staging.stage(transaction_id, topic, messages)
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
            commit.commit_locked(keys.CONSOLE, row, "outbox", log.now_ms())
            return True
    except commit.Abort as abort:
        commit.rollback_aborted(transaction_id, abort)
        logger.warning("outbox transaction %s rolled back: %s", transaction_id, abort.message)
        return False


def promote_prepared() -> int:
    """The sweeper: promote outbox transactions whose on-commit promotion did not happen."""
    ids = list(
        models.Transaction.objects.filter(kind=Kind.OUTBOX, state=State.PREPARED)
        .order_by("id")
        .values_list("id", flat=True)[:PROMOTE_BATCH]
    )
    promoted = 0
    for transaction_id in ids:
        try:
            promoted += promote_outbox(transaction_id)
        except errors.BrokerError as exc:
            logger.warning("outbox transaction %s not promoted yet: %s", transaction_id, exc)
    return promoted
