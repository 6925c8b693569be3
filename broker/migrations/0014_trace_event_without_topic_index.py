"""broker_traceevent loses its index of topic_id (session 42).

trace_message_idx (topic_id, partition_number, offset) leads with the same column, so the
topic's deletion job keeps an index. A message's trace matched both, and a plan made with
stale statistics (a topic traced since the last ANALYZE) took the narrower one: all of the
topic's events read to find one message's (docs/benchmarks.md, session 42). Dropped by its
name, as in 0012, so that SQLite's table is not rebuilt.
"""

from django.db import migrations, models

from broker.migrations._indexes import index_dropped


class Migration(migrations.Migration):
    dependencies = [("broker", "0013_scheduled_client_id_first")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="traceevent",
                    name="topic",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="trace_events",
                        to="broker.topic",
                    ),
                )
            ],
            database_operations=[
                index_dropped(
                    "broker_traceevent", "topic_id", "broker_traceevent_topic_id_3b3e01cd"
                )
            ],
        ),
    ]
