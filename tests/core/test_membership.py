import orjson
import pytest

from broker import models
from broker.core import delivery, errors, groups, log, membership
from broker.core.records import NewMessage


def produce(console, topic, per_partition, partitions):
    log.append_messages(
        console,
        topic,
        [
            NewMessage(orjson.dumps([p, i]), partition=p)
            for p in range(partitions)
            for i in range(per_partition)
        ],
    )


def test_join_group__one_member_holds_everything(topic_factory, console):
    topic = topic_factory(partitions=3)
    info = membership.join_group(console, "g", topic.name, "m1")
    assert (info.member_id, info.partitions, info.generation) == ("m1", (0, 1, 2), 1)
    assert info.session_timeout_ms == 45_000
    assert info.heartbeat_interval_ms == 3000


def test_join_group__sticky_moves_the_minimum(topic_factory, console):
    topic = topic_factory(partitions=6)
    membership.join_group(console, "g", topic.name, "a")
    membership.join_group(console, "g", topic.name, "b")
    before = {m.member_id: m.partitions for m in groups.describe_group(console, "g").members}
    membership.join_group(console, "g", topic.name, "c")
    after = {m.member_id: m.partitions for m in groups.describe_group(console, "g").members}
    assert sorted(p for ps in after.values() for p in ps) == list(range(6))
    assert all(len(ps) == 2 for ps in after.values())
    # Only the new member's two partitions changed hands.
    assert set(after["a"]) <= set(before["a"])
    assert set(after["b"]) <= set(before["b"])


def test_join_group__generated_id_and_bad_input(topic_factory, console, key_factory):
    topic = topic_factory()
    assert len(membership.join_group(console, "g", topic.name).member_id) == 32
    with pytest.raises(errors.InvalidRequest):
        membership.join_group(console, "g", topic.name, "bad id")
    with pytest.raises(errors.TopicNotFound):
        membership.join_group(console, "g", "missing", "m")
    producer, _ = key_factory("produce:*")
    with pytest.raises(errors.PermissionDenied):
        membership.join_group(producer, "g", topic.name, "m")


def test_heartbeat__returns_assignment_then_member_not_found_after_leave(topic_factory, console):
    topic = topic_factory(partitions=2)
    membership.join_group(console, "g", topic.name, "a")
    membership.join_group(console, "g", topic.name, "b")
    beat = membership.heartbeat(console, "g", "a")
    assert (len(beat.partitions), beat.generation) == (1, 2)
    membership.leave_group(console, "g", "b")
    assert membership.heartbeat(console, "g", "a").partitions == (0, 1)
    with pytest.raises(errors.MemberNotFound):
        membership.heartbeat(console, "g", "b")
    with pytest.raises(errors.MemberNotFound):
        membership.leave_group(console, "g", "b")


def test_expire_members__silent_member_removed_and_rebalanced(topic_factory, console):
    topic = topic_factory(partitions=2)
    membership.join_group(console, "g", topic.name, "a")
    membership.join_group(console, "g", topic.name, "b")
    models.GroupMember.objects.filter(member_id="b").update(heartbeat_ms=0)
    assert membership.expire_members() == 1
    assert membership.heartbeat(console, "g", "a").partitions == (0, 1)
    assert membership.expire_members() == 0


def test_alter_topic__growth_rebalances(topic_factory, console):
    topic = topic_factory(partitions=2)
    membership.join_group(console, "g", topic.name, "a")
    membership.join_group(console, "g", topic.name, "b")
    membership.alter_topic(console, topic.name, partitions=4)
    members = groups.describe_group(console, "g").members
    assert sorted(p for m in members for p in m.partitions) == [0, 1, 2, 3]
    assert [len(m.partitions) for m in members] == [2, 2]


def test_deliver_messages__member_reads_only_its_partitions(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 3, 2)
    a = membership.join_group(console, "g", topic.name, "a")
    b = membership.join_group(console, "g", topic.name, "b")
    got_a = delivery.deliver_messages(console, "g", topic.name, "a", 10, auto_ack=True)
    got_b = delivery.deliver_messages(console, "g", topic.name, "b", 10, auto_ack=True)
    assert {d.message.partition for d in got_a.deliveries} == set(
        membership.heartbeat(console, "g", "a").partitions
    )
    assert {d.message.partition for d in got_b.deliveries} | {
        d.message.partition for d in got_a.deliveries
    } == {0, 1}
    assert len(got_a.deliveries) + len(got_b.deliveries) == 6
    assert a.member_id != b.member_id


def test_deliver_messages__unknown_member_or_other_topic(topic_factory, console):
    topic = topic_factory()
    other = topic_factory()
    membership.join_group(console, "g", topic.name, "a")
    with pytest.raises(errors.MemberNotFound):
        delivery.deliver_messages(console, "g", topic.name, "nobody", 10, auto_ack=True)
    with pytest.raises(errors.InvalidRequest):
        delivery.deliver_messages(console, "g", other.name, "a", 10, auto_ack=True)


def test_deliver_messages__counts_as_heartbeat(topic_factory, console):
    topic = topic_factory()
    membership.join_group(console, "g", topic.name, "a")
    models.GroupMember.objects.update(heartbeat_ms=1)
    delivery.deliver_messages(console, "g", topic.name, "a", 10, auto_ack=False)
    assert membership.expire_members() == 0


def test_join_group__member_id_of_another_topic_is_refused(topic_factory, console):
    first = topic_factory(partitions=2)
    second = topic_factory(partitions=2)
    membership.join_group(console, "g", first.name, "a")
    with pytest.raises(errors.MemberIdTaken) as taken:
        membership.join_group(console, "g", second.name, "a")
    assert taken.value.detail == {"group": "g", "member_id": "a"}
    leases = dict(models.PartitionLease.objects.values_list("partition__topic__name", "member_id"))
    assert leases == {first.name: "a"}


def test_join_group__switch_topic_after_leaving_rebalances_both(topic_factory, console):
    first = topic_factory(partitions=2)
    second = topic_factory(partitions=2)
    membership.join_group(console, "g", first.name, "a")
    membership.leave_group(console, "g", "a")
    membership.join_group(console, "g", second.name, "a")
    leases = dict(models.PartitionLease.objects.values_list("partition__topic__name", "member_id"))
    assert leases[second.name] == "a"
    assert leases.get(first.name) is None


def test_list_groups__members_and_generation(topic_factory, console):
    topic = topic_factory(partitions=2)
    membership.join_group(console, "g", topic.name, "a")
    [info] = groups.list_groups(console)
    assert (info.generation, [m.member_id for m in info.members]) == (1, ["a"])


def test_configure_group__strategy_rebalances_and_timeout(topic_factory, console, key_factory):
    topic = topic_factory(partitions=4)
    membership.join_group(console, "g", topic.name, "a")
    membership.join_group(console, "g", topic.name, "b")
    info = groups.configure_group(console, "g", strategy="range", session_timeout_ms=5000)
    assert (info.strategy, info.generation) == ("range", 3)
    assert {m.member_id: m.partitions for m in info.members} == {"a": (0, 1), "b": (2, 3)}
    models.GroupMember.objects.filter(member_id="b").update(heartbeat_ms=log.now_ms() - 6000)
    assert membership.expire_members() == 1


def test_configure_group__checks(topic_factory, console, key_factory):
    topic_factory()
    with pytest.raises(errors.InvalidRequest):
        groups.configure_group(console, "g", strategy="random")
    with pytest.raises(errors.InvalidRequest):
        groups.configure_group(console, "g", session_timeout_ms=10)
    limited, _ = key_factory("admin:orders.*")
    with pytest.raises(errors.PermissionDenied):
        groups.configure_group(limited, "g", strategy="range")


def test_join_group__client_and_host_shown_with_the_member(topic_factory, console):
    topic = topic_factory().name
    membership.join_group(
        console, "g", topic, "m1", client="billing-worker-3", host="rest 10.0.0.7"
    )
    [member] = groups.describe_group(console, "g").members
    assert (member.client, member.host) == ("billing-worker-3", "rest 10.0.0.7")
    # A rejoin says who it is now.
    membership.join_group(console, "g", topic, "m1", client="billing-worker-4")
    [member] = groups.describe_group(console, "g").members
    assert (member.client, member.host) == ("billing-worker-4", "")


def test_join_group__client_name_is_bounded(topic_factory, console):
    topic = topic_factory().name
    with pytest.raises(errors.InvalidRequest):
        membership.join_group(console, "g", topic, "m1", client="x" * 101)
    assert not models.GroupMember.objects.exists()
