"""The hot paths' PostgreSQL statements straight through libpq, in one pipeline.

psycopg's cursor costs about 45 µs of CPU per statement on this machine beside libpq's own
few: a cursor object, generators stepped by its wait loop, its pipeline's bookkeeping
(docs/benchmarks.md). An ack and push runs nine statements in four round trips, so bulk.run
and its pipelines send theirs here: the protocol messages psycopg would send (BEGIN when a
transaction starts, parameters bound by the server, a statement prepared once it has run
prepare_threshold times on the connection), the connection's own adapters to dump parameters
and load rows (psycopg's Transformer), and psycopg's exception for the server's SQLSTATE,
which Django then wraps as it wraps its own.

Which statements are prepared is psycopg's own record of the connection (its PrepareManager,
`_prepared`, as its cursors use it): one cache and one naming for both, which psycopg empties
with a DEALLOCATE ALL after a rollback or DDL and trims to its prepared_max. That attribute is
not psycopg's public API; psycopg is pinned, and tests/core/test_pgwire.py covers each use.
docs/decisions/0019-statements-through-libpq.md says why.

Two libpq calls go through ctypes, on the very libpq psycopg loaded, for the GIL's sake. The
Sync that ends a round trip also sends it: libpq writes the buffered statements to the socket,
which wakes the server's backend. psycopg's pipeline_sync() holds the GIL through that write
(about 18 µs of CPU on this VM, more when the scheduler hands the core to the woken backend
first), so the event loop waited for the GIL meanwhile: called through ctypes.CDLL, the GIL is
free. PQisBusy, asked before each result, only reads libpq's memory, but psycopg lets go of the
GIL for it, and each time the event loop's thread waits for the GIL that costs a hand-over of
it and back, two context switches: called through ctypes.PyDLL, the GIL stays held.
"""

import contextlib
import ctypes
import functools
import re
import select
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from psycopg import errors as pg_errors
from psycopg import pq
from psycopg._preparing import Prepare
from psycopg.adapt import AdaptersMap, Loader, PyFormat, Transformer
from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper

# Rows come back in binary: a bytea value as its bytes (not hex text twice its size for the
# server to write and the driver to decode), numbers without a parse.
BINARY = pq.Format.BINARY

_PLACEHOLDER = re.compile(r"%(.)", re.DOTALL)


def _libpq_path() -> str | None:
    """The file of the libpq psycopg's C extension loaded (its wheel bundles one); None where it
    cannot be told (not Linux, psycopg's pure-Python build): then psycopg's own calls are used."""
    if pq.__impl__ not in ("binary", "c"):
        return None
    try:
        with open("/proc/self/maps") as maps:
            # address, perms, offset, device, inode, path: the path is the sixth field.
            fields = [line.split(maxsplit=5) for line in maps if "/libpq" in line]
    except OSError:
        return None
    paths = {f[5].strip() for f in fields if len(f) == 6}
    # None, or two (psycopg's and another's): which one is not sure.
    return paths.pop() if len(paths) == 1 else None


def _open_libpq(path: str | None) -> tuple[ctypes.CDLL, ctypes.PyDLL] | None:
    """The library twice: its calls letting go of the GIL, and keeping it."""
    if path is None:
        return None
    try:
        free, held = ctypes.CDLL(path), ctypes.PyDLL(path)
    except OSError:
        return None
    free.PQpipelineSync.argtypes = [ctypes.c_void_p]
    free.PQpipelineSync.restype = ctypes.c_int
    held.PQisBusy.argtypes = [ctypes.c_void_p]
    held.PQisBusy.restype = ctypes.c_int
    return free, held


# Read once psycopg's C extension is imported (above), so its libpq is in the process.
_LIBPQ, _LIBPQ_HELD = _open_libpq(_libpq_path()) or (None, None)


def _is_busy(pgconn: Any) -> bool:
    """pgconn.is_busy(), keeping the GIL (a closed connection's pointer is None: not busy)."""
    if _LIBPQ_HELD is None:
        return bool(pgconn.is_busy())
    return bool(_LIBPQ_HELD.PQisBusy(pgconn.pgconn_ptr))


def _pipeline_sync(pgconn: Any) -> None:
    """pgconn.pipeline_sync(), without holding the GIL while libpq writes to the socket."""
    if _LIBPQ is None:
        pgconn.pipeline_sync()
        return
    if _LIBPQ.PQpipelineSync(pgconn.pgconn_ptr) != 1:
        raise pg_errors.OperationalError(f"sync failed: {pq.error_message(pgconn)}")


@functools.lru_cache(maxsize=4096)
def native(sql: str) -> bytes:
    """sql with psycopg's "%s" placeholders as $1, $2, ... and "%%" as "%"."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(1) == "%":
            return "%"
        if match.group(1) != "s":
            raise ValueError(f"only %s placeholders here: {sql!r}")
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(number, sql).encode()


class _Int8Context:
    """The connection's adapters, but every int sent as a bigint.

    psycopg sends an int as the smallest type that holds it (smallint, integer, bigint), so a
    statement would be prepared once per size of its numbers (an offset passing 32767, then
    2**31), and a list of ints as an array of the type its first list's numbers fit.
    Compared with or stored into an integer column, a bigint parameter works the same.
    """

    def __init__(self, raw: Any) -> None:
        self.connection = raw
        self.adapters = AdaptersMap(raw.adapters)
        # The text one too: a list of ints dumps its elements as text, and psycopg's own
        # picked smallint for [1, 2], then kept that dumper for every later list (32,768
        # refused). Registered first: for PyFormat.AUTO the last registered is used.
        self.adapters.register_dumper(int, Int8Dumper)
        self.adapters.register_dumper(int, Int8BinaryDumper)
        # Django reads jsonb columns as text (its JSONField parses them itself).
        self.adapters.register_loader("jsonb", _JsonbAsText)


class _JsonbAsText(Loader):
    """A binary jsonb as its text, as Django's own (text) loader gives it."""

    format = BINARY

    def load(self, data: Any) -> str:
        return bytes(data[1:]).decode()  # a version byte (1), then the JSON text


class _Session:
    """What this module keeps for one psycopg connection."""

    __slots__ = ("raw", "readable", "transformer", "writable")

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.transformer = Transformer(_Int8Context(raw))
        # poll, not select: a server with a thousand clients has sockets past select's 1024.
        self.readable, self.writable = select.poll(), select.poll()
        self.readable.register(raw.pgconn.socket, select.POLLIN)
        self.writable.register(raw.pgconn.socket, select.POLLIN | select.POLLOUT)


def _session(db: Any) -> _Session:
    session: _Session | None = getattr(db, "ferry_wire", None)
    if session is None or session.raw is not db.connection:
        session = _Session(db.connection)
        db.ferry_wire = session
    return session


class _Query(NamedTuple):
    """What psycopg's PrepareManager reads of a query: its text and its parameters' types."""

    query: bytes
    types: tuple[int, ...]


# Per result (one per command sent): the statement's index and what to tell psycopg's
# PrepareManager of it (None: nothing, the statement was not new to it); or None for a
# PREPARE, BEGIN or COMMIT.
_Expected = tuple[int, tuple[Any, Prepare, bytes] | None] | None


def usable(db: Any) -> bool:
    """Whether db's statements may come here: parameters bound by the server (off with
    FERRY_PG_PREPARE_THRESHOLD=0) and transactions that start with a plain BEGIN."""
    raw = db.connection
    return bool(
        db.settings_dict["OPTIONS"].get("server_side_binding")
        and raw.isolation_level is None
        and raw.read_only is None
        and raw.deferrable is None
    )


def execute(
    db: Any, statements: Sequence[tuple[str, Sequence[Any]]], commit: bool = False
) -> list[list[tuple[Any, ...]]]:
    """Run statements in one round trip, then COMMIT if commit; each statement's rows.

    db is Django's connection (PostgreSQL, connected, usable()). The first error the server
    reports is raised, as psycopg raises it, once the round trip is over; the transaction is
    then failed (in autocommit, the statement did nothing).
    """
    session = _session(db)
    raw, tx = session.raw, session.transformer
    pgconn = raw.pgconn
    idle = pgconn.transaction_status == pq.TransactionStatus.IDLE
    if not statements and idle:
        return []  # a COMMIT with no transaction begun: psycopg sends nothing either
    cache = raw._prepared  # psycopg's own record: see the module's doc
    expected: list[_Expected] = []
    synced = collected = False
    pgconn.enter_pipeline_mode()
    try:
        if idle and not raw.autocommit:
            pgconn.send_query_params(b"BEGIN", None)
            expected.append(None)
        for index, (sql, params) in enumerate(statements):
            if params:
                values = tx.dump_sequence(params, [PyFormat.AUTO] * len(params))
                query = _Query(native(sql), tuple(tx.types or ()))
                formats = tx.formats
            else:
                values, query, formats = None, _Query(native(sql), ()), None
            prep, name = cache.get(query)
            if prep is Prepare.NO:
                pgconn.send_query_params(
                    query.query,
                    values,
                    param_types=query.types,
                    param_formats=formats,
                    result_format=BINARY,
                )
            else:
                if prep is Prepare.SHOULD:
                    pgconn.send_prepare(name, query.query, param_types=query.types)
                    expected.append(None)
                pgconn.send_query_prepared(
                    name, values, param_formats=formats, result_format=BINARY
                )
            key = cache.maybe_add_to_cache(query, prep, name)
            if key is None and prep is Prepare.SHOULD:
                key = cache.key(query)  # checked too: an aborted PREPARE must not count
            expected.append((index, None if key is None else (key, prep, name)))
        if commit:
            pgconn.send_query_params(b"COMMIT", None)
            expected.append(None)
        _pipeline_sync(pgconn)
        synced = True
        _flush(session)
        found, error = _collect(session, expected, len(statements))
        collected = True
    finally:
        _leave_pipeline(session, synced, collected)
    if error is not None:
        raise error
    if cache._to_flush:  # past prepared_max: DEALLOCATE the oldest, as psycopg
        raw.wait(cache.maintain_gen(raw))
    return found


def _flush(session: _Session) -> None:
    """Send what libpq buffered (the connection is non-blocking, as psycopg sets it)."""
    pgconn = session.raw.pgconn
    while pgconn.flush():
        session.writable.poll()
        pgconn.consume_input()  # the server may be answering while we still send


def _result(session: _Session) -> Any:
    """libpq's next result, waiting for it."""
    pgconn = session.raw.pgconn
    while _is_busy(pgconn):
        session.readable.poll()
        pgconn.consume_input()
    return pgconn.get_result()


def _collect(
    session: _Session, expected: list[_Expected], count: int
) -> tuple[list[list[tuple[Any, ...]]], Exception | None]:
    """Each statement's rows, up to the pipeline's end; and the first error, if any."""
    raw, tx = session.raw, session.transformer
    found: list[list[tuple[Any, ...]]] = [[] for _ in range(count)]
    error: Exception | None = None
    for what in expected:
        result = _result(session)
        if result is None:
            raise pg_errors.InternalError("the pipeline ended before its results")
        while _result(session) is not None:  # a command's results end with a None
            pass
        status = result.status
        if status == pq.ExecStatus.FATAL_ERROR and error is None:
            error = pg_errors.error_from_result(result, encoding=raw.info.encoding)
        if what is None:
            continue
        index, new = what
        if new is not None:
            # Kept as prepared only if it ran (an aborted pipeline skipped its PREPARE).
            raw._prepared.validate(*new, [result])
        if status == pq.ExecStatus.TUPLES_OK and result.ntuples:
            tx.set_pgresult(result)
            found[index] = tx.load_rows(0, result.ntuples, tuple)
    sync = _result(session)
    if sync is None or sync.status != pq.ExecStatus.PIPELINE_SYNC:
        raise pg_errors.InternalError("the pipeline's results ended out of order")
    return found, error


def _leave_pipeline(session: _Session, synced: bool, collected: bool) -> None:
    """Leave pipeline mode with nothing left to read, whatever stopped the round trip: psycopg
    must find the connection idle (or failed in a transaction), not in the middle of results.
    A connection that broke is left as it is; the error raised says so."""
    pgconn = session.raw.pgconn
    if pgconn.status != pq.ConnStatus.OK:
        return
    try:
        if not synced:
            _pipeline_sync(pgconn)
            _flush(session)
        if not collected:
            nones = 0
            while nones < 2:  # a command's results end with one None; two: nothing is left
                result = _result(session)
                if result is None:
                    nones += 1
                elif result.status == pq.ExecStatus.PIPELINE_SYNC:
                    break
                else:
                    nones = 0
        pgconn.exit_pipeline_mode()
    except Exception:  # noqa: S110 -- broken meanwhile; the first error is the one raised
        pass


# The bounded_waits() of this thread's call: the statement that sets them, or None.
_bounds = threading.local()


@contextlib.contextmanager
def bounded_waits(lock_ms: int, statement_ms: int) -> Iterator[None]:
    """On PostgreSQL, a bookkeeping transaction begun inside (bulk.bookkeeping) waits at most
    lock_ms for a row lock another transaction holds and statement_ms for a statement, then
    fails and keeps nothing: for a call on the event loop's thread, which must not stop the
    loop for another transaction or a slow server (dbthreads.run_here)."""
    _bounds.sql = (
        f"SELECT set_config('lock_timeout', '{int(lock_ms)}', true), "
        f"set_config('statement_timeout', '{int(statement_ms)}', true)"
    )
    try:
        yield
    finally:
        _bounds.sql = None


def wait_limits() -> str | None:
    """The statement that sets this thread's bounded_waits(), or None outside them."""
    return getattr(_bounds, "sql", None)
