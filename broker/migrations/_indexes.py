"""Dropping a foreign key's own index, for migrations 0012, 0014 and 0015 (ADR 0027).

Not a migration (Django skips modules whose names start with "_"). The index goes by the name
Django gave it, the same on both databases, so that no SQLite table is rebuilt (an AlterField
of db_index would rebuild it); reverting makes it again under that name.
"""

from django.db import migrations


def index_dropped(table: str, column: str, index: str) -> migrations.RunSQL:
    """Drops table's index of column alone, named index; reverting makes it again."""
    return migrations.RunSQL(f"DROP INDEX {index}", f"CREATE INDEX {index} ON {table} ({column})")
