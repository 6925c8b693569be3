"""Messages this process appended lately, kept in memory for the deliveries that follow them.

A subscriber that keeps up with its producers is handed what was just appended. Kept here, a
delivery of those messages reads no rows: on PostgreSQL the read leaves the round trip that
locks the member's offsets (it was that call's largest statement, a third of the server's time
in a batch consumer's ack and push), and no row is loaded (docs/benchmarks.md, session 31).
A delivery of anything else reads the database as before: another process's appends, a
consumer catching up on old messages, anything this process forgot.

Why what is served is what the database holds:
- a stored message never changes: the log only loses a prefix of a partition (retention,
  purge, capacity move start_offset up) or a whole partition with its topic, and partition ids
  are never reused (PostgreSQL's sequences, SQLite's AUTOINCREMENT);
- messages are kept once their transaction commits (transaction.on_commit), never before;
- messages are served only to a delivery that locked the partition's offsets row and read
  its start and next offsets in the same transaction, from a position no lower than the start
  and none at or past the next offset. A partition's kept messages are one run of contiguous
  offsets, so from the position on they are what is stored; what the run does not hold is
  read from the database;
- a partition's messages are kept with its topic's created_at and served only to that topic,
  so that another database under the same process (a test's fresh one) never sees them;
- on PostgreSQL, a message with headers is not kept: the database gives their JSON back in
  its own form (jsonb), which the edges send as is.

FERRY_MESSAGE_CACHE_MB bounds the memory (0: nothing is kept). Past it, the partition appended
to longest ago loses the older half of what it holds.

The append's rows are kept as they are, and a delivery makes its StoredMessages from them
(docs/decisions/0024-recent-messages-kept-in-memory.md says why: the garbage collector).
"""

import datetime
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.signals import setting_changed
from django.db import transaction
from django.dispatch import receiver

from broker import settings as ferry_settings
from broker.core import bulk
from broker.core.records import StoredMessage

# What a kept message costs beyond its value, key, tag and ids: the tuple, the objects, the list.
_OVERHEAD_BYTES = 300

# A partition that holds fewer than this many messages is forgotten whole when memory runs out.
_SMALLEST_HALF = 64


@dataclass
class _Kept:
    """One partition's appended rows (log.MESSAGE_COLUMNS), offsets first to first + len - 1.

    The rows as the append made them, plain tuples of numbers, strings and bytes: the garbage
    collector stops tracking such a tuple at its first collection, where it would walk every
    kept StoredMessage (a tuple's subclass) at each full collection, and the cost of those
    grows with what is kept. take makes the messages."""

    stamp: datetime.datetime
    number: int
    first: int
    rows: list[tuple[Any, ...]]
    size: int

    @property
    def end(self) -> int:
        return self.first + len(self.rows)


_lock = threading.Lock()
# By partition id, the partition appended to longest ago first.
_kept: "OrderedDict[int, _Kept]" = OrderedDict()
_size = 0
# Deliveries' reads (take): answered from memory, and those that read the database.
_answered = {"kept": 0, "read": 0}


def budget_bytes() -> int:
    return int(ferry_settings.get("MESSAGE_CACHE_MB") * 1024 * 1024)


def keep_on_commit(
    stamp: datetime.datetime, numbers: dict[int, int], rows: Sequence[tuple[Any, ...]]
) -> None:
    """Keep appended message rows (log.MESSAGE_COLUMNS) once their transaction commits.

    stamp: the topic's created_at; numbers: partition id -> partition number. Caller holds the
    appending transaction."""
    if budget_bytes() <= 0:
        return
    transaction.on_commit(lambda: _keep(stamp, numbers, rows))


def _keep(
    stamp: datetime.datetime, numbers: dict[int, int], rows: Sequence[tuple[Any, ...]]
) -> None:
    global _size
    # Made before the lock is taken: a delivery on the event loop may be waiting for it.
    runs = [(pid, _run(stamp, numbers[pid], part)) for pid, part in _parts(rows)]
    budget = budget_bytes()
    with _lock:
        for pid, run in runs:
            kept = _kept.get(pid)
            if kept is not None and kept.stamp == stamp and kept.end == run.first:
                kept.rows += run.rows
                kept.size += run.size
            else:
                if kept is not None:
                    _forget(pid)
                _kept[pid] = run
            _size += run.size
            _kept.move_to_end(pid)
        while _size > budget and _kept:
            _shed()


def _parts(rows: Sequence[tuple[Any, ...]]) -> list[tuple[int, Sequence[tuple[Any, ...]]]]:
    """The rows as runs of contiguous offsets, by partition id. An append gives each partition's
    messages offsets one after the other, so each partition's rows are one run, unless a row
    is left out: on PostgreSQL, one with headers (the database gives them back as jsonb
    renders them, the rows hold them as sent), which ends its partition's run."""
    if not rows:
        return []
    drop_headers = bulk.vendor() == "postgresql"
    pid = rows[0][0]
    if all(row[0] == pid for row in rows) and not (
        drop_headers and any(row[5] != "{}" for row in rows)
    ):
        return [(pid, rows)]  # one partition, nothing left out: the common batch
    parts: list[tuple[int, Sequence[tuple[Any, ...]]]] = []
    open_parts: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        if drop_headers and row[5] != "{}":
            open_parts.pop(row[0], None)
            continue
        part = open_parts.get(row[0])
        if part is None:
            part = open_parts[row[0]] = []
            parts.append((row[0], part))
        part.append(row)
    return parts


def _run(stamp: datetime.datetime, number: int, rows: Sequence[tuple[Any, ...]]) -> _Kept:
    return _Kept(stamp, number, rows[0][1], list(rows), _cost(rows))


def _cost(rows: Sequence[tuple[Any, ...]]) -> int:
    """What rows cost against the budget: their size_bytes (value, key, headers) and the rest."""
    sizes: list[int] = [row[8] for row in rows]
    return sum(sizes) + _OVERHEAD_BYTES * len(rows)


def _forget(pid: int) -> None:
    """Caller holds _lock."""
    global _size
    _size -= _kept.pop(pid).size


def _shed() -> None:
    """The older half of the messages of the partition appended to longest ago, or all of them
    when it holds few. Caller holds _lock."""
    global _size
    pid, kept = next(iter(_kept.items()))
    if len(kept.rows) < _SMALLEST_HALF:
        _forget(pid)
        return
    half = len(kept.rows) // 2
    shed = _cost(kept.rows[:half])
    del kept.rows[:half]
    kept.first += half
    kept.size -= shed
    _size -= shed


def kept_end(partition_id: int, start: int) -> int | None:
    """Where the partition's kept messages end, when message start is among them (None when
    it is not): a hint for a read ahead, taken without the lock."""
    kept = _kept.get(partition_id)
    if kept is None or not kept.first <= start < kept.end:
        return None
    return kept.end


def take(
    partition_id: int, stamp: datetime.datetime, start: int, stop: int
) -> list[StoredMessage] | None:
    """The kept messages of the partition of the topic created at stamp from offset start
    (the first of them) up to stop - 1 at most; None when start is not kept. The caller read
    start and stop under the partition's offsets lock, in this transaction (the partition's
    start_offset <= start < stop <= its next_offset): offsets are contiguous, so what is kept
    from start on is what is stored."""
    with _lock:
        kept = _kept.get(partition_id)
        if kept is None or kept.stamp != stamp or not kept.first <= start < kept.end:
            _answered["read"] += 1
            return None
        _answered["kept"] += 1
        rows = kept.rows[start - kept.first : min(stop, kept.end) - kept.first]
        number = kept.number
    make = StoredMessage._make  # the tuple as is: a third of the cost of StoredMessage(...)
    return [
        make((number, o, ts, k, t, h, v if type(v) is bytes else bytes(v), j, c))
        for _, o, ts, k, t, h, v, j, _, c in rows
    ]


def kept_bytes() -> int:
    """What the kept messages cost, as counted against FERRY_MESSAGE_CACHE_MB."""
    return _size


def reads() -> dict[str, int]:
    """Deliveries' reads since the process started: "kept" (from memory), "read" (not)."""
    with _lock:
        return dict(_answered)


def clear() -> None:
    global _size
    with _lock:
        _kept.clear()
        _size = 0


@receiver(setting_changed)
def _databases_changed(*, setting: str, **kwargs: object) -> None:
    if setting == "DATABASES":
        clear()
