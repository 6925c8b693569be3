"""Helpers for tests of lost database sessions (PostgreSQL)."""

import re
import subprocess
import time
from pathlib import Path
from typing import Any

from django.db import connection, connections


def terminate_own_session() -> None:
    """End this thread's PostgreSQL session from another connection, as an operator would."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


class LingeringSession(UserWarning):
    """A session still open on the test database at the end of the run (shown, not an error)."""


def lingering_sessions() -> list[dict[str, Any]]:
    """The other sessions on the test database, with the local process holding each one.

    The client port of a session names its socket here; `ss` names the process that holds it.
    """
    # From the maintenance database, as Django drops the test database: a cursor of the
    # default alias would open the pool again, and its sessions would be the ones found.
    with connection._nodb_cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, client_port, backend_start, left(query, 120) "
            "FROM pg_stat_activity WHERE datname = %s",
            [connection.settings_dict["NAME"]],
        )
        rows = cursor.fetchall()
    found = []
    for pid, application, state, port, started, query in rows:
        holder = ""
        if port and port > 0:
            try:
                listed = subprocess.run(
                    ["ss", "-Htnp", "state", "all", f"( sport = :{port} )"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                holder = _process_of(listed.stdout)
            except OSError:
                holder = "? (no ss: install iproute2 to name it)"
        found.append(
            {
                "backend": pid,
                "application": application,
                "state": state,
                "started": str(started),
                "query": query,
                "held_by": holder,
            }
        )
    return found


def _process_of(ss_line: str) -> str:
    """'pid 123: python -m daphne …' from one line of `ss -p`, or the line itself."""
    match = re.search(r"pid=(\d+)", ss_line)
    if not match:
        return ss_line.strip()
    pid = match.group(1)
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        command = "?"
    return f"pid {pid}: {command[:200]}"


def end_lingering_sessions(timeout_s: float = 15) -> list[dict[str, Any]]:
    """Wait up to timeout_s for the other sessions on the test database to end; end the rest.

    Returns what was still open (empty when every session ended on its own), so the caller can
    say which process kept one: PostgreSQL refuses to drop a database with a session open.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = lingering_sessions()
        if not found or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if found:
        with connection._nodb_cursor() as cursor:
            for session in found:
                cursor.execute("SELECT pg_terminate_backend(%s)", [session["backend"]])
    return found
