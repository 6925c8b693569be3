"""Test settings: the real settings, a file SQLite database (WAL needs a file) or PostgreSQL."""

import os
import tempfile
from pathlib import Path

from mqsite.settings import *  # noqa: F403
from mqsite.settings import DATABASES

FERRY_BACKGROUND_IN_PROCESS = False
# The test process must not heartbeat (broker/background.py): it would write behind the tests.
FERRY_PROCESS_HEARTBEAT = False
# Core calls run on the caller's thread, so a test's transaction is visible to the API.
FERRY_DB_THREADS = 0
# Every request asks the database, so tests see revocations at once (tests/core/test_keys.py
# covers the cache).
FERRY_AUTH_CACHE_SECONDS: float = 0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

_default = DATABASES["default"]
if _default["ENGINE"].endswith("postgresql"):
    # Each process's sessions named after it (pg_stat_activity.application_name), so that a
    # test waiting for a stopped server's sessions to end does not wait for those of a process
    # still running (tests/integration/conftest.py's other_sessions).
    _default.setdefault("OPTIONS", {})["application_name"] = f"ferry-tests {os.getpid()}"
if _default["ENGINE"].endswith("sqlite3"):
    _test_dir = Path(os.environ.get("FERRY_TEST_DIR", tempfile.gettempdir()))
    _default["TEST"] = {"NAME": str(_test_dir / f"ferry-test-{os.getpid()}.sqlite3")}

# Worker processes started by tests (concurrent producers, live Daphne servers) open the
# test database by this name instead of creating one.
if os.environ.get("FERRY_TEST_DB_NAME"):
    _default["NAME"] = os.environ["FERRY_TEST_DB_NAME"]
    # Servers started by tests run like production: core calls on database threads, and
    # authenticated keys remembered for a second.
    FERRY_DB_THREADS = -1
    FERRY_AUTH_CACHE_SECONDS = 1.0
    # Off unless a test turns it on: the session's server must not run jobs over other tests.
    FERRY_BACKGROUND_IN_PROCESS = os.environ.get("FERRY_BACKGROUND_IN_PROCESS") == "1"
    # Live servers heartbeat like production ones (tests/integration/test_processes.py).
    FERRY_PROCESS_HEARTBEAT = True
