"""The outbox: publish from this Django project inside your own transaction.atomic().

    from django.db import transaction
    from broker import outbox

    with transaction.atomic():
        order = Order.objects.create(...)
        outbox.publish("orders", {"id": order.id}, key=str(order.id))

The messages are written in your database transaction and become visible (get offsets) right
after it commits, all of them at once; if it rolls back, nothing is published. No broker call
waits for the network, and no check-back is needed: docs/transactions.md#the-outbox.
"""

from typing import Any

import orjson

from broker.core import transactions
from broker.core.records import NewMessage


def message(
    value: Any,
    *,
    key: str | None = None,
    tag: str | None = None,
    headers: dict[str, str] | None = None,
    partition: int | None = None,
    id: str | None = None,
    delay_ms: int | None = None,
) -> NewMessage:
    """One message: bytes are stored raw, anything else as JSON."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw, is_json = bytes(value), False
    else:
        raw, is_json = orjson.dumps(value), True
    return NewMessage(raw, is_json, key, tag, headers or {}, partition, id, delay_ms)


def publish(
    topic: str,
    value: Any,
    *,
    key: str | None = None,
    tag: str | None = None,
    headers: dict[str, str] | None = None,
    partition: int | None = None,
    id: str | None = None,
    delay_ms: int | None = None,
) -> int:
    """Publish one message with the caller's transaction; returns the outbox transaction id."""
    return transactions.stage_outbox(
        topic,
        [
            message(
                value,
                key=key,
                tag=tag,
                headers=headers,
                partition=partition,
                id=id,
                delay_ms=delay_ms,
            )
        ],
    )


def publish_many(topic: str, messages: list[NewMessage]) -> int:
    """Publish several messages (made with message()) with the caller's transaction."""
    return transactions.stage_outbox(topic, messages)
