"""In-flight runs and receipts: split runs, read their messages, lock offsets, commit offsets.

See docs/architecture.md#in-flight-by-runs and docs/architecture.md#locks.
"""

import functools
import itertools
import operator
import re
import secrets
from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

import orjson
from django.db import connection
from django.utils import timezone

from broker import models
from broker.core import bulk, events
from broker.core.records import StoredMessage

OffsetKey = tuple[int, int, str]  # (group id, partition id, subscriber)
IN_FLIGHT_COLUMNS = (
    "group_id",
    "partition_id",
    "subscriber",
    "offset",
    "last_offset",
    "state",
    "member_id",
    "token",
    "attempt",
    "deadline_ms",
    "last_error",
)


def new_token() -> str:
    """A random token for one delivery batch; receipt() adds where each message is."""
    return secrets.token_hex(8)


def receipt(token: str, partition_id: int, offset: int) -> str:
    return f"{receipt_prefix(token, partition_id)}{offset:x}"


def receipt_prefix(token: str, partition_id: int) -> str:
    """What receipt() puts before the offset, for a run of messages of one partition."""
    return f"{token}.{partition_id:x}."


# One match for the whole receipt. The answers for the last few thousand are kept: callers
# that take receipts one at a time may ask again (a settlement parses its whole list at once,
# parse_receipts).
_RECEIPT_TEXT = r"([0-9a-f]{1,16})\.([0-9a-f]{1,16})\.([0-9a-f]{1,16})"
_RECEIPT = re.compile(_RECEIPT_TEXT)
RECEIPT_PATTERN_MAX = 50  # the longest string _RECEIPT can match


def _parse_receipt(text: str) -> tuple[str, int, int] | None:
    """(token, partition id, offset) of a receipt, or None for a string that is not one."""
    if len(text) > RECEIPT_PATTERN_MAX:
        return None
    return _parse_short(text)


@functools.lru_cache(maxsize=8192)
def _parse_short(text: str) -> tuple[str, int, int] | None:
    found = _RECEIPT.fullmatch(text)
    if found is None:
        return None
    return _numbers(*found.groups())


# A list of receipts checked and taken apart in two calls into the regex engine, not one each.
_RECEIPT_LINES = re.compile(f"(?:{_RECEIPT_TEXT}\n)*")
_RECEIPT_LINE = re.compile(f"{_RECEIPT_TEXT}\n")


def parse_receipts(receipts: list[str]) -> list[tuple[str, int, int] | None]:
    """_parse_receipt of each receipt (None for a string that is not one), for a whole ack."""
    joined = "\n".join(receipts) + "\n"
    if _RECEIPT_LINES.fullmatch(joined):
        parts = _RECEIPT_LINE.findall(joined)
        # As many as receipts: none of them held a line break of its own.
        if len(parts) == len(receipts):
            return [_numbers(token, partition, offset) for token, partition, offset in parts]
    return [_parse_receipt(text) for text in receipts]


class ReceiptGroup(NamedTuple):
    """Receipts of one delivery token in one partition: what can name one run's messages."""

    token: str
    partition_id: int
    offsets: list[int]  # ascending
    texts: list[str]  # the receipts, in their offsets' order


def group_receipts(receipts: list[str]) -> tuple[list[ReceiptGroup], list[str]]:
    """The receipts by token and partition, each group in offset order; and the strings among
    them that are not receipts (parse_receipts' None), in their order."""
    one = _one_group(receipts)
    if one is not None:
        return [one], []
    by_prefix: dict[tuple[str, int], list[tuple[int, str]]] = {}
    malformed = []
    for text, where in zip(receipts, parse_receipts(receipts), strict=True):
        if where is None:
            malformed.append(text)
        else:
            by_prefix.setdefault(where[:2], []).append((where[2], text))
    groups = []
    for (token, partition_id), pairs in by_prefix.items():
        pairs.sort()
        offsets, texts = zip(*pairs, strict=True)
        groups.append(ReceiptGroup(token, partition_id, list(offsets), list(texts)))
    return groups, malformed


# The offsets of one group's receipts, a line each, checked in one regex call. Up to 15 hex
# digits: past 63 bits cannot be, and a longer offset is left to the receipt-by-receipt path.
_OFFSET_LINES = re.compile(r"[0-9a-f]{1,15}(?:\n[0-9a-f]{1,15})*")


def _one_group(receipts: list[str]) -> ReceiptGroup | None:
    """group_receipts of receipts of one token and partition, all well formed (a batch
    consumer's ack of a delivery's run): checked and read without a Python step per receipt
    (a regex match and a tuple each cost as much as the rest of an ack's own Python). None for
    any other list: group_receipts then takes the receipts one by one."""
    if len(receipts) < 2:
        return None
    first = _parse_receipt(receipts[0])
    if first is None:
        return None
    lines = "\n" + "\n".join(receipts)
    start = "\n" + receipts[0][: receipts[0].rindex(".") + 1]
    # Each receipt a line of its own (none held a line break), each line with the prefix.
    if lines.count("\n") != len(receipts) or lines.count(start) != len(receipts):
        return None
    tails = lines.replace(start, "\n")[1:]
    if not _OFFSET_LINES.fullmatch(tails):
        return None
    offsets = list(map(int, tails.split("\n"), itertools.repeat(16)))
    texts = receipts
    if not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
        pairs = sorted(zip(offsets, receipts, strict=True))
        offsets, texts = [o for o, _ in pairs], [t for _, t in pairs]
    return ReceiptGroup(first[0], first[1], offsets, list(texts))


def _numbers(token: str, partition: str, offset: str) -> tuple[str, int, int] | None:
    partition_id, where = int(partition, 16), int(offset, 16)
    # Numbers past 63 bits cannot name a row (and would overflow the query).
    if partition_id >= 2**63 or where >= 2**63:
        return None
    return token, partition_id, where


class Run(Protocol):
    """What a piece of a run copies of it: an InFlight row's fields, or a settlement's
    reading of them."""

    @property
    def id(self) -> int: ...
    @property
    def group_id(self) -> int: ...
    @property
    def partition_id(self) -> int: ...
    @property
    def subscriber(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def member_id(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def deadline_ms(self) -> int: ...
    @property
    def last_error(self) -> str: ...


def piece(r: Run, first: int, last: int) -> tuple[object, ...]:
    """The columns of a piece [first, last] of a run, its other fields unchanged."""
    return (
        r.group_id,
        r.partition_id,
        r.subscriber,
        first,
        last,
        r.state,
        r.member_id,
        r.token,
        r.attempt,
        r.deadline_ms,
        r.last_error,
    )


def _split(rows: Iterable[models.InFlight]) -> None:
    """Split runs into one row per offset. Caller holds the locks.

    The slower paths (runs out of attempts, ordered mode's retries, a due run with a message
    gone or past its TTL) work on single messages; the runs they touch are split first. A
    settlement of part of a run carves out what it names (carve), an ack leaves runs
    (insert_rest), and a due run goes out again whole or by its front
    (docs/architecture.md#in-flight-by-runs).
    """
    carve([(r, set(range(r.offset, r.last_offset + 1))) for r in rows if r.last_offset > r.offset])


def carve(runs: Iterable[tuple[Run, set[int]]]) -> None:
    """Make each named offset of these runs a row of its own, for a settlement that works on
    single messages (a nack, reject, release or extend of part of a run): each run is deleted
    and put back as those rows and, between them, runs of what is left (as insert_rest leaves
    it). A nack of one message of a batch of 100 writes three rows, not 100. Caller holds the
    locks."""
    runs = list(runs)
    if not runs:
        return
    models.InFlight.objects.filter(id__in=[run.id for run, _ in runs]).delete()
    named = [piece(run, offset, offset) for run, offsets in runs for offset in sorted(offsets)]
    bulk.insert_rows("broker_inflight", IN_FLIGHT_COLUMNS, named + _rest(runs))


def insert_rest(runs: Iterable[tuple[Run, set[int]]]) -> None:
    """Put back what is left of runs an ack settled part of, each (run, the offsets settled),
    after the caller deleted them: the offsets between those settled, as runs of their own
    with the run's token (their receipts still name them) and its other fields.

    Not one row per offset, as _split leaves: a subscriber whose prefetch holds several ack
    batches settles the first part of a run at a time, and a row per offset left made its
    database writes per message (docs/architecture.md#in-flight-by-runs).
    """
    bulk.insert_rows("broker_inflight", IN_FLIGHT_COLUMNS, _rest(runs))


def _rest(runs: Iterable[tuple[Run, set[int]]]) -> list[tuple[object, ...]]:
    """The pieces of each run between the offsets given, and after the last."""
    rows = []
    for run, settled in runs:
        start = run.offset
        for offset in sorted(settled):
            if offset > start:
                rows.append(piece(run, start, offset - 1))
            start = offset + 1
        if start <= run.last_offset:
            rows.append(piece(run, start, run.last_offset))
    return rows


def wake(topic_id: int) -> None:
    """Wake the topic's long polls after commit: messages are deliverable again."""
    events.messages_returned(topic_id)


def read_at(partition_id: int, number: int, offsets: Iterable[int]) -> dict[int, StoredMessage]:
    """The stored messages at these offsets of a partition (those retention kept)."""
    rows = models.Message.objects.filter(
        partition_id=partition_id, offset__in=list(offsets)
    ).values_list(
        "offset", "timestamp_ms", "key", "tag", "headers", "value", "is_json", "client_id"
    )

    return {
        o: StoredMessage(
            number, o, ts, key, tag, orjson.dumps(headers).decode(), bytes(v), is_json, cid
        )
        for o, ts, key, tag, headers, v, is_json, cid in rows
    }


# Raw SQL on every delivery and settlement: the ORM would compile this query each time. The
# rows are built as models (with their partition) so callers can save them as usual.
_OFFSET_COLUMNS = (
    "o.id, o.group_id, o.partition_id, o.subscriber, o.committed_offset, o.delivered_offset, "
    "o.filtered_count, o.updated_at, p.topic_id, p.number, p.next_offset, p.start_offset, "
    "p.bytes_stored"
)
SELECT_OFFSETS = (
    f"SELECT {_OFFSET_COLUMNS}{{due}} FROM broker_groupoffset o "  # noqa: S608 (constants only)
    "JOIN broker_partition p ON p.id = o.partition_id WHERE {where} ORDER BY o.id"
)


# Whether a retry of the row's partition is due: a delivery asks it with its lock, which saves
# it a query of its own (a settlement between the two only removes runs).
RETRY_DUE = (
    ", EXISTS (SELECT 1 FROM broker_inflight i WHERE i.group_id = o.group_id "
    "AND i.subscriber = o.subscriber AND i.partition_id = o.partition_id AND i.state = %s "
    "AND i.deadline_ms <= %s)"
)


def locked_offsets(keys_: Iterable[OffsetKey]) -> dict[OffsetKey, models.GroupOffset]:
    """Lock the group offset rows of these keys, in id order. Caller holds the transaction."""
    return _locked(keys_, None)[0]


def locked_offsets_and_due(
    keys_: Iterable[OffsetKey], now_ms: int
) -> tuple[dict[OffsetKey, models.GroupOffset], bool]:
    """locked_offsets, and whether any of these rows has a retry due at now_ms."""
    return _locked(keys_, now_ms)


def lock_ahead(keys_: Iterable[OffsetKey], now_ms: int | None) -> None:
    """Announce locked_offsets_and_due(keys_, now_ms), or locked_offsets(keys_) when now_ms is
    None, as the transaction's next read (bulk.read_ahead): on PostgreSQL the rows are locked,
    and come back, with the statement that runs next."""
    wanted = sorted(set(keys_))
    if wanted:
        bulk.read_ahead(*_lock_statement(wanted, now_ms))


def _lock_statement(wanted: list[OffsetKey], due_at: int | None) -> tuple[str, list[Any]]:
    where = " OR ".join(
        ["(o.group_id = %s AND o.partition_id = %s AND o.subscriber = %s)"] * len(wanted)
    )
    sql = SELECT_OFFSETS.format(due="" if due_at is None else RETRY_DUE, where=where)
    params: list[Any] = [v for key in wanted for v in key]
    if due_at is not None:
        params = [models.InFlight.State.RETRY_WAIT.value, due_at, *params]
    if bulk.vendor() == "postgresql":
        # Group offset locks: serialize everything that reads or changes these partitions'
        # InFlight rows (SQLite serializes writers with BEGIN IMMEDIATE instead).
        sql += " FOR NO KEY UPDATE OF o"
    return sql, params


def _locked(
    keys_: Iterable[OffsetKey], due_at: int | None
) -> tuple[dict[OffsetKey, models.GroupOffset], bool]:
    wanted = sorted(set(keys_))
    if not wanted:
        return {}, False
    found = bulk.run(*_lock_statement(wanted, due_at))
    rows = {}
    due = False
    for (
        oid,
        gid,
        pid,
        sub,
        committed,
        delivered,
        filtered,
        updated,
        tid,
        number,
        nxt,
        start,
        size,
        *retry_due,
    ) in found:
        due = due or bool(retry_due and retry_due[0])
        row = models.GroupOffset(
            id=oid,
            group_id=gid,
            partition_id=pid,
            subscriber=sub,
            committed_offset=committed,
            delivered_offset=delivered,
            filtered_count=filtered,
            updated_at=updated,
        )
        row.partition = models.Partition(
            id=pid,
            topic_id=tid,
            number=number,
            next_offset=nxt,
            start_offset=start,
            bytes_stored=size,
        )
        rows[(gid, pid, sub)] = row
    return rows, due


# Each row's committed offset worked out and written in the statement that stores it (a round
# trip fewer on every settlement than reading the lowest in-flight offsets first): its lowest
# in-flight offset, or where delivery got to. The rows' offsets as the caller holds them come
# in VALUES. One text for both databases but for their dialects (see _committed_sql).
_COMMITTED_TARGETS = (
    "WITH v (id, group_id, partition_id, subscriber, delivered, committed, filtered) AS "
    '(VALUES {rows}), t AS (SELECT v.*, COALESCE((SELECT MIN(i."offset") FROM broker_inflight i '
    "WHERE i.group_id = v.group_id AND i.partition_id = v.partition_id "
    "AND i.subscriber = v.subscriber), {greatest}(v.delivered, v.committed)) AS target FROM v) "
)
# Only the committed offsets that change (settlements).
RECOMPUTE_COMMITTED = _COMMITTED_TARGETS + (  # noqa: S608 (constants only)
    "UPDATE broker_groupoffset AS o SET committed_offset = t.target FROM t "
    "WHERE o.id = t.id AND t.target <> t.committed RETURNING {returning}"
)
# A delivery's offsets whole (after an ack that left its recompute to it, or deleted runs).
SAVE_RECOMPUTED = _COMMITTED_TARGETS + (  # noqa: S608 (constants only)
    "UPDATE broker_groupoffset AS o SET committed_offset = t.target, delivered_offset = "
    "t.delivered, filtered_count = t.filtered, updated_at = %s FROM t WHERE o.id = t.id "
    "RETURNING {returning}"
)
_DIALECTS = {
    # VALUES rows carry their types on PostgreSQL, and RETURNING names the updated table's
    # columns (t has an id too); SQLite only allows the updated table's columns there.
    "postgresql": {
        "row": "(%s::bigint, %s::bigint, %s::bigint, %s::text, %s::bigint, %s::bigint, %s::bigint)",
        "greatest": "GREATEST",
        "returning": "o.id, o.committed_offset",
    },
    "sqlite": {
        "row": "(%s, %s, %s, %s, %s, %s, %s)",
        "greatest": "MAX",
        "returning": "id, committed_offset",
    },
}


@functools.cache
def _committed_sql(template: str, vendor: str, row_count: int) -> str:
    dialect = _DIALECTS[vendor]
    rows = ", ".join([dialect["row"]] * row_count)
    return template.format(rows=rows, greatest=dialect["greatest"], returning=dialect["returning"])


def _write_committed(
    sql: str, rows: dict[OffsetKey, models.GroupOffset], *more: Any, read_back: bool = True
) -> None:
    """Run RECOMPUTE_COMMITTED or SAVE_RECOMPUTED (more: its parameters after the rows) and
    take the committed offsets it wrote into the rows; without read_back, leave the rows'
    committed offsets as they were and defer the statement (bulk.defer)."""
    keys_ = sorted(rows)
    values: list[Any] = []
    for key in keys_:
        row = rows[key]
        values += [row.id, *key, row.delivered_offset, row.committed_offset, row.filtered_count]
    statement = _committed_sql(sql, bulk.vendor(), len(keys_))
    if not read_back:
        bulk.defer(statement, [*values, *more])
        return
    by_id = {row.id: row for row in rows.values()}
    for oid, committed in bulk.run(statement, [*values, *more]):
        by_id[oid].committed_offset = committed


def save_recomputed(rows: dict[OffsetKey, models.GroupOffset], *, read_back: bool = True) -> None:
    """Store the rows' delivered offsets and filtered counts, and set their committed offsets
    as recompute_committed does, in one statement.

    Without read_back the rows' committed offsets are not updated here, and on PostgreSQL the
    statement goes with the transaction's next one or its COMMIT (bulk.defer): for a caller
    that is done with the rows. Caller holds the rows' locks (locked_offsets).
    """
    if not rows:
        return
    now = timezone.now()
    for row in rows.values():
        row.updated_at = now
    _write_committed(
        SAVE_RECOMPUTED, rows, connection.ops.adapt_datetimefield_value(now), read_back=read_back
    )


def recompute_committed(
    rows: dict[OffsetKey, models.GroupOffset], *, read_back: bool = True
) -> None:
    """Set each row's committed offset to its lowest in-flight offset, or its delivered offset.

    Without anything in flight, a position a plain (non-member) poll moved on stands. Without
    read_back the rows keep their committed offsets in memory and the statement is deferred
    (as in save_recomputed). Caller holds the rows' locks (locked_offsets).
    """
    if rows:
        _write_committed(RECOMPUTE_COMMITTED, rows, read_back=read_back)
