"""Dropping a foreign key on PostgreSQL only, for migrations 0010 and 0011 (ADR 0017).

Not a migration (Django skips modules whose names start with "_"). The constraint is found by
what pg_constraint names, as Django named it; reverting adds it back as Django makes one.
SQLite keeps its constraints: dropping one there rewrites the whole table.
"""

from collections.abc import Callable

from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

Step = Callable[[StateApps, BaseDatabaseSchemaEditor], None]


def dropper(table: str, referenced: str) -> Step:
    """Drops table's foreign keys to referenced (PostgreSQL)."""

    def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                "SELECT conname FROM pg_constraint WHERE contype = 'f' "
                "AND conrelid = %s::regclass AND confrelid = %s::regclass",
                [table, referenced],
            )
            names = [name for (name,) in cursor.fetchall()]
        for name in names:
            schema_editor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')

    return drop


def restorer(table: str, column: str, referenced: str) -> Step:
    """Adds table.column's foreign key to referenced(id) back (PostgreSQL)."""

    def restore(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        schema_editor.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {table}_{column}_fk_{referenced}_id "
            f"FOREIGN KEY ({column}) REFERENCES {referenced} (id) DEFERRABLE INITIALLY DEFERRED"
        )

    return restore
