"""Bulk inserts for the hot paths: multi-row INSERT on SQLite, COPY on PostgreSQL.

See docs/benchmarks.md. The ORM's bulk_create builds a model instance and prepares every value
of every row, which costs more than the database's own work for a thousand-row batch.
"""

import functools
from collections.abc import Sequence

from django.db import connection

# SQLite allows 32766 parameters per statement; a few hundred rows per INSERT is the sweet spot.
SQLITE_MAX_PARAMETERS = 32766
MAX_ROWS_PER_INSERT = 500


def _quoted(columns: Sequence[str]) -> str:
    # "offset" and "key" are reserved words on PostgreSQL; quoting every column is harmless.
    return ", ".join(f'"{c}"' for c in columns)


def insert_rows(table: str, columns: Sequence[str], rows: Sequence[tuple[object, ...]]) -> None:
    """Insert rows (values in columns order) into table. Caller holds the transaction."""
    if not rows:
        return
    if connection.vendor == "postgresql":
        copy_sql = f"COPY {table} ({_quoted(columns)}) FROM STDIN"
        with connection.cursor() as cursor, cursor.cursor.copy(copy_sql) as copy:
            # cursor.cursor is psycopg's own cursor, which speaks COPY.
            for row in rows:
                copy.write_row(row)
        return
    per_insert = min(MAX_ROWS_PER_INSERT, SQLITE_MAX_PARAMETERS // len(columns))
    # Straight to sqlite3: Django's cursor would rewrite the placeholders of this long statement
    # with a regex on every call.
    sqlite = connection.connection
    for start in range(0, len(rows), per_insert):
        chunk = rows[start : start + per_insert]
        sqlite.execute(
            _sqlite_insert(table, tuple(columns), len(chunk)), [v for r in chunk for v in r]
        )


@functools.cache
def _sqlite_insert(table: str, columns: tuple[str, ...], row_count: int) -> str:
    """A multi-row INSERT in sqlite3's own "?" style."""
    row = "(" + ", ".join("?" * len(columns)) + ")"
    # table and columns are the callers' constants, never input.
    return f"INSERT INTO {table} ({_quoted(columns)}) VALUES " + ", ".join([row] * row_count)  # noqa: S608
