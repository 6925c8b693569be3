"""broker_producedid keeps no foreign key to broker_topic on PostgreSQL (ADR 0017, session 41).

PostgreSQL checked it once per produced id, at commit, with a row lock on the topic: every
message sent through ferry_client carries an id, and the checks were 12 % of the server's CPU
per such message (docs/benchmarks.md, session 41). SQLite keeps the one in its table
definition, as for broker_message (migration 0010).
"""

from django.db import migrations, models

from broker.migrations._foreign_keys import dropper, restorer


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
            database_operations=[
                migrations.RunPython(
                    dropper("broker_producedid", "broker_topic"),
                    restorer("broker_producedid", "topic_id", "broker_topic"),
                )
            ],
        ),
    ]
