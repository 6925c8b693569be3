"""Bounded per-process memos: what a process remembers between calls to spare a lookup or a
database round trip (a topic's row, a group's id, a member's partitions)."""

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

# Topics, groups and members come and go: past this many entries, a memo starts afresh.
KEPT = 10_000


def remember(memo: dict[K, V], key: K, value: V, kept: int = KEPT) -> None:
    """memo[key] = value; a memo that holds `kept` entries is emptied first, which bounds it
    without keeping track of use (what it forgets is looked up again)."""
    if len(memo) >= kept:
        memo.clear()
    memo[key] = value
