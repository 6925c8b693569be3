"""Acknowledged delivery: deliver to members, ack, nack, reject, extend, deadline sweep.

See docs/semantics.md#acknowledgements and docs/architecture.md#locks. Every write here locks
the group offset rows (GroupOffset, in id order) of the partitions it touches before it reads or
changes their InFlight rows: that lock serializes deliveries, settlements, the deadline sweep and
redrives of one (group, partition, subscriber), so a message is never handed out twice while in
flight and the committed offset is always the lowest unsettled offset.

The package: deliver.py (deliver_messages), settle.py (ack, nack, reject, extend, release), push.py
(ack_and_deliver: an ack and the next push in one call) and sweep.py (the deadline sweep),
over inflight.py a layer down (in-flight runs, receipts, offset locks, the committed offset)
and retries.py (backoff, dead letters). Its public names are re-exported
here: callers use `delivery.<name>`.
"""

from broker.core.delivery.deliver import (
    ANY_DUE,
    SCAN_LIMIT,
    deliver_messages,
    deliver_messages_async,
)
from broker.core.delivery.push import ack_and_deliver
from broker.core.delivery.settle import (
    DELETE_IN_FLIGHT,
    RECEIPT_MAX,
    SELECT_NAMED,
    ack_in_transaction,
    ack_messages,
    extend_deadlines,
    nack_messages,
    reject_messages,
    release_messages,
)
from broker.core.delivery.sweep import SWEEP_BATCH, redeliver_expired

__all__ = [
    "ANY_DUE",
    "DELETE_IN_FLIGHT",
    "RECEIPT_MAX",
    "SCAN_LIMIT",
    "SELECT_NAMED",
    "SWEEP_BATCH",
    "ack_and_deliver",
    "ack_in_transaction",
    "ack_messages",
    "deliver_messages",
    "deliver_messages_async",
    "extend_deadlines",
    "nack_messages",
    "redeliver_expired",
    "reject_messages",
    "release_messages",
]
