"""Pure partition assignment for consumer groups: range, round robin, sticky (docs/semantics.md).

The strategies are Kafka's RangeAssignor, RoundRobinAssignor and StickyAssignor for one topic
(RocketMQ's allocate strategies are the same ideas). Members are ordered by id, partitions by
number, so the same input always gives the same assignment in every process.
"""

import heapq
from collections.abc import Callable, Mapping, Sequence

from broker.core import errors

STRATEGIES = ("range", "round_robin", "sticky")
DEFAULT_STRATEGY = "sticky"


def _range(members: list[str], partitions: list[int]) -> dict[int, str]:
    per_member, extra = divmod(len(partitions), len(members))
    assigned: dict[int, str] = {}
    start = 0
    for index, member in enumerate(members):
        length = per_member + (1 if index < extra else 0)
        for partition in partitions[start : start + length]:
            assigned[partition] = member
        start += length
    return assigned


def _round_robin(members: list[str], partitions: list[int]) -> dict[int, str]:
    return {partition: members[i % len(members)] for i, partition in enumerate(partitions)}


def _sticky(
    members: list[str], partitions: list[int], previous: Mapping[int, str]
) -> dict[int, str]:
    live = set(members)
    owned: dict[str, list[int]] = {member: [] for member in members}
    for partition in partitions:
        owner = previous.get(partition)
        if owner in live:
            owned[owner].append(partition)
    base, extra = divmod(len(partitions), len(members))
    # The n % m larger quotas go to the members that previously owned the most: only a member
    # owning more than the floor can keep an extra partition, so this keeps the most in place.
    by_owned = sorted(members, key=lambda member: (-len(owned[member]), member))
    quota = {member: base + (1 if rank < extra else 0) for rank, member in enumerate(by_owned)}

    assigned: dict[int, str] = {}
    for member in members:
        for partition in owned[member][: quota[member]]:
            assigned[partition] = member
    # Unowned partitions, those of members that left, and those over an owner's quota go, in
    # partition order, to the member holding the fewest so far (ties by member id).
    counts = {member: min(len(owned[member]), quota[member]) for member in members}
    below_quota = [(counts[member], member) for member in members if counts[member] < quota[member]]
    heapq.heapify(below_quota)
    for partition in partitions:
        if partition in assigned:
            continue
        count, member = heapq.heappop(below_quota)
        assigned[partition] = member
        if count + 1 < quota[member]:
            heapq.heappush(below_quota, (count + 1, member))
    return dict(sorted(assigned.items()))


_ASSIGNORS: dict[str, Callable[[list[str], list[int], Mapping[int, str]], dict[int, str]]] = {
    "range": lambda members, partitions, _previous: _range(members, partitions),
    "round_robin": lambda members, partitions, _previous: _round_robin(members, partitions),
    "sticky": _sticky,
}


def assign(
    strategy: str,
    members: Sequence[str],
    partitions: Sequence[int],
    previous: Mapping[int, str] | None = None,
) -> dict[int, str]:
    """Partition -> member for the live members; every partition to exactly one member."""
    assignor = _ASSIGNORS.get(strategy)
    if assignor is None:
        raise errors.InvalidRequest(
            f"Unknown assignment strategy {strategy!r}; one of {', '.join(STRATEGIES)}.",
            strategy=strategy,
        )
    live = sorted(set(members))
    if not live:
        return {}
    return assignor(live, sorted(set(partitions)), previous or {})


def moved(previous: Mapping[int, str], current: Mapping[int, str]) -> int:
    """How many partitions in current changed owner (unowned before does not count as moved)."""
    return sum(1 for partition, owner in current.items() if previous.get(partition, owner) != owner)
