"""Broker processes: each server and worker heartbeats its row; the overview lists them, and
the background jobs' last runs (record_job_run).

See docs/architecture.md#processes. The heartbeat is per process (broker/background.py starts
its thread in every Daphne process and in the Celery worker), not a cluster job; purging rows
dead for a day is one (core/periodic.py).
"""

import os
import socket

from django.db import transaction

import broker
from broker import models
from broker import settings as ferry_settings
from broker.core import log, outages
from broker.core.records import Principal, ProcessInfo

DAY_MS = 24 * 3600 * 1000
KINDS = ("server", "worker")

# When this process first heartbeat: its start, as far as the table is concerned.
_started_ms: int | None = None


def process_name() -> str:
    """This process's name in the table: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def heartbeat(kind: str = "server") -> None:
    """Insert or refresh this process's row with the time now."""
    global _started_ms
    now = log.now_ms()
    if _started_ms is None:
        _started_ms = now
    name = process_name()
    fields = {
        "kind": kind,
        "version": broker.VERSION,
        "started_ms": _started_ms,
        "heartbeat_ms": now,
    }
    with transaction.atomic(durable=True):
        # A row under this name from an earlier process (a reused pid) is taken over.
        if not models.BrokerProcess.objects.filter(name=name).update(**fields):
            models.BrokerProcess.objects.create(name=name, **fields)


def list_processes(principal: Principal, alive_within_ms: int = 30_000) -> tuple[ProcessInfo, ...]:
    """Every known process, newest heartbeat first; alive if it beat within alive_within_ms.

    Any principal may list them: they name hosts and versions, no topic's data.
    """
    now = log.now_ms()
    return tuple(
        ProcessInfo(
            name=row.name,
            kind=row.kind,
            version=row.version,
            started_ms=row.started_ms,
            heartbeat_ms=row.heartbeat_ms,
            alive=now - row.heartbeat_ms <= alive_within_ms,
        )
        for row in models.BrokerProcess.objects.order_by("-heartbeat_ms", "name")
    )


def purge_processes() -> int:
    """Forget processes silent for a day; returns how many."""
    with transaction.atomic(durable=True):
        count, _ = models.BrokerProcess.objects.filter(
            heartbeat_ms__lt=log.now_ms() - DAY_MS
        ).delete()
    return int(count)


# When this process last wrote each job's successful run (record_job_run).
_ok_written_ms: dict[str, int] = {}


def record_job_run(name: str, failure: BaseException | None = None) -> None:
    """Note a run of background job name by this process: ok, or failed with failure.

    Called by whatever runs the jobs (broker/background.py, broker/tasks.py, in the process the
    job ran in: a Celery worker's child). A success is written at most once a heartbeat interval
    a job (release_due runs five times a second), a failure at once, and the first success after
    a failure at once too, so the overview's state follows within that interval.
    """
    now = log.now_ms()
    every_ms = float(ferry_settings.get("PROCESS_HEARTBEAT_SECONDS")) * 1000
    if failure is None and now - _ok_written_ms.get(name, -(10**15)) < every_ms:
        return
    if failure is not None:
        _ok_written_ms.pop(name, None)
        values = {"failed_ms": now, "error": f"{type(failure).__name__}: {failure}"[:300]}
    else:
        _ok_written_ms[name] = now
        values = {"ok_ms": now, "ok_by": process_name()}
    try:
        # One statement whoever wrote first: INSERT … ON CONFLICT (name) DO UPDATE.
        models.JobRun.objects.bulk_create(
            [models.JobRun(name=name, **values)],
            update_conflicts=True,
            unique_fields=["name"],
            update_fields=list(values),
        )
    except outages.ERRORS as exc:
        if outages.classify(exc) is None:
            raise
        # The database is away: the job's own failure said so, once; the next run writes.
        _ok_written_ms.pop(name, None)
