"""Runs core/periodic.py's jobs inside the server process: the embedded default's scheduler.

See docs/architecture.md#background-jobs. In production Celery beat runs the same table and
FERRY_BACKGROUND_IN_PROCESS=0 turns this runner off.
"""

import logging
import threading
import time

from django.db import close_old_connections

from broker import settings as ferry_settings
from broker.core import periodic

logger = logging.getLogger(__name__)

_started = False
_start_lock = threading.Lock()
_stop = threading.Event()


def _loop() -> None:
    next_run = {job.name: time.monotonic() + job.interval_seconds for job in periodic.JOBS}
    while not _stop.is_set():
        now = time.monotonic()
        for job in periodic.JOBS:
            if now < next_run[job.name]:
                continue
            try:
                result = job.run()
                if result:
                    logger.info("%s: %s", job.name, result)
            except Exception:
                logger.exception("background job %s failed", job.name)
            finally:
                close_old_connections()
            next_run[job.name] = time.monotonic() + job.interval_seconds
        _stop.wait(max(0.05, min(next_run.values()) - time.monotonic()))


def start() -> bool:
    """Start the runner thread once per process when FERRY_BACKGROUND_IN_PROCESS is on."""
    global _started
    if not ferry_settings.get("BACKGROUND_IN_PROCESS"):
        return False
    with _start_lock:
        if _started:
            return True
        _started = True
    threading.Thread(target=_loop, name="ferry-background", daemon=True).start()
    return True


def stop() -> None:
    _stop.set()
