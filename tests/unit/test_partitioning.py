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


def test_choose_partition__explicit_wins_over_key():
    assert partitioning.choose_partition(4, 1, 3, "foobar") == 3


def test_choose_partition__round_robin_without_key():
    rr = [partitioning.choose_partition(3, 999_001, None, None) for _ in range(6)]
    assert sorted(rr) == [0, 0, 1, 1, 2, 2]
    assert rr[:3] == [rr[0], (rr[0] + 1) % 3, (rr[0] + 2) % 3]
