"""Hot-path writes: bulk inserts (multi-row INSERT / COPY) and bookkeeping transactions.

See docs/benchmarks.md. The ORM's bulk_create builds a model instance and prepares every value
of every row, which costs more than the database's own work for a thousand-row batch.
"""

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import orjson
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.signals import connection_created
from django.db.backends.sqlite3.base import FORMAT_QMARK_REGEX
from django.db.models import Model
from django.dispatch import receiver
from django.utils import timezone
from psycopg import pq

from broker.core import pgwire

# SQLite allows 32766 parameters per statement; a few hundred rows per INSERT is the sweet spot.
SQLITE_MAX_PARAMETERS = 32766
MAX_ROWS_PER_INSERT = 500
# PostgreSQL: below this many rows a multi-row INSERT, deferred (defer()) so that it goes in the
# COMMIT's round trip; from it on a COPY. A COPY is two round trips of its own and a fixed setup
# on the server; an INSERT costs the server more a row. A group commit of 100 keyed messages:
# 1,760 → 1,395 µs of the broker's CPU, 2,125 → 1,750 of PostgreSQL's; about even at 200 rows,
# COPY the cheaper beyond (docs/benchmarks.md).
PG_COPY_MIN_ROWS = 200


@functools.cache
def vendor() -> str:
    """The default database's vendor ("sqlite" or "postgresql"), asked once.

    The hot paths ask it several times per call, and each `connection.vendor` looks up the
    thread's connection (asgiref's Local raises and catches an exception on a thread without an
    event loop: 1.5 µs, about 30 times per ack and push).
    """
    return str(connections[DEFAULT_DB_ALIAS].vendor)


@receiver(setting_changed)
def _databases_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DATABASES":
        vendor.cache_clear()


def run(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement ("%s" placeholders) on this thread's connection; its rows, if any.

    Straight through the driver, for the statements of every produce, delivery and
    settlement: a Django cursor per statement (its wrappers, the connection's thread-local
    lookups and, on SQLite, a regex rewrite of the placeholders on every call) cost about a
    quarter of a prefetch-2 ack and push on SQLite (docs/benchmarks.md); on PostgreSQL it goes
    below psycopg's cursor too, to libpq (pgwire, ADR 0019). What Django's cursor
    gives that matters is kept: its exceptions (IntegrityError, OperationalError, ...) and, when
    queries are logged (DEBUG, CaptureQueriesContext), the statement in connection.queries.
    A write needs the caller's transaction: outages.py does not see writes in autocommit here.
    Writes deferred (defer()) go first, in the same round trip, and reads announced with
    read_ahead() after it; a read announced so is answered from what it found.
    """
    db: Any = connections[DEFAULT_DB_ALIAS]
    if db.connection is None:
        db.ensure_connection()
    if db.vendor != "sqlite":
        found = _take_read(db, sql, params)
        if found is not None:
            return found
        pending, ahead = _take(db, "ferry_deferred"), _take(db, "ferry_ahead")
        if pending or ahead:
            return _between_held(db, pending, [(sql, params)], ahead)[0]
    raw = db.connection
    if db.vendor != "sqlite" and pgwire.usable(db):
        return _wire(db, [(sql, params)])[0]
    logged = db.queries_logged
    started = time.monotonic() if logged else 0.0
    with db.wrap_database_errors:
        if db.vendor == "sqlite":
            cursor = raw.execute(_qmark(sql), params)
            rows = cursor.fetchall() if cursor.description is not None else []
        else:
            rows = _rows(raw.execute(sql, params))
    if logged:
        db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return rows


def run_together(statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
    """run() of each statement, in order: each statement's rows. On PostgreSQL in one round
    trip (a pipeline), after the writes defer() holds and before the reads read_ahead()
    announced, as run() sends one; so for reads whose parameters do not come from one another's
    rows. In autocommit they then run in one implicit transaction, each statement still seeing
    what was committed when it started."""
    db: Any = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "sqlite" or not statements:
        return [run(sql, params) for sql, params in statements]
    if db.connection is None:
        db.ensure_connection()
    _drop_reads_of(db, None)  # statements of their own run between: what was read ahead is old
    return _between_held(db, _take(db, "ferry_deferred"), statements, _take(db, "ferry_ahead"))


def _between_held(
    db: Any,
    pending: list[tuple[str, Sequence[Any]]],
    statements: Sequence[tuple[str, Sequence[Any]]],
    ahead: list[tuple[str, Sequence[Any]]],
) -> list[list[tuple[Any, ...]]]:
    """The statements' rows, sent in one round trip after the writes defer() held (pending) and
    before the reads read_ahead() announced (ahead), whose rows are kept for their run()."""
    results = _pipeline(db, [*pending, *statements, *ahead])
    if ahead:
        db.ferry_read = (db.connection, list(zip(ahead, results[-len(ahead) :], strict=True)))
    return results[len(pending) : len(pending) + len(statements)]


def run_many(sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run one write statement once for each row of parameters, as run() runs one.

    On SQLite in one call of the driver (sqlite3's executemany): Django's cursor would wrap it,
    look the connection up and rewrite its placeholders with a regex, about a twentieth of a
    one-message group commit (docs/benchmarks.md). Elsewhere one run() a row. Logged as one
    query, as Django's executemany logs it.
    """
    db: Any = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "sqlite":
        for params in rows:
            run(sql, params)
        return
    if db.connection is None:
        db.ensure_connection()
    started = time.monotonic() if db.queries_logged else 0.0
    with db.wrap_database_errors:
        db.connection.executemany(_qmark(sql), rows)
    _log(db, [(f"{len(rows)} times: {sql}", ())], started)


def defer(sql: str, params: Sequence[Any] = (), *, table: str | None = None) -> None:
    """Run a write whose rows nobody reads with the transaction's next statement, or with its
    COMMIT if none comes.

    On PostgreSQL it then shares that statement's round trip (a pipeline): an ack's DELETE goes
    with the read of the messages it makes room for, a delivery's in-flight INSERT with the
    update of the offsets, an append's update of its partitions with the COMMIT (the partition
    locks are held a round trip less). Every later statement on the connection (run(),
    Django's cursor, the COMMIT) runs after it, so no reader can tell, except that its error
    is raised by the next statement. A rollback drops it. On SQLite, which has no round trip
    to save, and outside a transaction, it runs at once.

    Rows that reads announced with read_ahead() found before this write are dropped, as they
    would not have seen it; table names the one table the write changes, and then only the
    reads that name it are dropped (an ack's DELETE of in-flight runs leaves the read of the
    messages it makes room for).
    """
    db: Any = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "sqlite" or not db.in_atomic_block:
        run(sql, params)
        return
    _drop_reads_of(db, table)
    _hold(db, "ferry_deferred", (sql, params))


def _drop_reads_of(db: Any, table: str | None) -> None:
    """Drop the rows of the announced reads that name table (None: of every read)."""
    held = getattr(db, "ferry_read", None)
    if held and table is not None:
        conn, reads = held
        kept = [read for read in reads if table not in read[0][0]]
        db.ferry_read = (conn, kept) if kept else None
    else:
        db.ferry_read = None


def read_ahead(sql: str, params: Sequence[Any] = ()) -> None:
    """Announce a read the transaction makes next, right after its next statement.

    On PostgreSQL it is sent with that statement, after it in the same pipeline (reads
    announced together in the order announced), and the run() of the same statement and
    parameters gets its rows without a round trip of its own: the member's row read with its
    group's lock, the runs an ack names and the messages it makes room for with their offset
    rows' locks. As a statement of its own it would have run right after the other one, under
    the same locks and seeing the same commits (in READ COMMITTED each statement sees what was
    committed when it started), so nothing can tell the difference. The reads announced
    together may be taken in any order: reads do not change what another read finds. Any
    other statement before they are taken (a write deferred too, bar one to another table:
    defer()) drops the rows, and each run() then reads for itself; so does one on SQLite, or
    outside a transaction, where this does nothing.
    """
    db: Any = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "sqlite" or not db.in_atomic_block:
        return
    _hold(db, "ferry_ahead", (sql, tuple(params)))


def _hold(db: Any, name: str, statement: tuple[str, Sequence[Any]]) -> None:
    """Keep a statement for later on this connection, in the list db.<name>: what defer()
    ("ferry_deferred") or read_ahead() ("ferry_ahead") holds."""
    if db.connection is None:
        db.ensure_connection()
    _hook_deferred(None, db)  # a connection made before this module was imported, too
    held: tuple[Any, list[tuple[str, Sequence[Any]]]] | None = getattr(db, name, None)
    if held is None or held[0] is not db.connection:
        held = (db.connection, [])
        setattr(db, name, held)
    held[1].append(statement)


def _take(db: Any, name: str) -> list[tuple[str, Sequence[Any]]]:
    """What _hold() kept in db.<name>, taken. Kept for a connection since lost, nothing: it
    went with that connection's transaction."""
    held = getattr(db, name, None)
    if not held:
        return []
    setattr(db, name, None)
    return held[1] if held[0] is db.connection else []


def _take_read(db: Any, sql: str, params: Sequence[Any]) -> list[Any] | None:
    """The rows a read announced with read_ahead() found, when it is this statement (the
    reads announced are taken in any order); else None, and the rows of every read announced
    are dropped (something else ran between)."""
    held = getattr(db, "ferry_read", None)
    if not held:
        return None
    conn, reads = held
    wanted = (sql, tuple(params))
    index = -1
    if conn is db.connection:
        index = next((i for i, read in enumerate(reads) if read[0] == wanted), -1)
    if index < 0:
        db.ferry_read = None
        return None
    rows = reads.pop(index)[1]
    if not reads:
        db.ferry_read = None
    return rows  # type: ignore[no-any-return]


def _forget_reads(db: Any) -> None:
    db.ferry_ahead = db.ferry_read = None


def _drop_held(db: Any) -> None:
    """Forget everything held on the connection: its transaction is over without a COMMIT."""
    db.ferry_deferred = None
    _forget_reads(db)


def flush_deferred(db: Any, table: str | None = None) -> None:
    """Send what defer() holds on this connection now, before a statement of another kind
    (which also drops what read_ahead() announced or found). table: the one table that
    statement writes (a COPY into it); the rows of reads that do not name it are then kept,
    as defer() keeps them."""
    db.ferry_ahead = None
    _drop_reads_of(db, table)
    pending = _take(db, "ferry_deferred")
    if pending:
        _pipeline(db, pending)


def _pipeline(
    db: Any,
    statements: Sequence[tuple[str, Sequence[Any]]],
    then: Callable[[], None] | None = None,
) -> list[list[Any]]:
    """The statements in one round trip, then (in it) `then`, the COMMIT's own call; through
    pgwire, which sends the COMMIT itself, when the connection allows it."""
    if pgwire.usable(db):
        return _wire(db, statements, commit=then is not None)
    raw = db.connection
    started = time.monotonic() if db.queries_logged else 0.0
    with db.wrap_database_errors:
        with raw.pipeline():
            cursors = [raw.execute(sql, params) for sql, params in statements]
            if then is not None:
                _log(db, statements, started)  # before the COMMIT, which logs itself
                then()
        found = [_rows(c) for c in cursors]
    if then is None:
        _log(db, statements, started)
    return found


def _wire(
    db: Any, statements: Sequence[tuple[str, Sequence[Any]]], commit: bool = False
) -> list[list[Any]]:
    """pgwire.execute, its errors as Django's, its statements (and COMMIT) logged as Django's
    cursor logs them."""
    started = time.monotonic() if db.queries_logged else 0.0
    try:
        with db.wrap_database_errors:
            return pgwire.execute(db, statements, commit=commit)
    finally:
        _log(db, [*statements, ("COMMIT", ())] if commit else statements, started)


def _log(db: Any, statements: Sequence[tuple[str, Sequence[Any]]], started: float) -> None:
    """When queries are logged (DEBUG, CaptureQueriesContext), the statements sent together
    since started, each with the round trip's time, as Django's cursor logs them."""
    if db.queries_logged:
        took = f"{time.monotonic() - started:.3f}"
        db.queries_log.extend({"sql": sql, "time": took} for sql, _ in statements)


def _rows(cursor: Any) -> list[Any]:
    """A psycopg cursor's rows, if its statement returns any.

    Not `cursor.description is not None`: psycopg builds a Column object per column for it,
    which cost a sixth of an ack and push's CPU on PostgreSQL (docs/benchmarks.md).
    """
    result = cursor.pgresult
    if result is None or (result.nfields == 0 and result.status != pq.ExecStatus.TUPLES_OK):
        return []
    return cursor.fetchall()  # type: ignore[no-any-return]


def _flush_first(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    flush_deferred(context["connection"])
    return execute(sql, params, many, context)


def _hook_deferred(sender: Any, connection: Any, **kwargs: Any) -> None:
    """On each new PostgreSQL connection: what defer() holds goes before any statement of
    Django's cursor (savepoints included), or with the COMMIT; a rollback drops it."""
    if connection.vendor != "postgresql" or getattr(connection, "ferry_defers", False):
        return
    connection.ferry_defers = True
    commit, rollback, close = connection._commit, connection._rollback, connection._close

    def flushed_commit() -> None:
        _forget_reads(connection)
        pending = _take(connection, "ferry_deferred")
        # With pgwire even a bare COMMIT goes through it: psycopg's commit() costs more CPU.
        if pending or (connection.connection is not None and pgwire.usable(connection)):
            _pipeline(connection, pending, then=commit)  # and the COMMIT: one round trip
        else:
            commit()

    def dropped_rollback() -> None:
        _drop_held(connection)
        rollback()

    def dropped_close() -> None:
        _drop_held(connection)  # a pooled connection comes back as the same object
        close()

    connection._commit = flushed_commit
    connection._rollback = dropped_rollback
    connection._close = dropped_close
    connection.execute_wrappers.insert(0, _flush_first)


connection_created.connect(_hook_deferred, dispatch_uid="ferry.bulk.deferred")


@functools.lru_cache(maxsize=1024)
def _qmark(sql: str) -> str:
    """Django's SQLite placeholder rewrite ("%s" to "?", "%%" to "%"), once per statement."""
    return str(FORMAT_QMARK_REGEX.sub("?", sql)).replace("%%", "%")


def id_array(ids: Sequence[int] | Sequence[str]) -> Any:
    """A list of ids (numbers or strings) as one parameter, for a statement that tests
    "= ANY(%s)" (for_ids): on SQLite its text as JSON."""
    return orjson.dumps(ids).decode() if vendor() == "sqlite" else ids


def for_ids(sql: str) -> str:
    """A statement written as PostgreSQL takes a list of ids as one parameter ("id = ANY(%s)",
    id_array), for this connection: SQLite gets "id IN (SELECT value FROM json_each(%s))"."""
    return _json_each(sql) if vendor() == "sqlite" else sql


@functools.lru_cache(maxsize=256)
def _json_each(sql: str) -> str:
    return sql.replace("= ANY(%s)", "IN (SELECT value FROM json_each(%s))")


def _quoted(columns: Sequence[str]) -> str:
    # "offset" and "key" are reserved words on PostgreSQL; quoting every column is harmless.
    return ", ".join(f'"{c}"' for c in columns)


def insert_rows(
    table: str, columns: Sequence[str], rows: Sequence[tuple[object, ...]], *, now: bool = False
) -> None:
    """Insert rows (values in columns order) into table. Caller holds the transaction.

    now: not deferred (defer()), so that an error is raised here, not by the next statement
    (inside the caller's savepoint, say)."""
    if not rows:
        return
    if vendor() == "postgresql":
        if len(rows) < PG_COPY_MIN_ROWS:
            sql, params = insert_sql(table, tuple(columns), len(rows)), [v for r in rows for v in r]
            if now:
                run(sql, params)
            else:
                defer(sql, params, table=table)
            return
        copy_sql = f"COPY {table} ({_quoted(columns)}) FROM STDIN"
        db = connections[DEFAULT_DB_ALIAS]
        # A group commit's topic, read with its partitions' lock, stays read: a round trip
        # fewer under that lock.
        flush_deferred(db, table)
        with db.wrap_database_errors, db.cursor() as cursor, cursor.cursor.copy(copy_sql) as copy:
            # cursor.cursor is psycopg's own cursor, which speaks COPY (and skips Django's
            # wrappers: what defer() holds goes first, by hand; its errors are made Django's).
            for row in rows:
                copy.write_row(row)
        return
    per_insert = min(MAX_ROWS_PER_INSERT, SQLITE_MAX_PARAMETERS // len(columns))
    # Straight to sqlite3: Django's cursor would rewrite the placeholders of this long statement
    # with a regex on every call.
    db = connections[DEFAULT_DB_ALIAS]
    with db.wrap_database_errors:  # Django's exceptions, as run() raises them
        for start in range(0, len(rows), per_insert):
            chunk = rows[start : start + per_insert]
            db.connection.execute(
                _sqlite_insert(table, tuple(columns), len(chunk)), [v for r in chunk for v in r]
            )


@functools.cache
def insert_sql(table: str, columns: tuple[str, ...], row_count: int) -> str:
    """A multi-row INSERT in psycopg's "%s" style (bound and, once repeated, prepared by the
    server; run() rewrites the placeholders for SQLite)."""
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    # table and columns are the callers' constants, never input.
    return f"INSERT INTO {table} ({_quoted(columns)}) VALUES " + ", ".join([row] * row_count)  # noqa: S608


@functools.cache
def _sqlite_insert(table: str, columns: tuple[str, ...], row_count: int) -> str:
    """A multi-row INSERT in sqlite3's own "?" style."""
    row = "(" + ", ".join("?" * len(columns)) + ")"
    # table and columns are the callers' constants, never input.
    return f"INSERT INTO {table} ({_quoted(columns)}) VALUES " + ", ".join([row] * row_count)  # noqa: S608


@contextlib.contextmanager
def bookkeeping() -> Iterator[None]:
    """A durable=True transaction that commits without waiting for the disk flush.

    For delivery bookkeeping only (deliver, ack, nack, the deadline sweep): a power loss may
    forget the last few of these commits, and then their messages are delivered again, so at
    least once still holds; a process crash forgets nothing (WAL). Produces never use it.
    SQLite: synchronous=NORMAL for the transaction (set outside it, as SQLite requires: inside
    an enclosing transaction, such as a test's, it is left as it is); PostgreSQL: SET LOCAL
    synchronous_commit = off.
    """
    db: Any = connections[DEFAULT_DB_ALIAS]
    if vendor() == "sqlite" and not db.in_atomic_block:
        db.ensure_connection()
        sqlite = db.connection
        sqlite.execute("PRAGMA synchronous=NORMAL")
        try:
            with transaction.atomic(durable=True):
                yield
        finally:
            sqlite.execute(f"PRAGMA synchronous={_sqlite_synchronous(db)}")
        return
    with transaction.atomic(durable=True):
        if vendor() == "postgresql":
            defer("SET LOCAL synchronous_commit = off")  # with the first statement
            limits = pgwire.wait_limits()
            if limits:
                defer(limits)  # a call on the event loop (dbthreads.run_here)
        yield


def _sqlite_synchronous(db: Any) -> str:
    # The connection's configured level (FERRY_SQLITE_SYNCHRONOUS, FULL by default).
    return _synchronous_in(str(db.settings_dict.get("OPTIONS", {}).get("init_command", "")))


@functools.cache
def _synchronous_in(command: str) -> str:
    for part in command.split(";"):
        name, _, value = part.strip().partition("=")
        if name.lower() == "pragma synchronous":
            return value.strip()
    return "FULL"


M = TypeVar("M", bound=Model)


Converter = tuple[Callable[[Any, Any, Any], Any], Any]


@functools.cache
def _select_plan(
    model: type[Model], vendor: str
) -> tuple[str, tuple[str, ...], tuple[tuple[Converter, ...], ...], tuple[str, ...]]:
    """The model's SELECT list, its attribute names and each column's converters, made once.

    What RawQuerySet works out on every call (column order, model init order, converters).
    """
    fields: list[Any] = list(model._meta.concrete_fields)
    table = model._meta.db_table
    converters = []
    for f in fields:
        col = f.get_col(table)
        found = [*connection.ops.get_db_converters(col), *f.get_db_converters(connection)]
        converters.append(tuple((convert, col) for convert in found))
    columns = ", ".join(f'"{f.column}"' for f in fields)
    # table and columns come from the model, never from input.
    select = f"SELECT {columns} FROM {table} "  # noqa: S608
    names = tuple(f.attname for f in fields)
    return select, names, tuple(converters), tuple(f.column for f in fields)


def select_models(model: type[M], where: str, params: Sequence[Any]) -> list[M]:
    """Instances of model for `SELECT ... FROM its table <where>`, as the ORM would make them.

    For queries every poll, push and settlement runs: model.objects.raw() costs more than the
    database does for a one-row lookup.
    """
    select, names, converters, _ = _select_plan(model, vendor())
    db = connections[DEFAULT_DB_ALIAS]
    return [_instance(model, names, converters, db, row) for row in run(select + where, params)]


def select_sql(model: type[Model]) -> str:
    """`SELECT <the model's columns> FROM <its table> `: what select_models runs before its
    where, for callers that keep the rows themselves (model_from_row makes their instances)."""
    return _select_plan(model, vendor())[0]


def model_from_row(model: type[M], row: Sequence[Any]) -> M:
    """The model's instance for a row of select_sql(model), as the ORM would make it."""
    _, names, converters, _ = _select_plan(model, vendor())
    return _instance(model, names, converters, connections[DEFAULT_DB_ALIAS], row)


def _instance(
    model: type[M],
    names: tuple[str, ...],
    converters: tuple[tuple[Converter, ...], ...],
    db: Any,
    row: Sequence[Any],
) -> M:
    """The model's instance for its columns' values in row (a _select_plan's names and
    converters), as the ORM would make it."""
    values = list(row)
    for i, column_converters in enumerate(converters):
        for convert, col in column_converters:
            values[i] = convert(values[i], col, db)
    return model.from_db(DEFAULT_DB_ALIAS, names, values)


def joined_sql(parts: Sequence[tuple[type[Model], str]], tail: str) -> str:
    """The statement select_joined(parts, tail, ...) runs (for read_ahead())."""
    return _joined_sql(tuple(parts), tail, vendor())


@functools.cache
def _joined_sql(parts: tuple[tuple[type[Model], str], ...], tail: str, vendor: str) -> str:
    # Built once per statement: a delivery on PostgreSQL names it twice (read ahead, then run).
    columns = ", ".join(
        f'{alias}."{column}"' for model, alias in parts for column in _select_plan(model, vendor)[3]
    )
    # tail and the columns come from the callers' constants and the models, never input.
    return f"SELECT {columns} {tail}"


def select_joined(
    parts: Sequence[tuple[type[Model], str]], tail: str, params: Sequence[Any]
) -> list[tuple[Model, ...]]:
    """One instance of each model per row of `SELECT <their columns> <tail>`.

    parts: (model, its table's alias in tail). For lookups that would otherwise take a
    statement per model on every poll and push.
    """
    plans = [(_select_plan(model, vendor()), model, alias) for model, alias in parts]
    rows = run(joined_sql(parts, tail), params)
    db = connections[DEFAULT_DB_ALIAS]
    found = []
    for row in rows:
        start, instances = 0, []
        for (_, names, converters, _), model, _ in plans:
            part = row[start : start + len(names)]
            start += len(names)
            instances.append(_instance(model, names, converters, db, part))
        found.append(tuple(instances))
    return found


def update_rows(rows: Sequence[Model], fields: Sequence[str], *, deferred: bool = False) -> None:
    """UPDATE each row's fields by primary key in one executemany, as save(update_fields) would.

    An auto_now field among fields is set to now, as save() does. deferred: with the
    transaction's next statement or its COMMIT on PostgreSQL (defer()). Caller holds the
    transaction.
    """
    if not rows:
        return
    meta = rows[0]._meta
    db = connections[DEFAULT_DB_ALIAS]
    concrete: list[Any] = [meta.get_field(name) for name in fields]
    now = timezone.now()
    for field in concrete:
        if getattr(field, "auto_now", False):
            for row in rows:
                setattr(row, field.attname, now)
    sets = ", ".join(f'"{f.column}" = %s' for f in concrete)
    # table and columns come from the model, never from input.
    sql = f"UPDATE {meta.db_table} SET {sets} WHERE id = %s"  # noqa: S608
    params = [
        [*(f.get_db_prep_save(getattr(row, f.attname), db) for f in concrete), row.pk]
        for row in rows
    ]
    if len(params) == 1 or (deferred and vendor() == "postgresql"):
        # psycopg runs an executemany in pipeline mode: more work than one execute; deferred
        # statements go in the next one's pipeline.
        for one in params:
            (defer if deferred else run)(sql, one)
        return
    with db.cursor() as cursor:
        cursor.executemany(sql, params)
