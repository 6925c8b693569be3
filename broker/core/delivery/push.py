"""The push path of a subscriber: an ack, then the delivery of the credit it freed, in one call.

See docs/websocket.md#flow-control-credit. A WebSocket subscriber with a small prefetch acks a
message and waits for the next: settling and delivering in one call on the database thread
sends the next message right after the `acked` answer, without a second hop to the thread.
"""

from broker.core import errors
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

    Two transactions, each as its own function has it (ack_messages, then deliver_messages), so
    the locks are taken in the usual order. credit is what the caller may push besides the
    freed credit; at most max_messages are delivered. The delivery's BrokerError (the member is
    gone, the topic or its permission went away) does not undo the ack: delivered is then None,
    and the caller's push task, which meets the same error, handles it.
    """
    acked = settle.ack_messages(principal, group_name, receipts)
    room = min(max_messages, credit + acked.settled)
    if room <= 0:
        return AckAndDelivery(acked)
    try:
        delivered = deliver.deliver_messages(principal, group_name, topic_name, member_id, room)
    except errors.BrokerError:
        return AckAndDelivery(acked)
    return AckAndDelivery(acked, delivered)
