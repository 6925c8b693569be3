"""A delivery's read stays on the (partition, offset) index (docs/benchmarks.md, PostgreSQL).

- The message's own index on partition_id goes: message_partition_offset_uniq leads with the
  same column (foreign-key checks and every partition lookup use it), and the extra index cost
  every insert its upkeep. Dropped by name rather than by AlterField, which on SQLite would copy
  the whole message table.
- PostgreSQL keeps no statistics of broker_message.partition_id: with them, a partition that
  grew since the last ANALYZE is estimated at about one row, and the planner read it through
  another index, filtering every row of the partition. Without them every partition is
  estimated alike, and the offset range picks the unique index (tests/core/test_plans.py).
"""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

FK_INDEX = "broker_message_partition_id_7a32e8db"


def no_partition_statistics(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE broker_message ALTER COLUMN partition_id SET STATISTICS 0"
        )


def default_partition_statistics(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE broker_message ALTER COLUMN partition_id SET STATISTICS -1"
        )


class Migration(migrations.Migration):
    dependencies = [("broker", "0008_transactions")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="message",
                    name="partition",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="messages",
                        to="broker.partition",
                    ),
                )
            ],
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX IF EXISTS {FK_INDEX}",
                    f"CREATE INDEX {FK_INDEX} ON broker_message (partition_id)",
                )
            ],
        ),
        migrations.RunPython(no_partition_statistics, default_partition_statistics),
    ]
