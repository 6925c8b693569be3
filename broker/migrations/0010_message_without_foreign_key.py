"""broker_message keeps no foreign key to broker_partition on PostgreSQL (ADR 0017).

PostgreSQL checked it once per message row, at commit, with a row lock on the partition: a
quarter of the server's CPU per produced message (docs/benchmarks.md). SQLite keeps the one in
its table definition: dropping it there would copy the whole message table, and its check is
an in-process index lookup.
"""

from django.db import migrations, models

from broker.migrations._foreign_keys import dropper, restorer


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
            database_operations=[
                migrations.RunPython(
                    dropper("broker_message", "broker_partition"),
                    restorer("broker_message", "partition_id", "broker_partition"),
                )
            ],
        ),
    ]
