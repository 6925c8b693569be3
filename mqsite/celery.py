"""The Celery app: Redis broker, beat schedule built from broker/core/periodic.py."""

import os
from typing import TYPE_CHECKING

from celery import Celery
from celery.signals import celeryd_init, worker_ready

if TYPE_CHECKING:
    from broker.core import periodic

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mqsite.settings")

app = Celery("mqsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["broker"])


def expiry_seconds(job: "periodic.Job") -> float:
    """How long a job's message waits for a worker: its interval, at least a second."""
    return max(1.0, job.interval_seconds)


@app.on_after_configure.connect
def build_beat_schedule(sender: Celery, **kwargs: object) -> None:
    from broker.core import periodic

    sender.conf.beat_schedule = {
        job.name: {
            "task": "broker.run_periodic_job",
            "schedule": job.interval_seconds,
            "args": (job.name,),
            # A round nobody took within its interval is superseded by the next: a worker back
            # after an outage runs each job once, not the backlog beat sent meanwhile.
            "options": {"expires": expiry_seconds(job)},
        }
        for job in periodic.JOBS
    }


@celeryd_init.connect
def keep_no_messages(**kwargs: object) -> None:
    """A worker delivers nothing, so it keeps none of the messages it appends (released delayed
    messages, committed transactions) in memory (broker/core/log/recent.py), unless
    FERRY_MESSAGE_CACHE_MB says otherwise."""
    os.environ.setdefault("FERRY_MESSAGE_CACHE_MB", "0")


@celeryd_init.connect
def check_before_starting(**kwargs: object) -> None:
    """A worker starts only on a reachable, migrated database and a reachable Redis.

    Else one line and exit status 1 (docs/operations.md#start-up-checks), before Celery starts
    retrying its broker connection for good.
    """
    from broker import startup

    startup.check_or_exit()


@worker_ready.connect
def start_worker_heartbeat(**kwargs: object) -> None:
    """The worker lists itself in the process table (kind "worker") like every server does."""
    from broker import background

    background.start_heartbeat("worker")
