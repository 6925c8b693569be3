import orjson
import pytest

from broker import models
from broker.core import delivery, errors, groups, log, membership
from broker.core.records import NewMessage


def produce(principal, topic, n, partition=None):
    log.append_messages(
        principal, topic, [NewMessage(value=orjson.dumps(i), partition=partition) for i in range(n)]
    )


def offsets_of(result):
    return [(m.partition, m.offset) for m in result.messages]


def test_poll_messages__without_commit_repeats(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 3)
    first = groups.poll_messages(console, "g", topic.name, 10, auto_commit=False)
    again = groups.poll_messages(console, "g", topic.name, 10, auto_commit=False)
    assert offsets_of(first) == offsets_of(again) == [(0, 0), (0, 1), (0, 2)]
    assert first.next_offsets == {0: 3}
    assert not first.committed


def test_poll_messages__auto_commit_moves_on(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 5)
    first = groups.poll_messages(console, "g", topic.name, 2, auto_commit=True)
    second = groups.poll_messages(console, "g", topic.name, 10, auto_commit=True)
    third = groups.poll_messages(console, "g", topic.name, 10, auto_commit=True)
    assert offsets_of(first) == [(0, 0), (0, 1)]
    assert offsets_of(second) == [(0, 2), (0, 3), (0, 4)]
    assert third.messages == ()


def test_poll_messages__spans_partitions(topic_factory, console):
    topic = topic_factory(partitions=3)
    for p in range(3):
        produce(console, topic.name, 2, partition=p)
    seen = []
    for _ in range(3):
        seen += offsets_of(groups.poll_messages(console, "g", topic.name, 2, auto_commit=True))
    assert sorted(seen) == [(p, o) for p in range(3) for o in range(2)]


def test_poll_messages__groups_are_independent(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 2)
    groups.poll_messages(console, "a", topic.name, 10, auto_commit=True)
    assert len(groups.poll_messages(console, "b", topic.name, 10, auto_commit=True).messages) == 2


def test_poll_messages__bad_input(topic_factory, console, key_factory):
    topic = topic_factory()
    with pytest.raises(errors.InvalidRequest):
        groups.poll_messages(console, "bad group", topic.name, 10, auto_commit=False)
    with pytest.raises(errors.InvalidRequest):
        groups.poll_messages(console, "g", topic.name, 0, auto_commit=False)
    with pytest.raises(errors.TopicNotFound):
        groups.poll_messages(console, "g", "nope", 10, auto_commit=False)
    producer, _ = key_factory("produce:*")
    with pytest.raises(errors.PermissionDenied):
        groups.poll_messages(producer, "g", topic.name, 10, auto_commit=False)


def test_poll_messages__behind_retention_moves_to_start(topic_factory, console):
    topic = topic_factory(capacity=2, overflow_policy="drop_oldest")
    groups.commit_offsets(console, "g", topic.name, {0: 0})
    produce(console, topic.name, 5)
    result = groups.poll_messages(console, "g", topic.name, 10, auto_commit=False)
    assert offsets_of(result) == [(0, 3), (0, 4)]
    lag = groups.describe_group(console, "g").topics[0].partitions[0]
    assert (lag.committed_offset, lag.start_offset, lag.lag) == (3, 3, 2)
    # Visible until the group commits past the start offset (DESIGN.md: Retention).
    assert lag.skipped_by_retention == 3
    assert groups.describe_group(console, "g").topics[0].skipped_by_retention == 3
    groups.commit_offsets(console, "g", topic.name, {0: 4})
    assert groups.describe_group(console, "g").topics[0].partitions[0].skipped_by_retention == 0


def test_commit_offsets__then_poll_continues(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 3, partition=0)
    out = groups.commit_offsets(console, "g", topic.name, {0: 2})
    assert (out.partitions[0].committed_offset, out.partitions[0].lag) == (2, 1)
    assert offsets_of(groups.poll_messages(console, "g", topic.name, 10, False)) == [(0, 2)]


def test_commit_offsets__errors_store_nothing(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 3, partition=0)
    with pytest.raises(errors.OffsetOutOfRange):
        groups.commit_offsets(console, "g", topic.name, {0: 1, 1: 1})
    with pytest.raises(errors.PartitionNotFound):
        groups.commit_offsets(console, "g", topic.name, {0: 1, 5: 0})
    with pytest.raises(errors.InvalidRequest):
        groups.commit_offsets(console, "g", topic.name, {})
    assert not models.GroupOffset.objects.exclude(committed_offset=0).exists()


def test_commit_offsets__statements_do_not_grow_with_the_partitions(
    topic_factory, console, django_assert_max_num_queries
):
    """A commit of every partition's offset moves them in one statement and drops what was
    in flight on them in another: 64 partitions cost what 2 do (a commit of a 512-partition
    topic took 0.4 s row by row on SQLite)."""
    topics = {n: topic_factory(partitions=n).name for n in (2, 64)}
    for n, topic in topics.items():
        produce(console, topic, 2 * n)
        membership.join_group(console, "g", topic, f"m{n}")
        delivery.deliver_messages(console, "g", topic, f"m{n}", 1000)
        assert models.InFlight.objects.filter(partition__topic__name=topic).count() == n
    counts = {}
    for n, topic in topics.items():
        with django_assert_max_num_queries(20) as queries:
            out = groups.commit_offsets(console, "g", topic, dict.fromkeys(range(n), 1))
        counts[n] = len(queries)
        assert {(p.committed_offset, p.lag) for p in out.partitions} == {(1, 1)}
        assert not models.InFlight.objects.filter(partition__topic__name=topic).exists()
    assert counts[64] == counts[2]
    # Each row's time of change is stored, as save() stored it.
    row = models.GroupOffset.objects.select_related("partition__topic").get(
        partition__topic__name=topics[64], partition__number=63
    )
    assert row.updated_at > row.partition.topic.created_at


def test_describe_group__lag_and_unknown(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 4, partition=1)
    groups.commit_offsets(console, "g", topic.name, {1: 1})
    info = groups.describe_group(console, "g")
    [t] = info.topics
    assert (t.topic, t.max_offset, t.committed_total, t.end_total, t.lag) == (
        topic.name,
        3,
        1,
        4,
        3,
    )
    with pytest.raises(errors.GroupNotFound):
        groups.describe_group(console, "missing")


def test_list_groups__only_visible_topics(topic_factory, console, key_factory):
    orders = topic_factory(name="orders.eu")
    billing = topic_factory(name="billing")
    groups.commit_offsets(console, "g1", orders.name, {0: 0})
    groups.commit_offsets(console, "g2", billing.name, {0: 0})
    reader, _ = key_factory("consume:orders.*")
    assert [g.name for g in groups.list_groups(reader)] == ["g1"]
    assert [g.name for g in groups.list_groups(console)] == ["g1", "g2"]


def test_overview__topics_and_groups(topic_factory, console):
    topic = topic_factory(capacity=1000)
    produce(console, topic.name, 15)
    groups.poll_messages(console, "spring-group-1", topic.name, 15, auto_commit=True)
    groups.poll_messages(console, "postman-group-1", topic.name, 5, auto_commit=True)
    result = groups.overview(console)
    assert [t.name for t in result.topics] == [topic.name]
    by_group = {g.group: g for g in result.groups}
    assert (by_group["spring-group-1"].max_offset, by_group["spring-group-1"].committed_total) == (
        14,
        15,
    )
    assert by_group["postman-group-1"].lag == 10
    assert by_group["postman-group-1"].capacity == 1000


def test_poll_messages__without_commit_same_messages_across_partitions(topic_factory, console):
    topic = topic_factory(partitions=3)
    for p in range(3):
        produce(console, topic.name, 2, partition=p)
    polls = [
        offsets_of(groups.poll_messages(console, "g", topic.name, 3, auto_commit=False))
        for _ in range(4)
    ]
    assert all(p == polls[0] for p in polls)


def test_reset_offsets__earliest_latest_timestamp_offsets(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 4, partition=0)
    produce(console, topic.name, 2, partition=1)
    models.Message.objects.filter(partition__number=0, offset__lt=2).update(timestamp_ms=1000)
    latest = groups.reset_offsets(console, "g", topic.name, "latest")
    assert [p.committed_offset for p in latest.partitions] == [4, 2]
    assert groups.poll_messages(console, "g", topic.name, 10, False).messages == ()
    earliest = groups.reset_offsets(console, "g", topic.name, "earliest")
    assert [p.committed_offset for p in earliest.partitions] == [0, 0]
    by_time = groups.reset_offsets(console, "g", topic.name, "timestamp", timestamp_ms=2000)
    assert [p.committed_offset for p in by_time.partitions] == [2, 0]
    given = groups.reset_offsets(console, "g", topic.name, "offsets", offsets={1: 1})
    assert [p.committed_offset for p in given.partitions] == [2, 1]


def test_reset_offsets__refused_with_live_members_unless_forced(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 3)
    membership.join_group(console, "g", topic.name, "m")
    with pytest.raises(errors.GroupHasMembers):
        groups.reset_offsets(console, "g", topic.name, "latest")
    assert groups.reset_offsets(console, "g", topic.name, "latest", force=True).lag == 0


def test_reset_offsets__bad_input_changes_nothing(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 3, partition=0)
    groups.commit_offsets(console, "g", topic.name, {0: 1})
    for kwargs in (
        {"to": "middle"},
        {"to": "timestamp"},
        {"to": "offsets"},
        {"to": "offsets", "offsets": {0: 9}},
        {"to": "offsets", "offsets": {0: 0, 7: 0}},
    ):
        with pytest.raises(errors.BrokerError):
            groups.reset_offsets(console, "g", topic.name, **kwargs)
    assert groups.describe_group(console, "g").topics[0].partitions[0].committed_offset == 1


def test_reset_offsets__shift_clamped(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 5, partition=0)
    produce(console, topic.name, 2, partition=1)
    groups.commit_offsets(console, "g", topic.name, {0: 3, 1: 1})
    back = groups.reset_offsets(console, "g", topic.name, "shift", shift_by=-2)
    assert [p.committed_offset for p in back.partitions] == [1, 0]
    ahead = groups.reset_offsets(console, "g", topic.name, "shift", shift_by=3)
    assert [p.committed_offset for p in ahead.partitions] == [4, 2]
    with pytest.raises(errors.InvalidRequest):
        groups.reset_offsets(console, "g", topic.name, "shift")


@pytest.mark.parametrize(
    ("to", "kwargs"),
    [
        ("earliest", {}),
        ("latest", {}),
        ("timestamp", {"timestamp_ms": 2000}),
        ("offsets", {"offsets": {1: 1}}),
        ("shift", {"shift_by": -1}),
        ("shift", {"shift_by": 10}),
    ],
)
def test_preview_reset__matches_reset_and_writes_nothing(topic_factory, console, to, kwargs):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 4, partition=0)
    produce(console, topic.name, 2, partition=1)
    models.Message.objects.filter(partition__number=0, offset__lt=2).update(timestamp_ms=1000)
    groups.commit_offsets(console, "g", topic.name, {0: 3, 1: 1})
    preview = groups.preview_reset(console, "g", topic.name, to, **kwargs)
    assert groups.describe_group(console, "g").topics[0].committed_total == 4
    done = groups.reset_offsets(console, "g", topic.name, to, **kwargs)
    after = {p.partition: p.committed_offset for p in done.partitions}
    assert [(r.partition, r.target) for r in preview] == [
        (r.partition, after[r.partition]) for r in preview
    ]
    assert all(r.delta == r.target - r.current for r in preview)
    if to == "offsets":
        assert [(r.partition, r.current, r.target, r.delta) for r in preview] == [(1, 1, 1, 0)]


def test_preview_reset__new_group_starts_at_start_offset(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 3)
    (row,) = groups.preview_reset(console, "fresh", topic.name, "latest")
    assert (row.current, row.target, row.delta) == (0, 3, 3)
    assert not models.ConsumerGroup.objects.filter(name="fresh").exists()


def test_preview_reset__bad_input(topic_factory, console, key_factory):
    topic = topic_factory()
    cases: list[tuple[str, dict[int, int] | None, type[errors.BrokerError]]] = [
        ("middle", None, errors.InvalidRequest),
        ("offsets", {0: 9}, errors.OffsetOutOfRange),
        ("offsets", {4: 0}, errors.PartitionNotFound),
    ]
    for to, offsets, error in cases:
        with pytest.raises(error):
            groups.preview_reset(console, "g", topic.name, to, offsets=offsets)
    principal, _ = key_factory("produce:*")
    with pytest.raises(errors.PermissionDenied):
        groups.preview_reset(principal, "g", topic.name, "latest")


def test_delete_group__removes_everything(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 3)
    membership.join_group(console, "g", topic.name, "m")
    delivery.deliver_messages(console, "g", topic.name, "m", 2)
    groups.delete_group(console, "g", force=True)
    assert not models.ConsumerGroup.objects.exists()
    for model in (models.GroupOffset, models.InFlight, models.GroupMember, models.PartitionLease):
        assert not model.objects.exists()
    with pytest.raises(errors.GroupNotFound):
        groups.describe_group(console, "g")


def test_delete_group__refused_with_live_members(topic_factory, console):
    topic = topic_factory()
    membership.join_group(console, "g", topic.name, "m")
    with pytest.raises(errors.GroupHasMembers):
        groups.delete_group(console, "g")
    assert models.GroupMember.objects.count() == 1
    # A member past its session timeout is not live.
    models.GroupMember.objects.update(heartbeat_ms=0)
    groups.delete_group(console, "g")
    assert not models.ConsumerGroup.objects.exists()


def test_delete_group__errors(db, console, key_factory):
    with pytest.raises(errors.GroupNotFound):
        groups.delete_group(console, "nope")
    with pytest.raises(errors.InvalidRequest):
        groups.delete_group(console, "bad name")
    principal, _ = key_factory("admin:orders*")
    models.ConsumerGroup.objects.create(name="g")
    with pytest.raises(errors.PermissionDenied):
        groups.delete_group(principal, "g")
    assert models.ConsumerGroup.objects.exists()


def test_describe_group__in_flight_and_retry_waiting_apart(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 4)
    membership.join_group(console, "g", topic.name, "m")
    got = delivery.deliver_messages(console, "g", topic.name, "m", 3)
    delivery.nack_messages(console, "g", [got.deliveries[0].receipt], delay_ms=60_000)
    offsets = groups.describe_group(console, "g").topics[0]
    p = offsets.partitions[0]
    assert (p.in_flight, p.retry_waiting, p.lag) == (2, 1, 4)
    assert (offsets.in_flight, offsets.retry_waiting, offsets.end_total) == (2, 1, 4)


def produce_aged(principal, topic, *ages_ms):
    """One message per age, its timestamp that long ago."""
    now = log.now_ms()
    log.append_messages(
        principal,
        topic,
        [
            NewMessage(value=orjson.dumps(i), timestamp_ms=now - age)
            for i, age in enumerate(ages_ms)
        ],
    )


@pytest.mark.parametrize("auto_commit", [False, True])
def test_poll_messages__ttl_skips_and_dead_letters(topic_factory, console, auto_commit):
    from broker.core import retries

    topic = topic_factory(message_ttl_ms=60_000).name
    # Offsets 0-1 expired, 2 live, 3 expired (an old client timestamp), 4 live.
    produce_aged(console, topic, 120_000, 90_000, 0, 120_000, 0)
    first = groups.poll_messages(console, "g", topic, 10, auto_commit=auto_commit)
    assert offsets_of(first) == [(0, 2), (0, 4)]
    assert (first.expired, first.next_offsets) == (3, {0: 5})
    letters = retries.list_dead_letters(console, "g").items
    assert [(d.offset, d.reason, d.attempts) for d in letters] == [
        (0, "expired", 0),
        (1, "expired", 0),
        (3, "expired", 0),
    ]
    again = groups.poll_messages(console, "g", topic, 10, auto_commit=auto_commit)
    # Recorded once; without a commit the expired lead is passed (committed offset 2).
    assert again.expired == 0
    assert offsets_of(again) == ([] if auto_commit else [(0, 2), (0, 4)])
    assert retries.list_dead_letters(console, "g").total == 3
    assert groups.describe_group(console, "g").topics[0].partitions[0].committed_offset == (
        5 if auto_commit else 2
    )


def test_poll_messages__ttl_only_expired_moves_past(topic_factory, console):
    topic = topic_factory(message_ttl_ms=60_000).name
    produce_aged(console, topic, 120_000, 120_000)
    first = groups.poll_messages(console, "g", topic, 1, auto_commit=False)
    assert (first.messages, first.expired, first.next_offsets) == ((), 2, {0: 2})
    produce(console, topic, 1)
    assert offsets_of(groups.poll_messages(console, "g", topic, 10, auto_commit=False)) == [(0, 2)]


def _commit_everywhere(console, topic_names, group_names):
    for topic_name in topic_names:
        for group_name in group_names:
            groups.commit_offsets(console, group_name, topic_name, {0: 0})


def test_list_groups__filtered_by_permission_in_the_query(
    topic_factory, key_factory, console, django_assert_max_num_queries
):
    for name in ("orders.eu", "orders.us", "billing", "zilling"):
        topic_factory(name)
    _commit_everywhere(console, ["orders.eu", "billing"], ["g1", "g2"])
    _commit_everywhere(console, ["orders.us"], ["g3"])
    _commit_everywhere(console, ["zilling"], ["g4"])
    producer, _ = key_factory("produce:*")
    # A key that sees no group reads no offsets: the permission filter is in the query.
    with django_assert_max_num_queries(0):
        assert groups.list_groups(producer) == []
    reader, _ = key_factory("consume:orders.??")
    assert [g.name for g in groups.list_groups(reader)] == ["g1", "g2", "g3"]
    assert {t.topic for g in groups.list_groups(reader) for t in g.topics} == {
        "orders.eu",
        "orders.us",
    }
    # A character class matches exactly, in Python, after a wider SQL filter.
    classy, _ = key_factory("consume:[bz]illing")
    assert [g.name for g in groups.list_groups(classy)] == ["g1", "g2", "g4"]
    assert [g.name for g in groups.list_groups(classy, limit=2, after="g1")] == ["g2", "g4"]


def test_list_groups__pages_by_name(topic_factory, console, django_assert_max_num_queries):
    topic_factory("orders", partitions=4)
    names = [f"g{n:02}" for n in range(12)]
    _commit_everywhere(console, ["orders"], names)
    seen, after = [], None
    while True:
        # A page's figures are read in a fixed number of queries, whatever the page size.
        with django_assert_max_num_queries(8):
            page = groups.list_groups(console, limit=5, after=after)
        seen += [g.name for g in page]
        if len(page) < 5:
            break
        after = page[-1].name
    assert seen == names
    assert [len(g.topics[0].partitions) for g in groups.list_groups(console, limit=2)] == [4, 4]
    with pytest.raises(errors.InvalidRequest):
        groups.list_groups(console, limit=0)


def test_overview__pages(topic_factory, console):
    for name in ("a", "b", "c"):
        topic_factory(name)
    _commit_everywhere(console, ["a", "b"], ["g1", "g2", "g3"])
    first = groups.overview(console, limit=2)
    assert [t.name for t in first.topics] == ["a", "b"]
    assert [(g.group, g.topic) for g in first.groups] == [
        ("g1", "a"),
        ("g1", "b"),
        ("g2", "a"),
        ("g2", "b"),
    ]
    assert (first.next_topics_after, first.next_groups_after) == ("b", "g2")
    second = groups.overview(console, limit=2, topics_after="b", groups_after="g2")
    assert [t.name for t in second.topics] == ["c"]
    assert [g.group for g in second.groups] == ["g3", "g3"]
    assert (second.next_topics_after, second.next_groups_after) == (None, None)


def test_list_group_totals__the_sums_of_list_group_offsets(topic_factory, console, key_factory):
    topic_factory("orders", partitions=3)
    topic_factory("hidden")
    produce(console, "orders", 9)
    groups.commit_offsets(console, "g", "orders", {0: 1, 1: 2})
    groups.commit_offsets(console, "h", "orders", {2: 3})
    groups.commit_offsets(console, "g", "hidden", {0: 0})
    membership.join_group(console, "w", "orders", member_id="m1")
    delivered = delivery.deliver_messages(console, "w", "orders", "m1", max_messages=2)
    assert len(delivered.deliveries) == 2
    # Broadcast: each member has offsets of its own, one row of totals each.
    groups.configure_group(console, "b", mode="broadcast")
    for member in ("b1", "b2"):
        membership.join_group(console, "b", "orders", member_id=member)
    delivery.deliver_messages(console, "b", "orders", "b1", max_messages=3)
    # The start offset past the committed one counts as the position (retention moved it).
    log.purge_topic(console, "orders", {0: 2})
    reader, _ = key_factory("consume:orders")
    detailed = groups.list_group_offsets(reader)
    totals = groups.list_group_totals(reader)
    assert sorted(totals) == sorted(detailed) == ["b", "g", "h", "w"]
    assert [t.subscriber for t in totals["b"]] == ["b1", "b2"]
    for name, offsets in detailed.items():
        assert [
            (t.topic, t.subscriber, t.committed_total, t.end_total, t.lag, t.in_flight)
            for t in totals[name]
        ] == [
            (t.topic, t.subscriber, t.committed_total, t.end_total, t.lag, t.in_flight)
            for t in offsets
        ]
        assert [t.retry_waiting for t in totals[name]] == [t.retry_waiting for t in offsets]
    assert sum(t.in_flight for t in totals["w"]) == 2
