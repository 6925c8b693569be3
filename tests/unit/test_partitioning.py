import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def _murmur2_by_hand(data: bytes) -> int:
    """Kafka's Utils.murmur2, line by line: the reference the library is held to."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    tail = len(data) - len(data) % 4
    for i in range(0, tail, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & mask
        k = ((k ^ (k >> 24)) * m) & mask
        h = ((h * m) & mask) ^ k
    rest = len(data) % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h = ((h ^ data[tail]) * m) & mask
    h = ((h ^ (h >> 13)) * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@pytest.mark.parametrize("key", KAFKA_MURMUR2)
def test_murmur2_by_hand__matches_kafka(key):
    assert _murmur2_by_hand(key.encode()) == KAFKA_MURMUR2[key]


@given(st.binary(max_size=64))
def test_murmur2__every_length_as_kafka_computes_it(data):
    # Kafka's vectors leave out lengths of 4n + 1; the reference covers every tail.
    assert partitioning.murmur2(data) == _murmur2_by_hand(data)


@given(st.text(max_size=40), st.integers(min_value=1, max_value=64))
def test_partition_for_key__kafka_partition(key, count):
    expected = (_murmur2_by_hand(key.encode()) & 0x7FFFFFFF) % count
    assert partitioning.partition_for_key(key, count) == expected


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
