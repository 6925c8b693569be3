import random
from collections import Counter

import pytest

from broker.core import assignment, errors


def _counts(assigned: dict[int, str]) -> Counter[str]:
    return Counter(assigned.values())


def _assert_balanced(assigned: dict[int, str], members: list[str], partitions: list[int]) -> None:
    assert sorted(assigned) == sorted(set(partitions))
    assert set(assigned.values()) <= set(members)
    base, extra = divmod(len(set(partitions)), len(set(members)))
    counts = _counts(assigned)
    sizes = sorted((counts[member] for member in set(members)), reverse=True)
    assert sizes == [base + 1] * extra + [base] * (len(set(members)) - extra)


def _minimum_moves(previous: dict[int, str], members: list[str], partitions: list[int]) -> int:
    # Each live member keeps at most its quota of what it owned; only n % m members get the
    # larger quota, and it only helps a member that owned more than the floor.
    base, extra = divmod(len(partitions), len(members))
    owned = Counter(previous[p] for p in partitions if previous.get(p) in members)
    keepable = sum(min(count, base) for count in owned.values())
    keepable += min(extra, sum(1 for count in owned.values() if count > base))
    previously_owned = sum(1 for p in partitions if p in previous)
    return previously_owned - keepable


@pytest.mark.parametrize("strategy", assignment.STRATEGIES)
def test_assign__no_members(strategy):
    assert assignment.assign(strategy, [], [0, 1, 2]) == {}


@pytest.mark.parametrize("strategy", assignment.STRATEGIES)
def test_assign__no_partitions(strategy):
    assert assignment.assign(strategy, ["a", "b"], []) == {}


def test_assign__unknown_strategy():
    with pytest.raises(errors.InvalidRequest) as raised:
        assignment.assign("hash", ["a"], [0])
    assert raised.value.detail == {"strategy": "hash"}


def test_assign__unknown_strategy_even_without_members():
    with pytest.raises(errors.InvalidRequest):
        assignment.assign("hash", [], [0])


def test_assign__range_3_members_8_partitions():
    assert assignment.assign("range", ["c", "a", "b"], range(8)) == {
        0: "a", 1: "a", 2: "a",
        3: "b", 4: "b", 5: "b",
        6: "c", 7: "c",
    }  # fmt: skip


def test_assign__range_more_members_than_partitions():
    assert assignment.assign("range", ["d", "c", "b", "a"], [5, 3]) == {3: "a", 5: "b"}


def test_assign__round_robin_3_members_8_partitions():
    assert assignment.assign("round_robin", ["c", "a", "b"], range(8)) == {
        0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c", 6: "a", 7: "b",
    }  # fmt: skip


def test_assign__round_robin_more_members_than_partitions():
    assert assignment.assign("round_robin", ["d", "c", "b", "a"], [7, 2]) == {2: "a", 7: "b"}


@pytest.mark.parametrize("strategy", ["range", "round_robin"])
def test_assign__ignores_previous_for_stateless_strategies(strategy):
    fresh = assignment.assign(strategy, ["a", "b"], range(4))
    assert assignment.assign(strategy, ["a", "b"], range(4), {0: "b", 1: "b"}) == fresh


def test_assign__duplicates_collapse():
    assert assignment.assign("round_robin", ["b", "a", "b"], [1, 0, 1]) == {0: "a", 1: "b"}


def test_assign__sticky_without_previous_is_round_robin():
    members = ["m3", "m1", "m2"]
    assert assignment.assign("sticky", members, range(8)) == assignment.assign(
        "round_robin", members, range(8)
    )


def test_assign__sticky_balanced_and_deterministic():
    members, partitions = ["a", "b", "c"], list(range(8))
    previous = {0: "a", 1: "a", 2: "a", 3: "a", 4: "a", 5: "b"}
    first = assignment.assign("sticky", members, partitions, previous)
    _assert_balanced(first, members, partitions)
    assert assignment.assign("sticky", list(reversed(members)), partitions, previous) == first


def test_assign__sticky_member_joining_moves_minimum():
    previous = assignment.assign("sticky", ["a", "b"], range(6))
    current = assignment.assign("sticky", ["a", "b", "c"], range(6), previous)
    _assert_balanced(current, ["a", "b", "c"], list(range(6)))
    assert assignment.moved(previous, current) == 2
    assert all(previous[p] == owner for p, owner in current.items() if owner != "c")


def test_assign__sticky_member_leaving_moves_only_its_partitions():
    previous = assignment.assign("sticky", ["a", "b", "c"], range(7))
    current = assignment.assign("sticky", ["a", "c"], range(7), previous)
    _assert_balanced(current, ["a", "c"], list(range(7)))
    changed = {p for p in current if current[p] != previous[p]}
    assert changed == {p for p, owner in previous.items() if owner == "b"}
    assert assignment.moved(previous, current) == len(changed)


def test_assign__sticky_partition_growth_moves_nothing():
    previous = {0: "a", 1: "a", 2: "b", 3: "b"}
    current = assignment.assign("sticky", ["a", "b"], range(7), previous)
    _assert_balanced(current, ["a", "b"], list(range(7)))
    assert assignment.moved(previous, current) == 0
    assert {p: current[p] for p in previous} == previous


def test_assign__sticky_previous_owner_gone_is_ignored():
    previous = {0: "gone", 1: "gone", 2: "a", 3: "b"}
    current = assignment.assign("sticky", ["a", "b"], range(4), previous)
    assert current[2] == "a"
    assert current[3] == "b"
    assert {current[0], current[1]} == {"a", "b"}
    assert "gone" not in current.values()


def test_assign__sticky_takes_from_over_quota_owner():
    previous = dict.fromkeys(range(6), "a")
    current = assignment.assign("sticky", ["a", "b"], range(6), previous)
    _assert_balanced(current, ["a", "b"], list(range(6)))
    assert assignment.moved(previous, current) == 3


def test_assign__sticky_random_cases_move_minimum():
    rng = random.Random(20240611)
    for _ in range(500):
        member_count = rng.randint(0, 8)
        members = [f"m{i}" for i in rng.sample(range(12), member_count)]
        partitions = sorted(rng.sample(range(40), rng.randint(0, 32)))
        # Previous owners: some live, some gone, some partitions unowned (new).
        pool = [*members, "gone-1", "gone-2"]
        previous = {p: rng.choice(pool) for p in partitions if rng.random() < 0.8}

        current = assignment.assign("sticky", members, partitions, previous)

        if not members:
            assert current == {}
            continue
        _assert_balanced(current, members, partitions)
        assert assignment.assign("sticky", list(reversed(members)), partitions, previous) == current
        assert assignment.moved(previous, current) == _minimum_moves(previous, members, partitions)
        assert assignment.assign("sticky", members, partitions, current) == current
        base = len(partitions) // len(members)
        owned = Counter(previous[p] for p in partitions if previous.get(p) in members)
        for partition, owner in current.items():
            before = previous.get(partition)
            if before is not None and before != owner:
                assert before not in members or owned[before] > base


def test_moved__counts_owner_changes():
    previous = {0: "a", 1: "a", 2: "b"}
    assert assignment.moved(previous, {0: "a", 1: "b", 2: "c", 3: "a"}) == 2


def test_moved__unowned_before_is_not_moved():
    assert assignment.moved({}, {0: "a", 1: "b"}) == 0
