"""Offset arithmetic for the `ferry` data source: where reads start and end, how they split.

Pure (docs/pipeline.md#how-it-runs-for-maintainers): offsets are
`{"topic": {"partition": offset}}` with string partition keys, as Spark's checkpoint stores
them (JSON turns integer keys into strings).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ferry_client import PartitionOffsets
from pipeline.options import EARLIEST, LATEST, Offsets, OffsetSpec, OptionError

# Per topic, every partition's start and end offsets (one broker request per topic).
Bounds = Mapping[str, Sequence[PartitionOffsets]]


@dataclass(frozen=True)
class OffsetRange:
    """Offsets start..end (end excluded) of one topic partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.start


def resolve(
    spec: OffsetSpec, bounds: Bounds, *, fallback: str, timestamp_ms: int | None = None
) -> Offsets:
    """Concrete offsets for every partition of every topic in bounds.

    A time wins over the spec (the first offset at or after it); a partition the JSON spec
    leaves out takes `fallback` ("earliest" or "latest"); offsets are clamped to the partition.
    """
    out: Offsets = {}
    for topic, partitions in bounds.items():
        given = spec.get(topic, {}) if isinstance(spec, dict) else {}
        word = spec if isinstance(spec, str) else fallback
        out[topic] = {}
        for p in partitions:
            if timestamp_ms is not None and p.offset_for_timestamp is not None:
                offset = p.offset_for_timestamp
            else:
                wanted = given.get(str(p.partition))
                if wanted is None:
                    wanted = EARLIEST if word == "earliest" else LATEST
                offset = {EARLIEST: p.start_offset, LATEST: p.end_offset}.get(wanted, wanted)
            if offset > p.end_offset:
                raise OptionError(
                    f"Offset {offset} of {topic} partition {p.partition} is past its end "
                    f"offset {p.end_offset}."
                )
            out[topic][str(p.partition)] = offset
    return out


def ranges(start: Offsets, end: Offsets, max_rows: int) -> list[OffsetRange]:
    """The non-empty ranges from start to end, each split into pieces of at most max_rows.

    A partition in end but not in start (new since start) begins at offset 0: the reader
    moves to the partition's start offset if retention has removed the first ones.
    """
    out: list[OffsetRange] = []
    for topic, parts in sorted(end.items()):
        for key, stop in sorted(parts.items(), key=lambda item: int(item[0])):
            offset = start.get(topic, {}).get(key, 0)
            while offset < stop:
                piece_end = min(stop, offset + max_rows)
                out.append(OffsetRange(topic, int(key), offset, piece_end))
                offset = piece_end
    return out


def rows_between(start: Offsets, end: Offsets) -> int:
    return sum(r.rows for r in ranges(start, end, 2**62))


def limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """latest, moved back so that at most max_rows rows lie between start and it.

    The budget is shared in proportion to each partition's lag (floors, then the remainder to
    the most behind), so every partition advances and a lagging one is never starved for long.
    """
    lags = {
        (topic, key): stop - start.get(topic, {}).get(key, 0)
        for topic, parts in latest.items()
        for key, stop in parts.items()
    }
    total = sum(lag for lag in lags.values() if lag > 0)
    if total <= max_rows:
        return {topic: dict(parts) for topic, parts in latest.items()}
    quota = {where: lag * max_rows // total if lag > 0 else 0 for where, lag in lags.items()}
    left = max_rows - sum(quota.values())
    for where in sorted(lags, key=lambda w: (quota[w] > 0, -lags[w])):
        if left <= 0:
            break
        if quota[where] < lags[where]:
            quota[where] += 1
            left -= 1
    return {
        topic: {key: start.get(topic, {}).get(key, 0) + quota[(topic, key)] for key in parts}
        for topic, parts in latest.items()
    }


def cap(latest: Offsets, target: Offsets) -> Offsets:
    """latest, never beyond target (Trigger.AvailableNow: what existed when the run began)."""
    return {
        topic: {
            key: min(stop, target[topic][key])
            for key, stop in parts.items()
            if key in target.get(topic, {})
        }
        for topic, parts in latest.items()
        if topic in target
    }


def merge_new(start: Offsets, latest: Offsets) -> Offsets:
    """start with the partitions that appeared since (they begin at offset 0)."""
    return {
        topic: {key: start.get(topic, {}).get(key, 0) for key in parts}
        for topic, parts in latest.items()
    }
