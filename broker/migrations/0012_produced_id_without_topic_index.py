"""broker_producedid loses its index of topic_id (session 42).

producedid_topic_id_uniq (topic_id, client_id) leads with the same column, so the topic's
deletion job and the admin's filter keep an index. The produce's lookup of its ids matched
both, and a plan made with stale statistics (a new topic, a table not yet analyzed) took
the narrower one: every id of the topic read for each request (docs/benchmarks.md, session
42). Its upkeep was also one more index insert per produced id. Dropped by its name, the
same on both databases, so that SQLite's table (and its foreign key, ADR 0017) is not
rebuilt.
"""

from django.db import migrations, models

from broker.migrations._indexes import index_dropped


class Migration(migrations.Migration):
    dependencies = [("broker", "0011_produced_id_without_foreign_key")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="producedid",
                    name="topic",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="produced_ids",
                        to="broker.topic",
                    ),
                )
            ],
            database_operations=[
                index_dropped(
                    "broker_producedid", "topic_id", "broker_producedid_topic_id_fbac9cb4"
                )
            ],
        ),
    ]
