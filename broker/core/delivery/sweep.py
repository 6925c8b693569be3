"""The deadline sweep: deliveries past their ack deadline become retries or dead letters.

See docs/semantics.md#acknowledgements and docs/architecture.md#background-jobs.
"""

from django.db.models import F, Q

from broker import models
from broker.core import bulk, events, inflight, log, retries
from broker.core.delivery import settle

SWEEP_BATCH = 1000
DEADLINE_PASSED = "ack deadline passed"

# A group's delivered runs past their deadline, in some partitions (bulk.id_array, for_ids):
# the caller keeps those of the offset rows it locked.
EXPIRED_RUNS = (
    settle.SELECT_RUNS + "WHERE i.group_id = %s AND i.state = %s AND i.deadline_ms < %s "
    'AND i.last_offset > i."offset" AND i.partition_id = ANY(%s)'
)


def redeliver_expired() -> int:
    """Turn deliveries past their ack deadline into retries (or dead letters); returns how many.

    Also wakes long polls of topics whose retries are due, so they are redelivered promptly.
    """
    now = log.now_ms()
    expired = models.InFlight.objects.filter(
        state=models.InFlight.State.DELIVERED, deadline_ms__lt=now
    )
    handled = 0
    while True:
        found = list(
            expired.order_by("deadline_ms")
            .values_list("group_id", "partition_id", "subscriber")
            .distinct()[:SWEEP_BATCH]
        )
        if not found:
            break
        for group_id in sorted({g for g, _, _ in found}):
            handled += _sweep_group(group_id, [k for k in found if k[0] == group_id], now)
        if len(found) < SWEEP_BATCH:
            break
    due_topics = (
        models.InFlight.objects.filter(state=models.InFlight.State.RETRY_WAIT, deadline_ms__lte=now)
        .values_list("partition__topic_id", flat=True)
        .distinct()
    )
    for topic_id in list(due_topics):
        events.messages_returned(topic_id)
    return handled


def _sweep_group(group_id: int, keys_: list[inflight.OffsetKey], now: int) -> int:
    with bulk.bookkeeping():
        group = models.ConsumerGroup.objects.filter(id=group_id).first()
        if group is None:
            return 0
        offsets = inflight.locked_offsets(keys_)
        # Whole runs short of the dead letters wait for their retry as one row each, as a
        # nack's do: a subscriber that died holding a prefetch of 400 leaves one row, not 400.
        partitions = bulk.id_array(sorted({p for _, p, _ in offsets}))
        params = (group_id, models.InFlight.State.DELIVERED.value, now, partitions)
        found = [settle.NamedRun(*row) for row in bulk.run(bulk.for_ids(EXPIRED_RUNS), params)]
        whole = [
            run
            for run in found
            if (run.group_id, run.partition_id, run.subscriber) in offsets
            and not retries.exhausted(group, run.attempt)
        ]
        retries.wait_runs(whole, group, error=DEADLINE_PASSED, delay_ms=None, now=now)
        match = Q()
        for g, p, s in offsets:
            match |= Q(group_id=g, partition_id=p, subscriber=s)
        expired = models.InFlight.objects.filter(
            match, state=models.InFlight.State.DELIVERED, deadline_ms__lt=now
        )
        inflight._split(list(expired.filter(last_offset__gt=F("offset"))))
        rows = list(expired.select_related("partition__topic"))
        by_topic: dict[int, tuple[models.Topic, list[models.InFlight]]] = {}
        for row in rows:
            by_topic.setdefault(row.partition.topic_id, (row.partition.topic, []))[1].append(row)
        for topic, topic_rows in by_topic.values():
            retries.fail(
                topic_rows,
                group,
                topic,
                event="expired",
                error=DEADLINE_PASSED,
                delay_ms=None,
                now=now,
            )
        inflight.recompute_committed(offsets)
    return len(rows) + sum(run.size for run in whole)
