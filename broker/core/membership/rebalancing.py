"""Rebalancing: the group lock, and a topic's partition leases reassigned over live members.

See docs/semantics.md#membership and docs/architecture.md#locks. Altering a topic lives here
too: grown partitions are handed out to the groups on the topic in the same transaction.
"""

from typing import Any

from django.db import transaction

from broker import models
from broker.core import assignment, topics
from broker.core.records import Principal, TopicInfo


def locked_group(group_name: str) -> models.ConsumerGroup:
    """The group row, created if new and locked. Caller holds the write transaction."""
    models.ConsumerGroup.objects.get_or_create(name=group_name)
    # Group lock: serializes joins, leaves, expiry, rebalances and member polls of one group.
    # FOR NO KEY UPDATE (here and for every group and partition lock): rows inserted under
    # other locks that reference the group (in-flight runs, dead letters) take KEY SHARE on it
    # when PostgreSQL checks their foreign keys at commit, which FOR UPDATE would block.
    return models.ConsumerGroup.objects.select_for_update(no_key=True).get(name=group_name)


def rebalance(group: models.ConsumerGroup, topic_id: int) -> None:
    """Reassign the topic's partitions over the group's live members on it; bump the generation.

    Caller holds the group lock.
    """
    members = list(
        models.GroupMember.objects.filter(group=group, topic_id=topic_id).values_list(
            "member_id", flat=True
        )
    )
    partitions = dict(
        models.Partition.objects.filter(topic_id=topic_id).values_list("number", "id")
    )
    leases = {
        lease.partition_id: lease
        for lease in models.PartitionLease.objects.filter(
            group=group, partition_id__in=partitions.values()
        )
    }
    number_of = {pid: number for number, pid in partitions.items()}
    previous = {
        number_of[pid]: lease.member_id
        for pid, lease in leases.items()
        if lease.member_id is not None
    }
    if group.mode == models.ConsumerGroup.Mode.BROADCAST:
        # Every member reads every partition from its own offsets: no partition has one holder.
        owners: dict[int, str] = {}
    else:
        owners = assignment.assign(group.strategy, members, sorted(partitions), previous)
    group.generation += 1
    group.save(update_fields=["generation"])
    changed, created = [], []
    for number, pid in partitions.items():
        owner = owners.get(number)
        lease = leases.get(pid)
        if lease is None:
            created.append(
                models.PartitionLease(
                    group=group, partition_id=pid, member_id=owner, generation=group.generation
                )
            )
        else:
            lease.member_id = owner
            lease.generation = group.generation
            changed.append(lease)
    models.PartitionLease.objects.bulk_create(created)
    models.PartitionLease.objects.bulk_update(changed, ["member_id", "generation"])


def rebalance_topic(topic: models.Topic) -> None:
    """Rebalance every group with members on a topic whose partitions grew.

    Caller holds the topic lock (lock order: topic, then group).
    """
    group_ids = set(
        models.GroupMember.objects.filter(topic=topic).values_list("group_id", flat=True)
    )
    for group in (
        models.ConsumerGroup.objects.select_for_update(no_key=True)
        .filter(id__in=group_ids)
        .order_by("id")
    ):
        rebalance(group, topic.id)


def alter_topic(principal: Principal, name: str, **changes: Any) -> TopicInfo:
    """Change a topic's limits or grow its partitions; a field left out keeps its value.

    changes: the keywords of topics.check_alter (partitions, retention_ms, retention_bytes,
    max_message_bytes, capacity, overflow_policy, message_ttl_ms, trace). When the partitions
    grow, every group with members on the topic is rebalanced in the same transaction.
    """
    change = topics.check_alter(principal, name, **changes)
    with transaction.atomic(durable=True):
        topic, grown = topics.alter_in_transaction(change)
        if grown:
            # Lock order topic -> group: the groups on this topic hand out the new partitions.
            rebalance_topic(topic)
    return topics.to_info(topic, list(topic.partitions.order_by("number")))
