"""The reference for bench/per_message.py: the least an ASGI app can do under the same Daphne.

HTTP: it reads the request body and answers a fixed produce-shaped JSON, so the round trip and
the server CPU it costs are the transport's share of a Ferry request (no Django, no database).

WebSocket: it plays Ferry's side of the prefetch-2 loop with nothing behind it. A `subscribe`
frame gets `subscribed` and two one-message `messages` frames; each `ack` frame gets `acked`
and one more one-message `messages` frame, shaped as Ferry's (docs/websocket.md). What that
costs the server is the transport's share of a consumed message (no Channels, no database).

WebSocket at /e2e: the least a durable broker can do for the end-to-end figure. A `subscribe`
frame gets `subscribed` and makes the connection the subscriber; `publish` frames are appended
to a file and flushed (fdatasync) in group commits on a worker thread, as Ferry's writer thread
does, then each gets its `published` answer and the commit's messages go to the subscribers in
one `messages` frame; an `ack` frame gets `acked`. No credit, no Channels, no database: the
transport's and the disk's share of a message's trip (BARE_LOG_DIR names the log's directory).

WebSocket at /consume: the least a durable broker with per-message acks does for
bench/postgres.py's consume, on PostgreSQL (BARE_DATABASE_URL; the bench makes the tables,
BARE_SCHEMA). A `subscribe` frame gets `subscribed` and `prefetch` messages; each `ack` frame
gets `acked` and as many messages again. Each is one transaction on a worker thread, as Ferry's
database calls are: the acked receipts' in-flight rows deleted, the next messages read from the
log from the cursor's offset (its row locked), their in-flight rows (with an ack deadline, for
redelivery) inserted, the cursor moved, COMMIT. One subscriber, one partition, no groups, no
Django, no Channels: the transport's and the database's share of a consumed message. At
/consume the transaction is one statement (one round trip); at /consume/two it is Ferry's
shape: the lock and the read in one round trip, then the writes and the COMMIT in another,
through Ferry's own statement path (broker/core/pgwire.py) and nothing else of Ferry's. At
/consume/memory it is one statement that reads no message: the messages are pushed from this
process's memory (BARE_PRELOAD=1 reads the log into it at start, before any client connects),
as Ferry pushes what it appended lately from its own (docs/decisions/0024): only the acks, the
in-flight rows and the cursor go through PostgreSQL.
"""

import asyncio
import os
import sys
import tempfile
import time
import types
from typing import Any

import orjson

# /consume/two sends its statements through Ferry's own libpq path (broker/core/pgwire.py).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BODY = b'{"results":[{"partition":0,"offset":0,"duplicate":false}]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        if scope["path"].rstrip("/") == "/e2e":
            await end_to_end(receive, send)
        elif scope["path"].rstrip("/") in ("/consume", "/consume/two", "/consume/memory"):
            await consume(receive, send, shape=scope["path"].rstrip("/").rpartition("/")[2])
        else:
            await prefetch_two(receive, send)
        return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


def _item(offset: int, value: Any, now: int) -> dict[str, Any]:
    return {
        "partition": 0,
        "offset": offset,
        "timestamp_ms": now,
        "key": None,
        "tag": None,
        "headers": {},
        "id": None,
        "value": value,
        "receipt": f"{offset:016x}.1.{offset:x}",
        "attempt": 1,
        "deadline_ms": now + 30_000,
    }


def _messages(sub: str, offset: int) -> str:
    item = _item(offset, offset, int(time.time() * 1000))
    return orjson.dumps({"type": "messages", "sub": sub, "items": [item]}).decode()


async def _next_frame(receive: Any, send: Any) -> dict[str, Any] | None:
    """The connection's next frame, parsed (the handshake accepted on the way); None once closed."""
    while True:
        event = await receive()
        if event["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
            continue
        if event["type"] != "websocket.receive":
            return None  # websocket.disconnect
        frame: dict[str, Any] = orjson.loads(event.get("text") or event.get("bytes") or b"{}")
        return frame


def _acked(frame: dict[str, Any], sub: str, settled: int | None = None) -> bytes:
    """The `acked` answer: every receipt settled, unless settled says how many were."""
    if settled is None:
        settled = len(frame.get("receipts", ()))
    return orjson.dumps(
        {
            "type": "acked",
            "ref": frame.get("ref"),
            "sub": sub,
            "settled": settled,
            "stale": [],
            "dead_lettered": 0,
        }
    )


async def prefetch_two(receive: Any, send: Any) -> None:
    offset = 0
    while (frame := await _next_frame(receive, send)) is not None:
        sub = frame.get("sub", "s")
        if frame.get("type") == "subscribe":
            answers = [orjson.dumps({"type": "subscribed", "ref": frame.get("ref"), "sub": sub})]
            pushes = 2
        elif frame.get("type") == "ack":
            answers = [_acked(frame, sub)]
            pushes = 1
        else:
            continue
        for answer in answers:
            await send({"type": "websocket.send", "text": answer.decode()})
        for _ in range(pushes):
            await send({"type": "websocket.send", "text": _messages(sub, offset)})
            offset += 1


class _Log:
    """An append-only file flushed in group commits: publishes that arrive while a flush runs
    share the next one."""

    def __init__(self) -> None:
        directory = os.environ.get("BARE_LOG_DIR") or tempfile.gettempdir()
        self.fd = os.open(
            os.path.join(directory, f"bare-{os.getpid()}.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
        self.offset = 0
        self.pending: list[tuple[Any, Any, list[Any]]] = []  # (send, ref, values)
        self.committing: asyncio.Future[None] | None = None
        self.subscribers: dict[Any, str] = {}  # send -> sub

    def _write(self, data: bytes) -> None:
        os.write(self.fd, data)
        os.fdatasync(self.fd)

    def publish(self, send: Any, ref: Any, values: list[Any]) -> None:
        self.pending.append((send, ref, values))
        if self.committing is None:  # else the running commit's loop takes it next
            self.committing = asyncio.ensure_future(self._commit())

    async def _commit(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                data = orjson.dumps([values for _, _, values in batch])
                await asyncio.get_running_loop().run_in_executor(None, self._write, data)
                await self._answer(batch)
        finally:
            self.committing = None

    async def _answer(self, batch: list[tuple[Any, Any, list[Any]]]) -> None:
        now = int(time.time() * 1000)
        items = []
        for send, ref, values in batch:
            results = []
            for value in values:
                items.append(_item(self.offset, value, now))
                results.append({"partition": 0, "offset": self.offset, "duplicate": False})
                self.offset += 1
            answer = orjson.dumps({"type": "published", "ref": ref, "results": results})
            await send({"type": "websocket.send", "text": answer.decode()})
        for send, sub in list(self.subscribers.items()):
            push = orjson.dumps({"type": "messages", "sub": sub, "items": items})
            await send({"type": "websocket.send", "text": push.decode()})


_log: _Log | None = None


async def end_to_end(receive: Any, send: Any) -> None:
    global _log
    if _log is None:
        _log = _Log()
    log = _log
    try:
        while (frame := await _next_frame(receive, send)) is not None:
            kind, sub = frame.get("type"), frame.get("sub", "s")
            if kind == "subscribe":
                log.subscribers[send] = sub
                answer = orjson.dumps({"type": "subscribed", "ref": frame.get("ref"), "sub": sub})
            elif kind == "publish":
                values = [m.get("value") for m in frame.get("messages", ())]
                # Not awaited: the connection reads its next frame while the flush runs.
                log.publish(send, frame.get("ref"), values)
                continue
            elif kind == "ack":
                answer = _acked(frame, sub)
            else:
                continue
            await send({"type": "websocket.send", "text": answer.decode()})
    finally:
        log.subscribers.pop(send, None)


# The tables /consume reads and writes (bench/postgres.py's bare_consume makes and fills them).
BARE_SCHEMA = """
CREATE TABLE bare_log (off bigint PRIMARY KEY, key text, value bytea NOT NULL, ts bigint);
CREATE TABLE bare_inflight (off bigint PRIMARY KEY, deadline_ms bigint NOT NULL);
CREATE TABLE bare_cursor (id int PRIMARY KEY, next_off bigint NOT NULL);
INSERT INTO bare_cursor VALUES (1, 0);
"""

# What both one-statement shapes share: the acked receipts' in-flight rows deleted and the
# cursor's row locked, then (after `taken`, each shape's own) the taken offsets marked in flight
# and the cursor moved past them.
_SETTLED_AND_PLACE = """
WITH settled AS (
    DELETE FROM bare_inflight WHERE off = ANY(%(acked)s) RETURNING off
), place AS (
    SELECT next_off FROM bare_cursor WHERE id = 1 FOR UPDATE
)"""
_MARKED_AND_MOVED = """, marked AS (
    INSERT INTO bare_inflight (off, deadline_ms) SELECT off, %(deadline)s FROM taken
), moved AS (
    UPDATE bare_cursor SET next_off = (SELECT coalesce(max(off) + 1, place.next_off) FROM taken)
    FROM place WHERE bare_cursor.id = 1
)
"""

# Settle, read, mark in flight and move the cursor: one statement, one round trip, one COMMIT.
# A settled count comes back even when no message follows (the LEFT JOIN).
_SETTLE_AND_TAKE = (
    _SETTLED_AND_PLACE
    + """, taken AS (
    SELECT off, key, value, ts FROM bare_log
    WHERE off >= (SELECT next_off FROM place) ORDER BY off
    LIMIT %(credit)s + (SELECT count(*) FROM settled)
)"""
    + _MARKED_AND_MOVED
    + """SELECT n.settled, t.off, t.key, t.value, t.ts
FROM (SELECT count(*) AS settled FROM settled) n LEFT JOIN taken t ON true
ORDER BY t.off
"""
)

# /consume/memory's statement: as _SETTLE_AND_TAKE, the offsets taken without reading the log
# (its messages are in memory, _LOG), up to its end.
_SETTLE_AND_MARK = (
    _SETTLED_AND_PLACE
    + """, taken AS (
    SELECT generate_series(
        place.next_off,
        LEAST(place.next_off + %(credit)s + (SELECT count(*) FROM settled), %(end)s) - 1
    ) AS off FROM place
)"""
    + _MARKED_AND_MOVED
    + """SELECT (SELECT count(*) FROM settled), array(SELECT off FROM taken ORDER BY off)
"""
)


def _preload() -> list[tuple[Any, ...]]:
    """The log's messages by offset (off, key, value, ts), read once at start (BARE_PRELOAD)."""
    if os.environ.get("BARE_PRELOAD") != "1":
        return []
    import psycopg

    with psycopg.connect(os.environ["BARE_DATABASE_URL"]) as conn:
        rows = conn.execute("SELECT off, key, value, ts FROM bare_log ORDER BY off").fetchall()
    return [(off, key, bytes(value), ts) for off, key, value, ts in rows]


_LOG = _preload()


# /consume/two's statements (the cursor's row locked by the read's subquery).
_TAKE = """
SELECT off, key, value, ts FROM bare_log
WHERE off >= (SELECT next_off FROM bare_cursor WHERE id = 1 FOR UPDATE) ORDER BY off LIMIT %s
"""
_SETTLE = "DELETE FROM bare_inflight WHERE off = ANY(%s) RETURNING off"
_MARK = "INSERT INTO bare_inflight SELECT unnest(%s::bigint[]), %s"
_MOVE = "UPDATE bare_cursor SET next_off = %s WHERE id = 1"


class _Consumer:
    """One /consume subscriber's connection to PostgreSQL, used by one call at a time (the
    connection awaits each call before it reads its next frame)."""

    def __init__(self, two: bool) -> None:
        import psycopg  # only /consume needs it

        # Two round trips: Ferry's own statement path (broker/core/pgwire.py), which begins
        # the transaction itself.
        url = os.environ["BARE_DATABASE_URL"]
        self.conn = psycopg.connect(url, autocommit=not two)
        self.db = types.SimpleNamespace(connection=self.conn)  # what pgwire reads of Django's

    def settle_and_take(self, acked: list[int], credit: int) -> tuple[int, list[Any]]:
        """Settle acked, take credit plus that many more: (how many settled, the rows)."""
        deadline = int(time.time() * 1000) + 30_000
        with self.conn.cursor(binary=True) as cur:
            cur.execute(_SETTLE_AND_TAKE, {"acked": acked, "credit": credit, "deadline": deadline})
            rows = cur.fetchall()
        return (rows[0][0] if rows else 0), [row[1:] for row in rows if row[1] is not None]

    def settle_and_take_from_memory(self, acked: list[int], credit: int) -> tuple[int, list[Any]]:
        """settle_and_take with the messages from memory: the statement reads no message."""
        deadline = int(time.time() * 1000) + 30_000
        params = {"acked": acked, "credit": credit, "deadline": deadline, "end": len(_LOG)}
        with self.conn.cursor(binary=True) as cur:
            cur.execute(_SETTLE_AND_MARK, params)
            row = cur.fetchone()
        settled, offsets = (row[0], row[1]) if row else (0, [])
        return settled, [_LOG[off] for off in offsets]

    def settle_and_take_in_two(self, acked: list[int], credit: int) -> tuple[int, list[Any]]:
        """settle_and_take in two round trips through pgwire, as Ferry sends its statements:
        BEGIN and the read (the cursor's row locked), then the writes and the COMMIT."""
        from broker.core import pgwire

        deadline = int(time.time() * 1000) + 30_000
        [rows] = pgwire.execute(self.db, [(_TAKE, (credit + len(acked),))])
        offsets = [row[0] for row in rows]
        writes = [(_SETTLE, (acked,)), (_MARK, (offsets, deadline))]
        if offsets:
            writes.append((_MOVE, (offsets[-1] + 1,)))
        settled = pgwire.execute(self.db, writes, commit=True)[0]
        return len(settled), rows


def _pushed(sub: str, rows: list[Any]) -> bytes:
    """A `messages` frame of the rows, shaped as Ferry's (the value a stored JSON fragment)."""
    deadline = int(time.time() * 1000) + 30_000
    items = [
        {
            "partition": 0,
            "offset": off,
            "timestamp_ms": ts,
            "key": key,
            "tag": None,
            "headers": {},
            "id": None,
            "value": orjson.Fragment(value),
            "receipt": str(off),
            "attempt": 1,
            "deadline_ms": deadline,
        }
        for off, key, value, ts in rows
    ]
    return orjson.dumps({"type": "messages", "sub": sub, "items": items})


async def consume(receive: Any, send: Any, shape: str = "consume") -> None:
    """shape: "consume" (one statement), "two" (two round trips) or "memory" (one statement,
    the messages from memory)."""
    two = shape == "two"
    loop = asyncio.get_running_loop()
    consumer: _Consumer | None = None
    try:
        while (frame := await _next_frame(receive, send)) is not None:
            kind, sub = frame.get("type"), frame.get("sub", "s")
            if kind == "subscribe":
                consumer = await loop.run_in_executor(None, _Consumer, two)
                call = {
                    "two": consumer.settle_and_take_in_two,
                    "memory": consumer.settle_and_take_from_memory,
                }.get(shape, consumer.settle_and_take)
                answer = orjson.dumps({"type": "subscribed", "ref": frame.get("ref"), "sub": sub})
                acked, credit = [], int(frame.get("prefetch") or 1)
            elif kind == "ack" and consumer is not None:
                acked, credit = [int(r) for r in frame.get("receipts", ())], 0
                answer = b""
            else:
                continue
            settled, rows = await loop.run_in_executor(None, call, acked, credit)
            if not answer:
                answer = _acked(frame, sub, settled)
            await send({"type": "websocket.send", "text": answer.decode()})
            if rows:
                await send({"type": "websocket.send", "text": _pushed(sub, rows).decode()})
    finally:
        if consumer is not None:
            consumer.conn.close()
