"""Celery tasks: one per core/periodic.py job, with the same name (docs/architecture.md)."""

import logging
from typing import Any

from celery import shared_task

from broker.core import outages, periodic, processes

logger = logging.getLogger(__name__)


@shared_task(name="broker.run_periodic_job", ignore_result=True)
def run_periodic_job(name: str) -> Any:
    """Run one job of the periodic table by name (idempotent: each job is).

    A run that met a database outage logs one line and ends; beat's next run retries.
    """
    job = periodic.BY_NAME[name]
    try:
        result = job.run()
    except Exception as exc:
        # The overview shows the job failing (docs/console-ui.md#what-each-page-shows).
        processes.record_job_run(name, exc)
        line = outages.outage_line(f"periodic job {name}", exc)
        if line is None:
            raise  # a bug: Celery logs it with its traceback
        logger.warning(line)
        return None
    processes.record_job_run(name)
    return result
