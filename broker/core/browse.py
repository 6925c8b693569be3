"""The message browser's reads: pages, lookups, bounded scans, exports (architecture.md#browse).

Read-only, with the topic's "consume" permission. Every query is bounded: pages read offset
ranges of at most `limit` rows per partition (offsets are contiguous, so a range bounds the
rows), key and client-id lookups use the partial indexes on (partition, key) and
(partition, client_id), and tag and header searches scan newest first at most `scan_limit`
messages and say how many they scanned.
"""

import base64
import math
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from broker import models
from broker.core import errors, keys, log, topics
from broker.core.records import BrowsedMessage, BrowsePage, Principal, SearchResult

MAX_LIMIT = 500
MAX_SCAN_LIMIT = 1_000_000
MAX_EXPORT_LIMIT = 1_000_000
EXPORT_CHUNK = 1000
# Every read is of one partition, whose number the caller has: joining the partition table
# for it made SQLite (without ANALYZE statistics) walk the partition by its offset index
# instead of using the key or id index, 60 ms instead of 0.5 ms at 100,000 messages.
_FIELDS = (
    "offset",
    "timestamp_ms",
    "key",
    "tag",
    "headers",
    "value",
    "is_json",
    "client_id",
    "size_bytes",
)


def _topic(principal: Principal, topic_name: str) -> models.Topic:
    topics.validate_name(topic_name)
    keys.require(principal, topic_name, "consume")
    topic = models.Topic.objects.filter(name=topic_name).first()
    if topic is None:
        raise errors.TopicNotFound(name=topic_name)
    return topic


def _partitions(topic: models.Topic, partition: int | None) -> list[models.Partition]:
    rows = topic.partitions.order_by("number")
    if partition is not None:
        rows = rows.filter(number=partition)
    found = list(rows)
    if not found:
        raise errors.PartitionNotFound(topic=topic.name, partition=partition)
    return found


def _check_limit(name: str, value: int, most: int) -> None:
    if not 1 <= value <= most:
        raise errors.InvalidRequest(f"{name} must be between 1 and {most}.", **{name: value})


def _message(number: int, row: tuple[Any, ...]) -> BrowsedMessage:
    offset, ts, key, tag, headers, value, is_json, client_id, size = row
    return BrowsedMessage(
        partition=number,
        offset=offset,
        timestamp_ms=ts,
        key=key,
        tag=tag,
        headers=headers or {},
        value=bytes(value),
        is_json=bool(is_json),
        client_id=client_id,
        size_bytes=size,
    )


def _range(p: models.Partition, low: int, high: int, newest_first: bool) -> list[BrowsedMessage]:
    """Stored messages of p with low <= offset < high: at most high - low rows."""
    order = "-offset" if newest_first else "offset"
    rows = (
        models.Message.objects.filter(partition_id=p.id, offset__gte=low, offset__lt=high)
        .order_by(order)
        .values_list(*_FIELDS)
    )
    return [_message(p.number, row) for row in rows]


# Cursors: "n" (newest first) or "o" (oldest first), then "partition:offset" pairs. For "n" the
# offset is the exclusive upper bound still to read below; for "o" the next offset to read.


def _encode(newest_first: bool, positions: dict[int, int]) -> str:
    pairs = ",".join(f"{n}:{o}" for n, o in sorted(positions.items()))
    return ("n" if newest_first else "o") + pairs


def _decode(cursor: str) -> tuple[bool, dict[int, int]]:
    try:
        direction, body = cursor[0], cursor[1:]
        if direction not in "no":
            raise ValueError(direction)
        positions = {}
        for pair in body.split(","):
            number, offset = pair.split(":")
            positions[int(number)] = int(offset)
        return direction == "n", positions
    except (ValueError, IndexError):
        raise errors.InvalidRequest("The cursor is not one a browse page returned.") from None


def browse_messages(
    principal: Principal,
    topic_name: str,
    *,
    partition: int | None = None,
    offset: int | None = None,
    timestamp_ms: int | None = None,
    newest_first: bool = True,
    limit: int = 50,
    cursor: str | None = None,
) -> BrowsePage:
    """A page of a topic's messages: newest first across partitions (by timestamp), or in one
    partition from an offset, or from a timestamp (forward when not newest_first).

    offset needs a partition and is included; timestamp_ms starts at the first message at or
    after it (oldest first) or at the last one at or before it (newest first). A cursor from a
    page continues from there (and overrides the other arguments but limit). Reads at most
    limit messages per partition.
    """
    topic = _topic(principal, topic_name)
    _check_limit("limit", limit, MAX_LIMIT)
    if offset is not None and partition is None and cursor is None:
        raise errors.InvalidRequest("Browsing from an offset needs a partition.")
    if cursor is not None:
        newest_first, positions = _decode(cursor)
        by_number = {p.number: p for p in _partitions(topic, None)}
        rows = [by_number[n] for n in sorted(positions) if n in by_number]
    else:
        rows = _partitions(topic, partition)
        positions = {}
        for p in rows:
            if offset is not None:
                positions[p.number] = offset + 1 if newest_first else offset
            elif timestamp_ms is not None:
                at = log.offset_for_timestamp(p, timestamp_ms + (1 if newest_first else 0))
                positions[p.number] = at
            else:
                positions[p.number] = p.next_offset if newest_first else p.start_offset
    found: list[BrowsedMessage] = []
    for p in rows:
        position = min(max(positions[p.number], p.start_offset), p.next_offset)
        positions[p.number] = position
        if newest_first:
            found += _range(p, max(p.start_offset, position - limit), position, True)
        else:
            found += _range(p, position, min(p.next_offset, position + limit), False)
    found.sort(key=lambda m: (m.timestamp_ms, m.partition, m.offset), reverse=newest_first)
    page = found[:limit]
    after = dict(positions)
    before = dict(positions)
    for m in page:
        if newest_first:
            after[m.partition] = min(after[m.partition], m.offset)
        else:
            after[m.partition] = max(after[m.partition], m.offset + 1)
    by_number = {p.number: p for p in rows}
    more = any(
        (after[n] > by_number[n].start_offset) if newest_first else (after[n] < p.next_offset)
        for n, p in by_number.items()
    )
    # The page before, read the other way: from just past where this page started.
    back = any(
        (before[n] < p.next_offset) if newest_first else (before[n] > p.start_offset)
        for n, p in by_number.items()
    )
    return BrowsePage(
        items=tuple(page),
        next_cursor=_encode(newest_first, after) if more else None,
        prev_cursor=_encode(not newest_first, before) if back else None,
    )


def get_message(
    principal: Principal, topic_name: str, partition: int, offset: int
) -> BrowsedMessage:
    """One stored message; MessageNotFound when retention or a purge removed it, or not yet."""
    topic = _topic(principal, topic_name)
    (p,) = _partitions(topic, partition)
    row = (
        models.Message.objects.filter(partition_id=p.id, offset=offset)
        .values_list(*_FIELDS)
        .first()
    )
    if row is None:
        raise errors.MessageNotFound(topic=topic_name, partition=partition, offset=offset)
    return _message(p.number, row)


def search_messages(
    principal: Principal,
    topic_name: str,
    *,
    key: str | None = None,
    client_id: str | None = None,
    tag: str | None = None,
    header: tuple[str, str] | None = None,
    partition: int | None = None,
    limit: int = 50,
    scan_limit: int = 10_000,
) -> SearchResult:
    """Messages matching every given condition, newest first.

    key and client_id are index lookups (indexed=True, nothing scanned); tag and header alone
    scan newest first at most scan_limit messages over the partitions, and say how many they
    scanned and whether they reached the start of every partition (complete).
    """
    topic = _topic(principal, topic_name)
    _check_limit("limit", limit, MAX_LIMIT)
    _check_limit("scan_limit", scan_limit, MAX_SCAN_LIMIT)
    if key is None and client_id is None and tag is None and header is None:
        raise errors.InvalidRequest("Search by at least one of key, id, tag and header.")
    rows = _partitions(topic, partition)
    if key is not None or client_id is not None:
        return _indexed_search(rows, key, client_id, tag, header, limit)
    return _scan(rows, tag, header, limit, scan_limit)


def _matches_header(header: tuple[str, str] | None) -> Callable[[BrowsedMessage], bool]:
    if header is None:
        return lambda m: True
    name, value = header
    return lambda m: m.headers.get(name) == value


def _indexed_search(
    rows: list[models.Partition],
    key: str | None,
    client_id: str | None,
    tag: str | None,
    header: tuple[str, str] | None,
    limit: int,
) -> SearchResult:
    matches = _matches_header(header)
    found: list[BrowsedMessage] = []
    for p in rows:
        # One partition at a time, so each query is an index range on (partition, key|id).
        query = models.Message.objects.filter(partition_id=p.id)
        if key is not None:
            query = query.filter(key=key)
        if client_id is not None:
            query = query.filter(client_id=client_id)
        if tag is not None:
            query = query.filter(tag=tag)
        candidates = [
            _message(p.number, r) for r in query.order_by("-offset").values_list(*_FIELDS)[:limit]
        ]
        found += [m for m in candidates if matches(m)]
    found.sort(key=lambda m: (m.timestamp_ms, m.partition, m.offset), reverse=True)
    return SearchResult(items=tuple(found[:limit]), scanned=0, complete=True, indexed=True)


def _scan(
    rows: list[models.Partition],
    tag: str | None,
    header: tuple[str, str] | None,
    limit: int,
    scan_limit: int,
) -> SearchResult:
    matches = _matches_header(header)
    budget = math.ceil(scan_limit / len(rows))
    found: list[BrowsedMessage] = []
    scanned = 0
    complete = True
    for p in rows:
        high = p.next_offset
        low_bound = max(p.start_offset, p.next_offset - budget)
        hits: list[BrowsedMessage] = []
        while high > low_bound and len(hits) < limit:
            low = max(low_bound, high - EXPORT_CHUNK)
            query = models.Message.objects.filter(
                partition_id=p.id, offset__gte=low, offset__lt=high
            )
            if tag is not None:
                query = query.filter(tag=tag)
            chunk = [_message(p.number, r) for r in query.order_by("-offset").values_list(*_FIELDS)]
            for m in chunk:
                if matches(m) and len(hits) < limit:
                    hits.append(m)
                    if len(hits) == limit:
                        # Counted up to the last match: the rest of the chunk was not needed.
                        low = m.offset
            scanned += high - low
            high = low
        if high > p.start_offset:
            complete = False
        found += hits
    found.sort(key=lambda m: (m.timestamp_ms, m.partition, m.offset), reverse=True)
    return SearchResult(
        items=tuple(found[:limit]), scanned=scanned, complete=complete, indexed=False
    )


def export_line(m: BrowsedMessage) -> bytes:
    """One message as a JSON line: value as JSON when it is, else base64 in value_b64."""
    out: dict[str, Any] = {
        "partition": m.partition,
        "offset": m.offset,
        "timestamp_ms": m.timestamp_ms,
        "key": m.key,
        "tag": m.tag,
        "headers": m.headers,
        "id": m.client_id,
    }
    if m.is_json:
        out["value"] = orjson.Fragment(m.value)
    else:
        out["value_b64"] = base64.b64encode(m.value).decode()
    return orjson.dumps(out) + b"\n"


def export_messages(
    principal: Principal,
    topic_name: str,
    *,
    partition: int | None = None,
    from_offset: int | None = None,
    to_offset: int | None = None,
    key: str | None = None,
    client_id: str | None = None,
    tag: str | None = None,
    limit: int = 100_000,
) -> Iterator[bytes]:
    """A range or a search's messages as JSON lines, oldest first, partition by partition.

    Checks permission and arguments at once, then reads EXPORT_CHUNK rows per query while the
    caller iterates (a streamed download); from_offset and to_offset (exclusive) need a partition
    unless they apply to every one.
    """
    topic = _topic(principal, topic_name)
    _check_limit("limit", limit, MAX_EXPORT_LIMIT)
    if from_offset is not None and to_offset is not None and to_offset < from_offset:
        raise errors.InvalidRequest("to_offset is before from_offset.")
    rows = _partitions(topic, partition)
    return _export(rows, from_offset, to_offset, key, client_id, tag, limit)


def _export(
    rows: list[models.Partition],
    from_offset: int | None,
    to_offset: int | None,
    key: str | None,
    client_id: str | None,
    tag: str | None,
    limit: int,
) -> Iterator[bytes]:
    left = limit
    for p in rows:
        position = max(p.start_offset, from_offset or 0)
        end = p.next_offset if to_offset is None else min(p.next_offset, to_offset)
        while position < end and left > 0:
            query = models.Message.objects.filter(partition_id=p.id, offset__gte=position)
            if to_offset is not None:
                query = query.filter(offset__lt=end)
            if key is not None:
                query = query.filter(key=key)
            if client_id is not None:
                query = query.filter(client_id=client_id)
            if tag is not None:
                query = query.filter(tag=tag)
            if key is None and client_id is None and tag is None:
                # Plain ranges: the offset range alone bounds the rows read.
                query = query.filter(offset__lt=position + EXPORT_CHUNK)
            chunk = list(query.order_by("offset").values_list(*_FIELDS)[: min(EXPORT_CHUNK, left)])
            if not chunk:
                break
            for row in chunk:
                yield export_line(_message(p.number, row))
            left -= len(chunk)
            position = chunk[-1][0] + 1
