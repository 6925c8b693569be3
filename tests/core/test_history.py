"""History: sampling, downsampling, series, rates and lag estimates (core/history.py)."""

import pytest

from broker import models
from broker.core import errors, groups, history, log
from broker.core.records import NewMessage


def produce(principal, topic, n, partition=None):
    log.append_messages(
        principal, topic, [NewMessage(value=b"1", partition=partition) for _ in range(n)]
    )


def test_sample_metrics__empty_database(db):
    assert history.sample_metrics() == 0


def test_sample_metrics__topics_and_groups(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 3, partition=0)
    produce(console, topic.name, 2, partition=1)
    models.Message.objects.filter(partition__number=0, offset=1).update(timestamp_ms=1000)
    groups.commit_offsets(console, "g", topic.name, {0: 1, 1: 2})
    assert history.sample_metrics() == 2
    t = models.TopicSample.objects.get()
    assert (t.end_offset_total, t.message_count) == (5, 5)
    assert (
        t.bytes_stored
        == models.Partition.objects.aggregate(n=models.models.Sum("bytes_stored"))["n"]
    )
    assert t.resolution_s == 10
    g = models.GroupSample.objects.get()
    assert (g.committed_total, g.lag, g.in_flight) == (3, 2, 0)
    # Partition 0's oldest unconsumed message (offset 1) is from t=1 s; partition 1 is drained.
    assert g.oldest_age_ms == g.at_ms - 1000
    assert g.partitions == {"0": [1, 3, 2, g.at_ms - 1000], "1": [2, 2, 0, None]}


def test_sample_metrics__broadcast_sums_members(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 4)
    groups.configure_group(console, "b", mode="broadcast")
    group = models.ConsumerGroup.objects.get(name="b")
    partition = models.Partition.objects.get(topic_id=topic.id)
    models.GroupOffset.objects.create(
        group=group, partition=partition, subscriber="m1", committed_offset=1
    )
    models.GroupOffset.objects.create(
        group=group, partition=partition, subscriber="m2", committed_offset=4
    )
    history.sample_metrics()
    g = models.GroupSample.objects.get()
    assert (g.committed_total, g.lag) == (5, 3)
    assert g.partitions["0"][:3] == [5, 4, 3]


def test_sample_metrics__query_count_does_not_grow_with_size(
    topic_factory, console, django_assert_max_num_queries
):
    for i in range(3):
        topic = topic_factory(partitions=4)
        for p in range(4):
            produce(console, topic.name, 5, partition=p)
        for g in range(5):
            groups.commit_offsets(console, f"g{i}-{g}", topic.name, dict.fromkeys(range(4), g))
    # 4 reads, the lookups (one batch), the writes (transaction, liveness, two inserts).
    with django_assert_max_num_queries(10):
        assert history.sample_metrics() == 3 + 15


def sample(topic_id, at_ms, resolution_s=10, end=0):
    return models.TopicSample.objects.create(
        topic_id=topic_id,
        at_ms=at_ms,
        resolution_s=resolution_s,
        end_offset_total=end,
        message_count=0,
        bytes_stored=0,
    )


def test_compact_samples__tiers_and_retention(topic_factory, settings):
    settings.FERRY_SAMPLE_RETENTION_SECONDS = 3 * 24 * 3600
    topic = topic_factory()
    now = log.now_ms()
    minute = 60_000
    recent = [sample(topic.id, now - 10_000 * i) for i in range(6)]  # the last minute: kept raw
    # 90 minutes old, six samples in each of two whole minutes: one kept per minute, the last.
    base = (now - 90 * minute) // minute * minute
    hour_old = [sample(topic.id, base + 10_000 * i) for i in range(12)]
    # A day and 40 minutes old, one a minute for 20 minutes: one kept per ten minutes.
    base10 = (now - 24 * 3600_000 - 40 * minute) // (10 * minute) * (10 * minute)
    day_old = [sample(topic.id, base10 + minute * i, resolution_s=60) for i in range(20)]
    sample(topic.id, now - 4 * 24 * 3600_000)  # past retention
    deleted = history.compact_samples()
    assert deleted == 10 + 18 + 1
    left = {s.id: s.resolution_s for s in models.TopicSample.objects.all()}
    assert all(left[s.id] == 10 for s in recent)
    assert {s.id for s in hour_old} & set(left) == {hour_old[5].id, hour_old[11].id}
    assert left[hour_old[5].id] == 60
    assert {s.id for s in day_old} & set(left) == {day_old[9].id, day_old[19].id}
    assert left[day_old[19].id] == 600
    assert history.compact_samples() == 0


def test_compact_samples__past_the_lookback_stays_raw(topic_factory):
    """Samples a stop longer than the lookback left raw are not read again (retention ends them)."""
    topic = topic_factory()
    old = (log.now_ms() - 3 * 3600_000) // 60_000 * 60_000
    for i in range(3):
        sample(topic.id, old + 10_000 * i)
    assert history.compact_samples() == 0
    assert models.TopicSample.objects.count() == 3


def test_topic_series__in_rate(topic_factory, console):
    topic = topic_factory()
    sample(topic.id, 10_000, end=0)
    sample(topic.id, 20_000, end=50)
    sample(topic.id, 30_000, end=40)  # a fall reads as no traffic
    points = history.topic_series(console, topic.name, 0)
    assert [(p.at_ms, p.in_per_s) for p in points] == [(10_000, None), (20_000, 5.0), (30_000, 0.0)]
    assert [p.at_ms for p in history.topic_series(console, topic.name, 15_000, 25_000)] == [20_000]


def test_topic_series__errors(topic_factory, console, key_factory):
    topic = topic_factory()
    with pytest.raises(errors.TopicNotFound):
        history.topic_series(console, "nope", 0)
    other, _ = key_factory("consume:other")
    with pytest.raises(errors.PermissionDenied):
        history.topic_series(other, topic.name, 0)


def group_sample(group, topic, at_ms, committed, lag, oldest=None):
    return models.GroupSample.objects.create(
        group=group,
        topic_id=topic.id,
        at_ms=at_ms,
        resolution_s=10,
        committed_total=committed,
        lag=lag,
        in_flight=0,
        oldest_age_ms=oldest,
        partitions={},
    )


def test_group_series__out_rate_per_topic(topic_factory, console, key_factory):
    a, b = topic_factory(name="a"), topic_factory(name="b")
    group = models.ConsumerGroup.objects.create(name="g")
    group_sample(group, a, 10_000, 0, 5)
    group_sample(group, b, 10_000, 100, 0)
    group_sample(group, a, 20_000, 20, 3, oldest=4000)
    points = history.group_series(console, "g", None, 0)
    assert [(p.topic, p.out_per_s) for p in points] == [("a", None), ("b", None), ("a", 2.0)]
    assert [p.lag for p in history.group_series(console, "g", "a", 0)] == [5, 3]
    only_b, _ = key_factory("consume:b")
    assert {p.topic for p in history.group_series(only_b, "g", None, 0)} == {"b"}
    with pytest.raises(errors.GroupNotFound):
        history.group_series(console, "nope", None, 0)


def test_rates_and_lag_estimates(topic_factory, console, key_factory):
    topic = topic_factory(name="orders")
    hidden = topic_factory(name="secret")
    group = models.ConsumerGroup.objects.create(name="g")
    now = log.now_ms()
    sample(topic.id, now - 20_000, end=100)
    sample(topic.id, now - 10_000, end=200)
    sample(topic.id, now, end=300)  # 10 in per second
    sample(hidden.id, now, end=1)
    group_sample(group, topic, now - 20_000, 0, 100)
    group_sample(group, topic, now, 300, 0 + 60, oldest=12_000)  # 15 out per second
    group_sample(group, hidden, now, 0, 1)
    result = history.rates(console)
    assert result.in_per_s["orders"] == pytest.approx(10.0)
    assert result.out_per_s[("g", "orders")] == pytest.approx(15.0)
    assert result.in_total_per_s == pytest.approx(10.0)
    estimate = history.lag_estimates(console, "g")["orders"]
    assert estimate.lag == 60
    assert estimate.seconds_behind == 12.0
    assert estimate.drain_rate_per_s == pytest.approx(5.0)
    assert estimate.time_to_drain_s == pytest.approx(12.0)
    assert history.lag_estimates(console, "g")["secret"].time_to_drain_s is None
    limited, _ = key_factory("consume:orders")
    assert set(history.rates(limited).in_per_s) == {"orders"}
    assert set(history.lag_estimates(limited, "g")) == {"orders"}
    with pytest.raises(errors.InvalidRequest):
        history.rates(console, window_ms=0)


def test_lag_estimates__no_lag_drains_in_zero(topic_factory, console):
    topic = topic_factory()
    group = models.ConsumerGroup.objects.create(name="g")
    group_sample(group, topic, log.now_ms(), 5, 0)
    assert history.lag_estimates(console, "g")[topic.name].time_to_drain_s == 0.0
