"""broker_scheduledmessage's unique index of client ids leads with the id (session 42).

A delayed produce looks its client ids up among the scheduled messages. With the index
led by the topic, PostgreSQL planning with stale statistics (a topic that grew since the
last ANALYZE) took the topic's own index, which the console's listing needs, and read all
of the topic's scheduled messages for every request (docs/benchmarks.md, session 42). The
lookup now names the ids alone (broker/core/log/delayed.py). The new index is built before
the old one goes, so the ids stay unique throughout.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("broker", "0012_produced_id_without_topic_index")]

    operations = [
        migrations.AddConstraint(
            model_name="scheduledmessage",
            constraint=models.UniqueConstraint(
                condition=models.Q(("client_id__isnull", False)),
                fields=("client_id", "topic"),
                name="scheduled_client_id_topic_uniq",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="scheduledmessage",
            name="scheduled_topic_client_id_uniq",
        ),
    ]
