"""Dead-letter rows: a copy of each message beside a dead_lettered trace event.

See docs/semantics.md#retries-and-dead-letters. Below the groups and retries layers, so a plain
poll (groups) and acknowledged delivery (delivery, retries) dead-letter the same way.
"""

from broker import models
from broker.core import trace
from broker.core.records import StoredMessage


def dead_letter_messages(
    group: models.ConsumerGroup,
    topic: models.Topic,
    subscriber: str,
    messages: list[StoredMessage],
    reason: str,
    now: int,
) -> None:
    """Dead-letter messages never delivered (past the topic's TTL). Caller holds the locks."""
    letters, events = [], []
    for m in messages:
        row = letter(group, topic, subscriber, m.partition, m.offset, m)
        row.reason, row.attempts, row.dead_ms = reason, 0, now
        letters.append(row)
        events.append(
            trace.event(
                topic.id,
                m.partition,
                m.offset,
                "dead_lettered",
                group=group.name,
                at_ms=now,
                reason=reason,
            )
        )
    models.DeadLetter.objects.bulk_create(letters)
    trace.record(events)


def letter(
    group: models.ConsumerGroup,
    topic: models.Topic,
    subscriber: str,
    partition: int,
    offset: int,
    message: StoredMessage | None,
) -> models.DeadLetter:
    # A message retention removed meanwhile is dead-lettered by its coordinates alone.
    return models.DeadLetter(
        group=group,
        topic=topic,
        subscriber=subscriber,
        partition_number=partition,
        offset=offset,
        timestamp_ms=message.timestamp_ms if message else 0,
        key=message.key if message else None,
        tag=message.tag if message else None,
        headers=message.headers if message else {},
        value=message.value if message else b"",
        is_json=message.is_json if message else False,
        client_id=message.client_id if message else None,
    )


def dead_letter_once(
    group: models.ConsumerGroup,
    topic: models.Topic,
    subscriber: str,
    messages: list[StoredMessage],
    reason: str,
    now: int,
) -> int:
    """dead_letter_messages, leaving out those the group already has for this reason.

    A plain poll without auto_commit may read an expired message again; it is recorded once.
    Caller holds the group offset locks. Returns how many were dead-lettered now.
    """
    if not messages:
        return 0
    known = set(
        models.DeadLetter.objects.filter(
            group=group,
            topic=topic,
            subscriber=subscriber,
            reason=reason,
            partition_number__in={m.partition for m in messages},
            offset__in=[m.offset for m in messages],
        ).values_list("partition_number", "offset")
    )
    fresh = [m for m in messages if (m.partition, m.offset) not in known]
    dead_letter_messages(group, topic, subscriber, fresh, reason, now)
    return len(fresh)
