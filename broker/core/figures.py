"""Current figures of the whole broker in a few grouped queries: what /metrics exports.

See docs/metrics.md. Reads only, no transaction: each figure is exact for its query, and a lag is
computed from group offsets read before end offsets, so it is never negative.
"""

from collections import Counter, defaultdict

from django.db.models import Count, F, Sum

from broker import models
from broker.core import keys, log
from broker.core.records import (
    BrokerFigures,
    GroupPartitionFigures,
    PartitionFigures,
    Principal,
)

ALIVE_WITHIN_MS = 30_000


def read_figures(principal: Principal) -> BrokerFigures:
    """Sizes, positions, lag, in flight, dead letters and schedules of the topics principal may
    consume, and the processes alive."""
    offsets = list(
        models.GroupOffset.objects.values_list("group__name", "partition_id", "committed_offset")
    )
    in_flight: dict[tuple[str, int, str], int] = {
        (g, p, state): int(n)
        for g, p, state, n in models.InFlight.objects.values("group__name", "partition_id", "state")
        .annotate(n=Sum(F("last_offset") - F("offset") + 1))
        .values_list("group__name", "partition_id", "state", "n")
    }
    partitions = {
        pid: (topic, number, start, end, size)
        for pid, topic, number, start, end, size in models.Partition.objects.filter(
            topic__deleting_since_ms__isnull=True
        )
        .order_by("topic__name", "number")
        .values_list("id", "topic__name", "number", "start_offset", "next_offset", "bytes_stored")
        if keys.allows(principal, topic, "consume")
    }
    positions: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for group, pid, committed in offsets:
        if pid not in partitions:
            continue
        _, _, start, end, _ = partitions[pid]
        position = max(committed, start)
        totals = positions[(group, pid)]
        totals[0] += position
        totals[1] += end - position
    groups = tuple(
        GroupPartitionFigures(
            group=group,
            topic=partitions[pid][0],
            partition=partitions[pid][1],
            committed_offset=committed,
            lag=lag,
            in_flight=in_flight.get((group, pid, models.InFlight.State.DELIVERED), 0),
            retry_waiting=in_flight.get((group, pid, models.InFlight.State.RETRY_WAIT), 0),
        )
        for (group, pid), (committed, lag) in sorted(
            positions.items(), key=lambda item: (item[0][0], partitions[item[0][1]][:2])
        )
    )
    dead_letters = {
        (g, t): n
        for g, t, n in models.DeadLetter.objects.values("group__name", "topic__name")
        .annotate(n=Count("id"))
        .values_list("group__name", "topic__name", "n")
        if keys.allows(principal, t, "consume")
    }
    scheduled = {
        t: n
        for t, n in models.ScheduledMessage.objects.values("topic__name")
        .annotate(n=Count("id"))
        .values_list("topic__name", "n")
        if keys.allows(principal, t, "consume")
    }
    alive = Counter(
        models.BrokerProcess.objects.filter(
            heartbeat_ms__gte=log.now_ms() - ALIVE_WITHIN_MS
        ).values_list("kind", flat=True)
    )
    return BrokerFigures(
        partitions=tuple(PartitionFigures(*row) for row in partitions.values()),
        groups=groups,
        dead_letters=dead_letters,
        scheduled=scheduled,
        processes_alive=dict(alive),
    )
