"""Infrastructure failures: what a failed database call means for the client, and when to retry.

See docs/operations.md and docs/decisions/0014-outages.md. A database that cannot be reached is
503 `unavailable` (with retry_after), a full disk 507 `insufficient_storage`; a connection the
server ended is dropped and the call run once more on a new one, if it provably did not commit.
"""

import logging
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.db.utils import DatabaseError, InterfaceError, OperationalError

from broker import settings as ferry_settings
from broker.core import errors

logger = logging.getLogger(__name__)

# Errors of the database, as Django wraps them, and as its drivers raise them where the core
# uses a driver's own API (bulk.py's COPY on PostgreSQL).
ERRORS: tuple[type[BaseException], ...] = (DatabaseError, sqlite3.Error)
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    sqlite3.OperationalError,
)
# A borrow from the connection pool that timed out (mqsite/settings.py): the pool tried to
# connect all that while, so no session was lost and running the call again would only wait
# as long once more before the client hears 503.
POOL_TIMEOUTS: tuple[type[BaseException], ...] = ()
try:
    import psycopg

    ERRORS += (psycopg.Error,)
    CONNECTION_ERRORS += (psycopg.OperationalError, psycopg.InterfaceError)
except ImportError:  # pragma: no cover -- SQLite only
    pass
try:
    from psycopg_pool import PoolTimeout

    POOL_TIMEOUTS += (PoolTimeout,)
except ImportError:  # pragma: no cover -- SQLite only
    pass

T = TypeVar("T")

# SQLite: "database or disk is full"; PostgreSQL: SQLSTATE 53100 disk_full, "No space left on
# device" (also 53xxx out of memory / too many connections is an outage, not a full disk).
DISK_FULL_MARKERS = ("database or disk is full", "no space left on device", "disk full")
DISK_FULL_SQLSTATE = "53100"


def retry_after_s() -> int:
    """What a 503 `unavailable` tells the client to wait, in seconds."""
    return int(ferry_settings.get("RETRY_AFTER_SECONDS"))


def _sqlstate(exc: BaseException) -> str | None:
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)


def is_disk_full(exc: BaseException) -> bool:
    if not isinstance(exc, ERRORS):
        return False
    return _sqlstate(exc) == DISK_FULL_SQLSTATE or any(
        marker in str(exc).lower() for marker in DISK_FULL_MARKERS
    )


def classify(exc: BaseException) -> errors.BrokerError | None:
    """The BrokerError an infrastructure failure means for the client; None for anything else."""
    if is_disk_full(exc):
        return errors.InsufficientStorage(
            "The broker's disk is full; nothing was stored. Retry once there is room.",
            retry_after=retry_after_s(),
        )
    if isinstance(exc, CONNECTION_ERRORS):
        return errors.Unavailable(
            f"The broker cannot reach its database. Retry after {retry_after_s()} s; "
            "a retry with the same message ids is safe.",
            retry_after=retry_after_s(),
            dependency="database",
        )
    return None


def outage_line(what: str, exc: BaseException) -> str | None:
    """The one log line for a round of periodic work (a background job, the heartbeat) that met
    an outage: as a failed request's, no traceback every round for as long as it lasts. None
    when exc is not an outage (a bug: log its traceback)."""
    outage = classify(exc)
    if outage is None:
        return None
    return f"{what}: {outage.code} ({exc}); the next round retries"


def log_failure(log: logging.Logger, what: str, exc: BaseException) -> None:
    """Log a failed round of periodic work: outage_line's one line for an outage, the traceback
    for anything else (a bug)."""
    line = outage_line(what, exc)
    if line is None:
        log.error("%s failed", what, exc_info=exc)
    else:
        log.warning(line)


def is_lost_connection(exc: BaseException, conn: BaseDatabaseWrapper | None = None) -> bool:
    """Whether exc ended the connection (PostgreSQL ended the session, or the server is away).

    Django's own test: after an error, a connection that no longer answers is unusable. A
    borrow that timed out waiting for the pool ended no connection.
    """
    if not isinstance(exc, CONNECTION_ERRORS) or is_disk_full(exc):
        return False
    if isinstance(exc, POOL_TIMEOUTS) or isinstance(exc.__cause__, POOL_TIMEOUTS):
        return False
    conn = conn or connection
    if conn.connection is None:
        return True
    try:
        return not conn.is_usable()
    except Exception:
        return True


# What may have committed on a connection: COMMITs sent, and writes outside a transaction
# (autocommit). A call during which this did not move provably committed nothing.
def _commits(conn: BaseDatabaseWrapper) -> int:
    return int(getattr(conn, "ferry_commits", 0))


def _count(conn: BaseDatabaseWrapper) -> None:
    conn.ferry_commits = _commits(conn) + 1  # type: ignore[attr-defined]


def _watch_autocommit_writes(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    conn = context["connection"]
    if not conn.in_atomic_block and sql.lstrip()[:6].upper() != "SELECT":
        _count(conn)
    return execute(sql, params, many, context)


def _watch(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """On each new connection: count what may commit on it (COMMIT sent, autocommit writes)."""
    if getattr(connection, "ferry_watched", False):
        return
    connection.ferry_watched = True  # type: ignore[attr-defined]
    # Django's private hook under commit(): what actually sends COMMIT (every backend has one).
    commit = connection._commit  # type: ignore[attr-defined]

    def counted_commit() -> None:
        _count(connection)
        commit()

    connection._commit = counted_commit  # type: ignore[attr-defined]
    connection.execute_wrappers.append(_watch_autocommit_writes)


connection_created.connect(_watch, dispatch_uid="ferry.outages.watch")


def nothing_committed_since(mark: int, conn: BaseDatabaseWrapper | None = None) -> bool:
    return _commits(conn or connection) == mark


def mark_request() -> None:
    """Note what had committed on this thread's connection as a sync request begins.

    The API's sync views share one long-lived connection (mqsite/asgi.py), so what committed
    since it opened is not what this request did.
    """
    connection.ferry_commits_at_request = _commits(connection)  # type: ignore[attr-defined]


def nothing_committed_in_request() -> bool:
    """Whether nothing committed on this thread's connection since mark_request()."""
    return _commits(connection) == getattr(connection, "ferry_commits_at_request", -1)


def check_database() -> str:
    """Ask the database something (the health check); its vendor, or the error of an outage."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return str(connection.vendor)


def commit_mark(conn: BaseDatabaseWrapper | None = None) -> int:
    """A mark to pass to nothing_committed_since once a call failed."""
    return _commits(conn or connection)


def drop_if_broken() -> None:
    """Close this thread's connection if an error left it unusable; the next call reconnects."""
    connection.close_if_unusable_or_obsolete()


def call_with_reconnect(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs); if the database ended the connection before anything committed,
    once more on a new connection (a read, or a write whose COMMIT was never sent)."""
    mark = commit_mark()
    try:
        return fn(*args, **kwargs)
    except ERRORS as exc:
        lost = is_lost_connection(exc)
        drop_if_broken()
        if not lost or not nothing_committed_since(mark):
            raise
        logger.info("database connection lost (%s); running the call again on a new one", exc)
    try:
        return fn(*args, **kwargs)
    except ERRORS:
        drop_if_broken()
        raise
