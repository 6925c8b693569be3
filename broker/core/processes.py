"""Broker processes: each server and worker heartbeats its row; the overview lists them.

See docs/architecture.md#processes. The heartbeat is per process (broker/background.py starts
its thread in every Daphne process and in the Celery worker), not a cluster job; purging rows
dead for a day is one (core/periodic.py).
"""

import os
import socket

from django.db import transaction

import broker
from broker import models
from broker.core import log
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
