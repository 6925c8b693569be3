"""The push path of a subscriber: an ack, then the delivery of the credit it freed, in one call.

See docs/websocket.md#flow-control-credit and
docs/benchmarks.md#the-per-message-path-benchper_messagepy. A WebSocket subscriber with a
small prefetch acks a message and waits for the next: settling and delivering in one call on
the database thread sends the next message right after the `acked` answer, without a second
hop to the thread and a second lookup of the group and the member.
"""

from broker import models
from broker.core import bulk, errors, groups, inflight
from broker.core.delivery import deliver, settle
from broker.core.records import AckAndDelivery, Principal


def ack_and_deliver(
    principal: Principal,
    group_name: str,
    receipts: list[str],
    topic_name: str,
    member_id: str,
    credit: int,
    max_messages: int,
) -> AckAndDelivery:
    """Ack the receipts, then deliver to the member up to credit plus what the ack settled.

    credit is what the caller may push besides the freed credit; at most max_messages are
    delivered. What stops the delivery (the member is gone, the topic or the key's permission
    went away) does not undo the ack: delivered is then None, and the caller's push task, which
    meets the same error, handles it. An error of the ack itself is raised as ack_messages
    raises it, and then nothing is delivered.

    One transaction: the ack reuses the group the member check read and the member's offset
    rows, read first (with whether a retry is due), and the delivery writes the committed
    offsets the ack moved. On PostgreSQL those rows are locked so, all at once in id order,
    after the group (docs/architecture.md#locks): an ack alone locks the rows
    of its receipts' partitions, a delivery the group and then its own, and one transaction
    that locked the ack's rows and then the delivery's could deadlock with another ack. An ack
    that names runs outside the member's partitions (receipts of an earlier assignment) is
    settled in a transaction of its own before the delivery's, as before.
    """
    deliver.validate_max_messages(max_messages)
    try:
        groups.check_consume(principal, topic_name)
    except errors.BrokerError:
        return AckAndDelivery(settle.ack_messages(principal, group_name, receipts))
    args = (principal, group_name, receipts, topic_name, member_id, credit, max_messages)
    try:
        try:
            return _in_one_transaction(*args, guess=True)
        except deliver.GuessedWrong:
            return _in_one_transaction(*args, guess=False)  # rolled back: its locks let go of
    except settle.LocksOutOfOrder:
        pass  # rolled back: the ack and the delivery in two transactions
    acked = settle.ack_messages(principal, group_name, receipts)
    room = min(max_messages, credit + acked.settled)
    if room <= 0:
        return AckAndDelivery(acked)
    with bulk.bookkeeping():
        found = _member_or_none(principal, group_name, member_id, topic_name)
        if found is None:
            return AckAndDelivery(acked)
        topic, group, member = found
        return AckAndDelivery(acked, deliver.deliver_in_transaction(topic, group, member, room))


def _in_one_transaction(
    principal: Principal,
    group_name: str,
    receipts: list[str],
    topic_name: str,
    member_id: str,
    credit: int,
    max_messages: int,
    *,
    guess: bool,
) -> AckAndDelivery:
    """ack_and_deliver's ack and delivery in one transaction. guess: on PostgreSQL, lock the
    member's offset rows in its group's lock's round trip, as its last delivery here found
    them (deliver.lock_ahead; GuessedWrong, and rolled back, when they are not its rows now)."""
    with bulk.bookkeeping():
        # What the delivery asks for if every receipt settles: for the reads ahead.
        asked = min(max_messages, credit + len(receipts))
        ahead = deliver.lock_ahead(group_name, member_id, topic_name, asked) if guess else None
        if ahead is not None:
            settle.read_named_ahead(ahead.group_id, receipts)
        found = _member_or_none(principal, group_name, member_id, topic_name, ahead is not None)
        locked: dict[inflight.OffsetKey, models.GroupOffset] = {}
        postgresql = bulk.vendor() == "postgresql"
        # The committed offsets the ack moves are written by the delivery's own update of
        # the same rows (a statement fewer), and whether a retry is due is asked with the
        # rows (another statement fewer).
        deferred: set[inflight.OffsetKey] | None = None
        due: bool | None = None
        if found is not None:
            if ahead is None:
                # The runs the ack names come with the lock of the member's offset rows.
                settle.read_named_ahead(found[1].id, receipts)
            locked, due = deliver.lock_member_offsets(*found, asked, ahead)
            deferred = set()
        elif ahead is not None:
            raise deliver.GuessedWrong  # rows locked for a member that is gone
        members = set(locked)
        acked = settle.ack_in_transaction(
            principal,
            group_name,
            receipts,
            group=found[1] if found else None,
            locked=locked,
            lock_more=found is None or not postgresql,
            defer_committed=deferred,
        )
        room = min(max_messages, credit + acked.settled)
        if deferred:
            # The rows no delivery will write: all when none follows, else those of an
            # earlier assignment's runs (SQLite locks them here; PostgreSQL took the other
            # way, LocksOutOfOrder).
            now = deferred if room <= 0 else deferred - members
            if now:
                inflight.recompute_committed({key: locked[key] for key in now})
                deferred -= now
        if found is None or room <= 0:
            return AckAndDelivery(acked)
        topic, group, member = found
        delivered = deliver.deliver_in_transaction(
            topic, group, member, room, locked=locked, recompute=deferred, retries_due=due
        )
        return AckAndDelivery(acked, delivered)


def _member_or_none(
    principal: Principal, group_name: str, member_id: str, topic_name: str, guessed: bool = False
) -> tuple[models.Topic, models.ConsumerGroup, models.GroupMember] | None:
    """deliver.member_for_delivery, or None when it refuses (before writing anything)."""
    try:
        return deliver.member_for_delivery(
            principal, group_name, member_id, topic_name, guessed=guessed
        )
    except errors.BrokerError:
        return None
