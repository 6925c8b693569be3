"""broker_message keeps no foreign key to broker_partition on PostgreSQL (ADR 0017).

PostgreSQL checked it once per message row, at commit, with a row lock on the partition: a
quarter of the server's CPU per produced message (docs/benchmarks.md). SQLite keeps the one in
its table definition: dropping it there would copy the whole message table, and its check is
an in-process index lookup.
"""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

CONSTRAINTS = (
    "SELECT conname FROM pg_constraint WHERE contype = 'f' "
    "AND conrelid = 'broker_message'::regclass AND confrelid = 'broker_partition'::regclass"
)
RESTORED = "broker_message_partition_id_fk_broker_partition_id"


def drop_foreign_key(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CONSTRAINTS)
        names = [name for (name,) in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f'ALTER TABLE broker_message DROP CONSTRAINT "{name}"')


def restore_foreign_key(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"ALTER TABLE broker_message ADD CONSTRAINT {RESTORED} FOREIGN KEY (partition_id) "
        "REFERENCES broker_partition (id) DEFERRABLE INITIALLY DEFERRED"
    )


class Migration(migrations.Migration):
    dependencies = [("broker", "0009_message_read_plan")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="message",
                    name="partition",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="messages",
                        to="broker.partition",
                    ),
                )
            ],
            database_operations=[migrations.RunPython(drop_foreign_key, restore_foreign_key)],
        ),
    ]
