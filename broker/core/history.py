"""History: samples of topics and groups, downsampled as they age; series, rates, lag estimates.

See docs/architecture.md#history and docs/metrics.md. sample_metrics and compact_samples are
jobs of core/periodic.py. Sampling reads without a transaction (group offsets first, then end
offsets, so a lag is never negative) and writes all its rows in one.
"""

from collections import defaultdict
from collections.abc import Iterable

from django.db import transaction
from django.db.models import F, Max, Q, Sum

from broker import models
from broker import settings as ferry_settings
from broker.core import errors, keys, log, membership
from broker.core.records import GroupPoint, LagEstimate, Principal, Rates, TopicPoint

SECOND_MS = 1000
HOUR_MS = 3600 * SECOND_MS
DAY_MS = 24 * HOUR_MS
# (age after which samples are downsampled, bucket seconds): raw for the last hour, one a
# minute for the last day, one per ten minutes after that. Each bucket keeps its last sample.
TIERS = ((HOUR_MS, 60), (DAY_MS, 600))
# How far before a tier's cut compact_samples looks: it runs every minute, so an hour covers a
# stop of an hour; samples a longer stop left raw stay raw until the retention deletes them.
# Bounded so that each round reads an hour of samples through the at_ms index, not the table.
LOOKBACK_MS = HOUR_MS
# Pairs (partition, offset) looked up per query for the oldest unconsumed messages' timestamps:
# two parameters each, well under SQLite's 32,766.
LOOKUP_BATCH = 500
# The most points a series returns (the oldest are left out past it).
MAX_POINTS = 10_000


def sample_metrics() -> int:
    """Store one TopicSample per topic and one GroupSample per group and topic; returns how many.

    Broadcast groups have offsets per member: their samples are the sums over members (lag,
    committed, in flight) and the oldest unconsumed message over members.
    """
    now = log.now_ms()
    resolution_s = max(1, round(float(ferry_settings.get("SAMPLE_INTERVAL_SECONDS"))))
    # Group offsets before end offsets: a message appended in between can only raise the lag.
    offsets = list(
        models.GroupOffset.objects.values_list(
            "group_id", "partition_id", "subscriber", "committed_offset"
        )
    )
    in_flight = {
        (g, p): int(n)
        for g, p, n in models.InFlight.objects.values("group_id", "partition_id")
        .annotate(n=Sum(F("last_offset") - F("offset") + 1))
        .values_list("group_id", "partition_id", "n")
    }
    partitions = {
        pid: (topic_id, number, start, end, size)
        for pid, topic_id, number, start, end, size in models.Partition.objects.values_list(
            "id", "topic_id", "number", "start_offset", "next_offset", "bytes_stored"
        )
    }
    topic_totals: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    for topic_id, _, start, end, size in partitions.values():
        totals = topic_totals[topic_id]
        totals[0] += end
        totals[1] += end - start
        totals[2] += size
    # Per (group, partition): [committed sum, lag sum, positions with lag] (positions: one per
    # broadcast member; the offset each has not consumed yet).
    positions: dict[tuple[int, int], tuple[int, int, list[int]]] = {}
    for group_id, pid, _, committed in offsets:
        if pid not in partitions:
            continue
        _, _, start, end, _ = partitions[pid]
        # A group behind retention reads from the start offset (as groups.describe_group says).
        position = max(committed, start)
        c_sum, lag_sum, pending = positions.get((group_id, pid), (0, 0, []))
        if position < end:
            pending.append(position)
        positions[(group_id, pid)] = (c_sum + position, lag_sum + end - position, pending)
    timestamps = _timestamps({(pid, o) for (_, pid), (_, _, ps) in positions.items() for o in ps})
    by_group_topic: dict[tuple[int, int], dict[str, list[int | None]]] = defaultdict(dict)
    for (group_id, pid), (c_sum, lag_sum, pending) in positions.items():
        topic_id, number, _, end, _ = partitions[pid]
        ages = [now - timestamps[(pid, o)] for o in pending if (pid, o) in timestamps]
        oldest = max(ages, default=None)
        by_group_topic[(group_id, topic_id)][str(number)] = [
            c_sum,
            end,
            lag_sum,
            None if oldest is None else max(0, oldest),
            in_flight.get((group_id, pid), 0),
        ]
    topic_rows = [
        models.TopicSample(
            topic_id=topic_id,
            at_ms=now,
            resolution_s=resolution_s,
            end_offset_total=end_total,
            message_count=count,
            bytes_stored=size,
        )
        for topic_id, (end_total, count, size) in topic_totals.items()
    ]
    group_rows = []
    for (group_id, topic_id), parts in by_group_topic.items():
        ages = [p[3] for p in parts.values() if p[3] is not None]
        group_rows.append(
            models.GroupSample(
                group_id=group_id,
                topic_id=topic_id,
                at_ms=now,
                resolution_s=resolution_s,
                committed_total=sum(int(p[0] or 0) for p in parts.values()),
                lag=sum(int(p[2] or 0) for p in parts.values()),
                in_flight=sum(int(p[4] or 0) for p in parts.values()),
                oldest_age_ms=max(ages, default=None),
                # {"<n>": [committed, end, lag, oldest_age_ms]} as the model documents.
                partitions={n: p[:4] for n, p in sorted(parts.items(), key=lambda i: int(i[0]))},
            )
        )
    with transaction.atomic(durable=True):
        # A topic or group deleted since the reads above takes its rows with it: skip them.
        live_topics = set(models.Topic.objects.values_list("id", flat=True))
        live_groups = set(models.ConsumerGroup.objects.values_list("id", flat=True))
        topic_rows = [r for r in topic_rows if r.topic_id in live_topics]
        group_rows = [
            r for r in group_rows if r.topic_id in live_topics and r.group_id in live_groups
        ]
        models.TopicSample.objects.bulk_create(topic_rows, batch_size=500)
        models.GroupSample.objects.bulk_create(group_rows, batch_size=500)
    return len(topic_rows) + len(group_rows)


def _timestamps(pairs: set[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """timestamp_ms of the messages at these (partition id, offset) pairs, a batch per query."""
    found: dict[tuple[int, int], int] = {}
    ordered = sorted(pairs)
    for i in range(0, len(ordered), LOOKUP_BATCH):
        condition = Q()
        for pid, offset in ordered[i : i + LOOKUP_BATCH]:
            condition |= Q(partition_id=pid, offset=offset)
        for pid, offset, ts in models.Message.objects.filter(condition).values_list(
            "partition_id", "offset", "timestamp_ms"
        ):
            found[(pid, offset)] = ts
    return found


def compact_samples() -> int:
    """Downsample aging samples (keep each bucket's last) and delete those past retention.

    Returns how many samples it deleted.
    """
    now = log.now_ms()
    retention_ms = int(ferry_settings.get("SAMPLE_RETENTION_SECONDS")) * SECOND_MS
    deleted = 0
    with transaction.atomic(durable=True):
        for model, key in (
            (models.TopicSample, ("topic_id",)),
            (models.GroupSample, ("group_id", "topic_id")),
        ):
            for age_ms, bucket_s in TIERS:
                deleted += _downsample(model, key, now - age_ms, bucket_s)
            count, _ = model.objects.filter(at_ms__lt=now - retention_ms).delete()
            deleted += count
    return deleted


def _downsample(
    model: type[models.TopicSample] | type[models.GroupSample],
    key: tuple[str, ...],
    older_than_ms: int,
    bucket_s: int,
) -> int:
    """Keep the last sample of each bucket wholly before older_than_ms; caller is atomic."""
    bucket_ms = bucket_s * SECOND_MS
    # Only buckets wholly before the cut: a bucket is compacted once, with all its samples.
    cut = older_than_ms // bucket_ms * bucket_ms
    finer = model.objects.filter(
        at_ms__gte=cut - LOOKBACK_MS, at_ms__lt=cut, resolution_s__lt=bucket_s
    )
    keep = (
        finer.annotate(bucket=F("at_ms") / bucket_ms)
        .values(*key, "bucket")
        .annotate(keep=Max("id"))
        .values("keep")
    )
    keep_ids = list(keep)
    count, _ = finer.exclude(id__in=[row["keep"] for row in keep_ids]).delete()
    finer.update(resolution_s=bucket_s)
    return int(count)


def _per_second(delta: int, ms: int) -> float | None:
    # Counters only grow; a fall (offsets reset, a member left) reads as no traffic.
    return max(0.0, delta * SECOND_MS / ms) if ms > 0 else None


def _window(since_ms: int, until_ms: int | None) -> Q:
    window = Q(at_ms__gte=since_ms)
    if until_ms is not None:
        window &= Q(at_ms__lte=until_ms)
    return window


def topic_series(
    principal: Principal, topic_name: str, since_ms: int, until_ms: int | None = None
) -> tuple[TopicPoint, ...]:
    """A topic's samples between since_ms and until_ms, oldest first, with the in rate."""
    keys.require(principal, topic_name, "consume")
    topic = models.Topic.objects.filter(name=topic_name).values_list("id", flat=True).first()
    if topic is None:
        raise errors.TopicNotFound(name=topic_name)
    rows = list(
        models.TopicSample.objects.filter(_window(since_ms, until_ms), topic_id=topic)
        .order_by("-at_ms", "-id")
        .values_list("at_ms", "end_offset_total", "message_count", "bytes_stored", "resolution_s")[
            :MAX_POINTS
        ]
    )
    rows.reverse()
    points: list[TopicPoint] = []
    previous: tuple[int, int] | None = None
    for at_ms, end_total, count, size, resolution_s in rows:
        rate: float | None = (
            None if previous is None else _per_second(end_total - previous[1], at_ms - previous[0])
        )
        points.append(TopicPoint(at_ms, end_total, count, size, rate, resolution_s))
        previous = (at_ms, end_total)
    return tuple(points)


def group_series(
    principal: Principal,
    group_name: str,
    topic_name: str | None,
    since_ms: int,
    until_ms: int | None = None,
) -> tuple[GroupPoint, ...]:
    """A group's samples per topic it reads (or one topic), oldest first, with the out rate."""
    group_id = _group_id(group_name)
    rows = models.GroupSample.objects.filter(_window(since_ms, until_ms), group_id=group_id)
    if topic_name is not None:
        keys.require(principal, topic_name, "consume")
        rows = rows.filter(topic__name=topic_name)
    fetched = list(
        rows.order_by("-at_ms", "-id").values_list(
            "at_ms",
            "topic__name",
            "lag",
            "committed_total",
            "oldest_age_ms",
            "in_flight",
            "resolution_s",
        )[:MAX_POINTS]
    )
    fetched.reverse()
    points: list[GroupPoint] = []
    previous: dict[str, tuple[int, int]] = {}
    for at_ms, topic, lag, committed, oldest, in_flight, resolution_s in fetched:
        if not keys.allows(principal, topic, "consume"):
            continue
        before = previous.get(topic)
        rate = None if before is None else _per_second(committed - before[1], at_ms - before[0])
        points.append(
            GroupPoint(at_ms, topic, lag, committed, rate, oldest, in_flight, resolution_s)
        )
        previous[topic] = (at_ms, committed)
    return tuple(points)


def _group_id(group_name: str) -> int:
    membership.validate_group_name(group_name)
    group_id = (
        models.ConsumerGroup.objects.filter(name=group_name).values_list("id", flat=True).first()
    )
    if group_id is None:
        raise errors.GroupNotFound(group=group_name)
    return group_id


def _rates_of(rows: Iterable[tuple[object, int, int]], window_ms: int) -> dict[object, float]:
    """Per key, the counter's rate from the newest sample back to the oldest within window_ms.

    rows are (key, at_ms, counter) newest first.
    """
    newest: dict[object, tuple[int, int]] = {}
    oldest: dict[object, tuple[int, int]] = {}
    for key, at_ms, counter in rows:
        if key not in newest:
            newest[key] = (at_ms, counter)
        elif newest[key][0] - at_ms <= window_ms:
            oldest[key] = (at_ms, counter)
    rates = {}
    for key, (at_ms, counter) in newest.items():
        first = oldest.get(key)
        rate = None if first is None else _per_second(counter - first[1], at_ms - first[0])
        rates[key] = rate or 0.0
    return rates


def _recent(window_ms: int) -> int:
    # The window, plus two sampling intervals so a window shorter than one still has two samples.
    interval_ms = int(float(ferry_settings.get("SAMPLE_INTERVAL_SECONDS")) * SECOND_MS)
    return log.now_ms() - window_ms - 2 * interval_ms


def rates(principal: Principal, window_ms: int = 60_000) -> Rates:
    """Messages in per second per topic and out per (group, topic), over the newest samples."""
    if window_ms <= 0:
        raise errors.InvalidRequest("window_ms must be positive.", window_ms=window_ms)
    since = _recent(window_ms)
    topic_rows = (
        models.TopicSample.objects.filter(at_ms__gte=since)
        .order_by("topic_id", "-at_ms", "-id")
        .values_list("topic__name", "at_ms", "end_offset_total")
    )
    group_rows = (
        models.GroupSample.objects.filter(at_ms__gte=since)
        .order_by("group_id", "topic_id", "-at_ms", "-id")
        .values_list("group__name", "topic__name", "at_ms", "committed_total")
    )
    in_rates = _rates_of(topic_rows, window_ms)
    out_rates = _rates_of((((g, t), at, c) for g, t, at, c in group_rows), window_ms)
    return Rates(
        window_ms=window_ms,
        in_per_s={
            str(t): r for t, r in in_rates.items() if keys.allows(principal, str(t), "consume")
        },
        out_per_s={
            k: r
            for k, r in out_rates.items()
            if isinstance(k, tuple) and keys.allows(principal, k[1], "consume")
        },
    )


def lag_estimates(
    principal: Principal, group_name: str, window_ms: int = 60_000
) -> dict[str, LagEstimate]:
    """Per topic the group reads: its lag, seconds behind and time to drain at current rates."""
    group_id = _group_id(group_name)
    since = _recent(window_ms)
    group_rows = list(
        models.GroupSample.objects.filter(group_id=group_id, at_ms__gte=since)
        .order_by("topic_id", "-at_ms", "-id")
        .values_list("topic_id", "topic__name", "at_ms", "committed_total", "lag", "oldest_age_ms")
    )
    visible = {t for _, t, *_ in group_rows if keys.allows(principal, t, "consume")}
    topic_ids = {tid for tid, t, *_ in group_rows if t in visible}
    topic_rows = (
        models.TopicSample.objects.filter(topic_id__in=topic_ids, at_ms__gte=since)
        .order_by("topic_id", "-at_ms", "-id")
        .values_list("topic__name", "at_ms", "end_offset_total")
    )
    in_rates = _rates_of(topic_rows, window_ms)
    out_rates = _rates_of(((t, at, c) for _, t, at, c, _, _ in group_rows), window_ms)
    estimates: dict[str, LagEstimate] = {}
    for _, topic, at_ms, _, lag, oldest in group_rows:
        if topic in estimates or topic not in visible:
            continue
        drain = out_rates.get(topic, 0.0) - in_rates.get(topic, 0.0)
        if lag == 0:
            to_drain: float | None = 0.0
        else:
            to_drain = lag / drain if drain > 0 else None
        estimates[topic] = LagEstimate(
            topic=topic,
            lag=lag,
            seconds_behind=None if oldest is None else oldest / SECOND_MS,
            drain_rate_per_s=drain,
            time_to_drain_s=to_drain,
            at_ms=at_ms,
        )
    return estimates
