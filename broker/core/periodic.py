"""THE table of background jobs: Celery beat and the in-process runner both read it.

See docs/architecture.md#background-jobs. Functions are named by dotted path so this table can
be read before Django's apps are loaded (Celery builds its beat schedule from it at import).
"""

from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from broker import settings as ferry_settings


@dataclass(frozen=True)
class Job:
    name: str
    function: str  # dotted path to a core function taking no arguments
    interval_setting: str  # the FERRY_<NAME> setting holding the interval in seconds

    @property
    def interval_seconds(self) -> float:
        return float(ferry_settings.get(self.interval_setting))

    def run(self) -> Any:
        return import_string(self.function)()


JOBS: tuple[Job, ...] = (
    Job("release_due", "broker.core.scheduling.release_due", "SCHEDULER_INTERVAL_SECONDS"),
    Job(
        "expire_members", "broker.core.membership.expire_members", "MEMBER_EXPIRY_INTERVAL_SECONDS"
    ),
    Job(
        "redeliver_expired",
        "broker.core.delivery.redeliver_expired",
        "ACK_SWEEP_INTERVAL_SECONDS",
    ),
    Job("purge_trace", "broker.core.trace.purge_trace", "TRACE_PURGE_INTERVAL_SECONDS"),
    Job("apply_retention", "broker.core.retention.apply_retention", "RETENTION_INTERVAL_SECONDS"),
    Job(
        "purge_produced_ids",
        "broker.core.retention.purge_produced_ids",
        "DEDUP_PURGE_INTERVAL_SECONDS",
    ),
    Job("sample_metrics", "broker.core.history.sample_metrics", "SAMPLE_INTERVAL_SECONDS"),
    Job(
        "compact_samples", "broker.core.history.compact_samples", "SAMPLE_COMPACT_INTERVAL_SECONDS"
    ),
    Job(
        "purge_processes",
        "broker.core.processes.purge_processes",
        "PROCESS_PURGE_INTERVAL_SECONDS",
    ),
    Job(
        "run_topic_deletions",
        "broker.core.topics.run_topic_deletions",
        "DELETION_INTERVAL_SECONDS",
    ),
    Job("run_redrive_jobs", "broker.core.redrives.run_redrive_jobs", "REDRIVE_INTERVAL_SECONDS"),
    Job(
        "check_transactions",
        "broker.core.transactions.check_transactions",
        "TRANSACTION_CHECK_INTERVAL_SECONDS",
    ),
)

BY_NAME = {job.name: job for job in JOBS}
