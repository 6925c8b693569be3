import pytest

from broker.core import partitioning

# Kafka's own vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
KAFKA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2.items())
def test_murmur2__matches_kafka(key, expected):
    assert partitioning.murmur2(key.encode()) == expected


def test_partition_for_key__stable_and_in_range():
    seen = {partitioning.partition_for_key(f"user-{i}", 7) for i in range(200)}
    assert seen == set(range(7))
    assert partitioning.partition_for_key("user-42", 7) == partitioning.partition_for_key(
        "user-42", 7
    )


def test_partition_for_key__kafka_value():
    # toPositive(-790332482) % 3 == 1357151166 % 3
    assert partitioning.partition_for_key("foobar", 3) == (-790332482 & 0x7FFFFFFF) % 3


def test_choose_partitions__explicit_wins_over_key():
    assert partitioning.choose_partitions(4, 1, [(3, "foobar"), (None, "foobar")]) == [
        3,
        partitioning.partition_for_key("foobar", 4),
    ]


def test_choose_partitions__round_robin_without_key():
    rr = partitioning.choose_partitions(3, 999_001, [(None, None)] * 6)
    assert rr == [rr[0], (rr[0] + 1) % 3, (rr[0] + 2) % 3] * 2
    later = partitioning.choose_partitions(3, 999_001, [(None, None)] * 3)
    assert sorted(later) == [0, 1, 2]


def test_choose_partitions__round_robin_continues_across_batches():
    first = partitioning.choose_partitions(4, 999_002, [(None, None)])
    second = partitioning.choose_partitions(4, 999_002, [(None, None)])
    assert second == [(first[0] + 1) % 4]


def test_choose_partitions__single_partition():
    assert partitioning.choose_partitions(1, 5, [(None, "k"), (None, None), (0, None)]) == [0, 0, 0]
