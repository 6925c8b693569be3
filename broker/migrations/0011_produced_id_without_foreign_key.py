"""broker_producedid keeps no foreign key to broker_topic on PostgreSQL (ADR 0017, session 41).

PostgreSQL checked it once per produced id, at commit, with a row lock on the topic: every
message sent through ferry_client carries an id, and the checks were 14 % of the server's CPU
per such message (docs/benchmarks.md, session 41). SQLite keeps the one in its table
definition, as for broker_message (migration 0010).
"""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

CONSTRAINTS = (
    "SELECT conname FROM pg_constraint WHERE contype = 'f' "
    "AND conrelid = 'broker_producedid'::regclass AND confrelid = 'broker_topic'::regclass"
)
RESTORED = "broker_producedid_topic_id_fk_broker_topic_id"


def drop_foreign_key(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CONSTRAINTS)
        names = [name for (name,) in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f'ALTER TABLE broker_producedid DROP CONSTRAINT "{name}"')


def restore_foreign_key(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"ALTER TABLE broker_producedid ADD CONSTRAINT {RESTORED} FOREIGN KEY (topic_id) "
        "REFERENCES broker_topic (id) DEFERRABLE INITIALLY DEFERRED"
    )


class Migration(migrations.Migration):
    dependencies = [("broker", "0010_message_without_foreign_key")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="producedid",
                    name="topic",
                    field=models.ForeignKey(
                        db_constraint=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="produced_ids",
                        to="broker.topic",
                    ),
                )
            ],
            database_operations=[migrations.RunPython(drop_foreign_key, restore_foreign_key)],
        ),
    ]
