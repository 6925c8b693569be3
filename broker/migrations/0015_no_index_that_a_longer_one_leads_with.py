"""No index of one column that a longer index of its table leads with (session 42).

Django gives every foreign key its own index. Where another index leads with the same column
(a unique constraint, a listing's index), that one serves every lookup by the column alone,
and the single one only cost: an insert's upkeep (an in-flight run's, a group's offsets),
and a choice for the planner. With stale statistics PostgreSQL took it for lookups that
name more columns, and read all of a group's or topic's rows to find a few, as it did for
the produced ids (0012) and the trace (0014). Dropped by name, the same on both databases,
so that no SQLite table is rebuilt; tests/core/test_plans.py checks that none is left.
"""

import django.db.models.deletion
from django.db import migrations, models

from broker.migrations._indexes import index_dropped

# (table, column, Django's name for the foreign key's index)
DROPPED = [
    ("broker_deadletter", "group_id", "broker_deadletter_group_id_6c166ec3"),
    ("broker_groupmember", "group_id", "broker_groupmember_group_id_691022fd"),
    ("broker_groupoffset", "group_id", "broker_groupoffset_group_id_0ab996dd"),
    ("broker_groupsample", "group_id", "broker_groupsample_group_id_168ca623"),
    ("broker_inflight", "group_id", "broker_inflight_group_id_84a68296"),
    ("broker_partition", "topic_id", "broker_partition_topic_id_4851f04f"),
    ("broker_partitionlease", "group_id", "broker_partitionlease_group_id_b37724b6"),
    ("broker_stagedack", "transaction_id", "broker_stagedack_transaction_id_5ffa84a3"),
    ("broker_stagedmessage", "transaction_id", "broker_stagedmessage_transaction_id_af94cde3"),
    ("broker_stagedoffset", "transaction_id", "broker_stagedoffset_transaction_id_8faed336"),
    ("broker_topicsample", "topic_id", "broker_topicsample_topic_id_21a28fd9"),
]


class Migration(migrations.Migration):
    dependencies = [("broker", "0014_trace_event_without_topic_index")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="deadletter",
                    name="group",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="dead_letters",
                        to="broker.consumergroup",
                    ),
                ),
                migrations.AlterField(
                    model_name="groupmember",
                    name="group",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="members",
                        to="broker.consumergroup",
                    ),
                ),
                migrations.AlterField(
                    model_name="groupoffset",
                    name="group",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="offsets",
                        to="broker.consumergroup",
                    ),
                ),
                migrations.AlterField(
                    model_name="groupsample",
                    name="group",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="samples",
                        to="broker.consumergroup",
                    ),
                ),
                migrations.AlterField(
                    model_name="inflight",
                    name="group",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="in_flight",
                        to="broker.consumergroup",
                    ),
                ),
                migrations.AlterField(
                    model_name="partition",
                    name="topic",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="partitions",
                        to="broker.topic",
                    ),
                ),
                migrations.AlterField(
                    model_name="partitionlease",
                    name="group",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="leases",
                        to="broker.consumergroup",
                    ),
                ),
                migrations.AlterField(
                    model_name="stagedack",
                    name="transaction",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="staged_acks",
                        to="broker.transaction",
                    ),
                ),
                migrations.AlterField(
                    model_name="stagedmessage",
                    name="transaction",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="staged",
                        to="broker.transaction",
                    ),
                ),
                migrations.AlterField(
                    model_name="stagedoffset",
                    name="transaction",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="staged_offsets",
                        to="broker.transaction",
                    ),
                ),
                migrations.AlterField(
                    model_name="topicsample",
                    name="topic",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="samples",
                        to="broker.topic",
                    ),
                ),
            ],
            database_operations=[index_dropped(*dropped) for dropped in DROPPED],
        ),
    ]
