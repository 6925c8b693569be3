"""Transactions: half messages, fencing, carried offsets and acks, check-back, the outbox.

See docs/transactions.md and docs/architecture.md#transactions (ADR 0015). Lock order: producer
row → transaction row → topic → partition → group → message. Each public write is one
transaction (durable), except that calls made through call_async may share one, a savepoint
each (run_shared), and the outbox's stage_outbox, which joins the caller's transaction on
purpose.

The package: shared.py (shared commits), staging.py (begin, add, rollback, reads), commit.py,
outbox.py (publishing in the caller's transaction) and checks.py (timeouts, check-back, the
sweeper, purging). Its public names are re-exported here: callers use `transactions.<name>`.
"""

from broker.core.transactions.checks import check_transactions, run_checks
from broker.core.transactions.commit import commit_transaction
from broker.core.transactions.outbox import promote_outbox, promote_prepared, stage_outbox
from broker.core.transactions.shared import call_async, run_shared
from broker.core.transactions.staging import (
    MAX_TRANSACTION_MESSAGES,
    STATES,
    add_acks,
    add_messages,
    add_offsets,
    begin_transaction,
    get_transaction,
    list_transactions,
    rollback_transaction,
)

__all__ = [
    "MAX_TRANSACTION_MESSAGES",
    "STATES",
    "add_acks",
    "add_messages",
    "add_offsets",
    "begin_transaction",
    "call_async",
    "check_transactions",
    "commit_transaction",
    "get_transaction",
    "list_transactions",
    "promote_outbox",
    "promote_prepared",
    "rollback_transaction",
    "run_checks",
    "run_shared",
    "stage_outbox",
]
