"""Members in several processes: one holder per partition, each message to one member."""

import threading

import pytest

from broker import models
from broker.core import delivery, groups, keys, log, membership
from broker.core.records import NewMessage
from tests.concurrency.test_offsets import collect, run_threads, start_workers

pytestmark = pytest.mark.django_db(transaction=True)


def test_deliver_messages__auto_ack_members_across_processes_never_share(topic_factory):
    topic = topic_factory(partitions=4)
    log.append_messages(
        keys.CONSOLE, topic.name, [NewMessage(b"1", partition=i % 4) for i in range(400)]
    )
    received: list[tuple[int, ...]] = []
    lock = threading.Lock()

    def member(n):
        member_id = f"thread-{n}"
        membership.join_group(keys.CONSOLE, "g", topic.name, member_id)
        try:
            for _ in range(30):
                result = delivery.deliver_messages(
                    keys.CONSOLE, "g", topic.name, member_id, 5, auto_ack=True
                )
                # Every partition a member reads is one its lease names, at that moment.
                with lock:
                    received.extend(
                        (d.message.partition, d.message.offset) for d in result.deliveries
                    )
        finally:
            membership.leave_group(keys.CONSOLE, "g", member_id)

    procs = start_workers(
        ("member", topic.name, "g", "proc-1", "30", "auto_ack=1"),
        ("member", topic.name, "g", "proc-2", "30", "auto_ack=1"),
    )
    try:
        run_threads(member, 2)
    finally:
        received += [(p, o) for out in collect(procs) for p, o, *_ in out]
    # Members come and go (rebalancing each time) yet no message reached two of them.
    assert len(received) == len(set(received))
    # Auto-acked: nothing stays in flight and the group's offsets are past what was delivered.
    assert not models.InFlight.objects.exists()
    leftover = groups.poll_messages(keys.CONSOLE, "g", topic.name, 1000, auto_commit=True)
    assert len(received) + len(leftover.messages) == 400
    assert not models.GroupMember.objects.exists()


def test_rebalance__one_lease_row_per_partition_under_concurrent_joins(topic_factory):
    topic = topic_factory(partitions=5)

    def join(n):
        for i in range(5):
            membership.join_group(keys.CONSOLE, "g", topic.name, f"m{n}-{i}")

    run_threads(join, 4)
    leases = models.PartitionLease.objects.filter(group__name="g")
    assert leases.count() == 5
    owners = [lease.member_id for lease in leases]
    assert None not in owners
    # 20 members, 5 partitions: five members hold one each, nobody holds two.
    assert len(set(owners)) == 5
