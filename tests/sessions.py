"""Helpers for tests of lost database sessions (PostgreSQL)."""

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
