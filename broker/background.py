"""Runs core/periodic.py's jobs inside the server process: the embedded default's scheduler.

See docs/architecture.md#background-jobs. In production Celery beat runs the same table and
FERRY_BACKGROUND_IN_PROCESS=0 turns this runner off. The process heartbeat (Heartbeat) is not a
job of the table: every server and worker process runs its own, whatever runs the jobs.
"""

import logging
import threading
import time

from django.db import close_old_connections

from broker import settings as ferry_settings
from broker.core import keys, outages, periodic, processes

logger = logging.getLogger(__name__)


class Runner:
    """A daemon thread that runs its jobs every interval_seconds, one job at a time."""

    def __init__(self, jobs: tuple[periodic.Job, ...] = periodic.JOBS) -> None:
        self.jobs = jobs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ferry-background", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        next_run = {job.name: time.monotonic() + job.interval_seconds for job in self.jobs}
        while not self._stop.is_set():
            for job in self.jobs:
                if time.monotonic() < next_run[job.name]:
                    continue
                failure: Exception | None = None
                try:
                    result = job.run()
                    if result:
                        logger.info("%s: %s", job.name, result)
                except Exception as exc:
                    # One failing round must not stop the scheduler; the next round retries.
                    outages.log_failure(logger, f"background job {job.name}", exc)
                    failure = exc
                try:
                    processes.record_job_run(job.name, failure)
                except Exception as exc:
                    outages.log_failure(logger, f"recording background job {job.name}", exc)
                finally:
                    close_old_connections()
                next_run[job.name] = time.monotonic() + job.interval_seconds
            self._stop.wait(max(0.01, min(next_run.values()) - time.monotonic()))


class Heartbeat:
    """A daemon thread that keeps this process's row in the process table fresh.

    Every FERRY_PROCESS_HEARTBEAT_SECONDS: core/processes.heartbeat, then keys.flush_last_used
    (the keys' last-use times this process noted since the last round).
    """

    def __init__(self, kind: str = "server") -> None:
        self.kind = kind
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ferry-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def beat(self) -> None:
        try:
            processes.heartbeat(self.kind)
            keys.flush_last_used()
        except Exception as exc:
            # A busy or unreachable database must not end the thread; the next round retries.
            outages.log_failure(logger, "process heartbeat", exc)
        finally:
            close_old_connections()

    def _loop(self) -> None:
        while True:
            self.beat()
            if self._stop.wait(float(ferry_settings.get("PROCESS_HEARTBEAT_SECONDS"))):
                return


_heartbeat: list[Heartbeat] = []
_runners: list[Runner] = []
_runners_lock = threading.Lock()


def start_heartbeat(kind: str = "server") -> bool:
    """Start this process's heartbeat once, unless FERRY_PROCESS_HEARTBEAT is off (tests)."""
    if not ferry_settings.get("PROCESS_HEARTBEAT"):
        return False
    with _runners_lock:
        if not _heartbeat:
            _heartbeat.append(Heartbeat(kind))
            _heartbeat[0].start()
    return True


def start() -> bool:
    """Start this process's heartbeat, and its runners once when FERRY_BACKGROUND_IN_PROCESS is on.

    One thread per job: a long retention round must not hold back the scheduler's releases.
    """
    start_heartbeat("server")
    if not ferry_settings.get("BACKGROUND_IN_PROCESS"):
        return False
    with _runners_lock:
        if not _runners:
            _runners.extend(Runner((job,)) for job in periodic.JOBS)
            for runner in _runners:
                runner.start()
    return True


def stop(timeout_s: float) -> None:
    """Stop this process's runners and heartbeat (a shutdown), waiting at most timeout_s in all.

    A job in the middle of a round finishes it first; the threads are daemons, so one still
    running at the deadline ends with the process (its open transaction rolls back).
    """
    deadline = time.monotonic() + timeout_s
    with _runners_lock:
        threads: list[Runner | Heartbeat] = [*_runners, *_heartbeat]
    for thread in threads:
        thread._stop.set()
    for thread in threads:
        thread._thread.join(max(0.0, deadline - time.monotonic()))
