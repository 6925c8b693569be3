"""Celery tasks: one per core/periodic.py job, with the same name (docs/architecture.md)."""

from typing import Any

from celery import shared_task

from broker.core import periodic


@shared_task(name="broker.run_periodic_job", ignore_result=True)
def run_periodic_job(name: str) -> Any:
    """Run one job of the periodic table by name (idempotent: each job is)."""
    return periodic.BY_NAME[name].run()
