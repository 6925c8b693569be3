"""The client's copy of the broker's key hash, which only routes (ferry_client/partitioner.py)."""

import random

from broker.core import partitioning
from ferry_client.partitioner import Partitions, partition_for_key
from ferry_client.records import Message


def test_partition_for_key__the_brokers_partition_for_every_key_and_count():
    rng = random.Random(7)
    keys = ["", "a", "é", "日本", "k" * 1024]
    keys += [
        "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(1, 40)))
        for _ in range(2000)
    ]
    for count in (1, 2, 3, 4, 7, 16, 100):
        for key in keys:
            assert partition_for_key(key, count) == partitioning.partition_for_key(key, count)


def test_partitions__read_when_keyed_and_due_and_again_after_max_age():
    partitions = Partitions(max_age_s=60)
    keyed, plain, placed = [Message(1, key="a")], [Message(1)], [Message(1, key="a", partition=0)]
    assert partitions.to_read("t", keyed, now=0)
    assert not partitions.to_read("t", plain, now=0)
    assert not partitions.to_read("t", placed, now=0)
    partitions.read("t", 4, now=0)
    assert not partitions.to_read("t", keyed, now=59.9)
    assert partitions.to_read("t", keyed, now=60)
    assert partitions.route("t", keyed) == partition_for_key("a", 4)
    assert partitions.route("t", plain) is None
    assert partitions.route("other", keyed) is None
