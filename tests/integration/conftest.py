"""Real servers on loopback for the integration tests: Daphne on the test database, Redis."""

import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.db import connection

from broker import settings as ferry_settings

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a process that works on this test run's database."""
    return dict(
        os.environ,
        FERRY_TEST_DB_NAME=str(connection.settings_dict["NAME"]),
        DJANGO_SETTINGS_MODULE="tests.settings",
        **extra,
    )


def server_log(url: str) -> Path:
    """Where start_daphne writes the output of the server at url."""
    port = url.rsplit(":", 1)[1]
    return Path(os.environ.get("FERRY_TEST_DIR", tempfile.gettempdir())) / f"daphne-{port}.log"


def start_daphne(
    env: dict[str, str] | None = None, **extra_env: str
) -> tuple[subprocess.Popen[bytes], str]:
    """A Daphne process serving mqsite.asgi; returns it and its base URL once it is healthy.

    Started as scripts/run starts it: Daphne's WebSocket limit is FERRY_WS_MAX_FRAME_BYTES. It
    works on this run's test database, unless env (a whole environment) says otherwise.
    """
    port = free_port()
    ws_max = extra_env.get("FERRY_WS_MAX_FRAME_BYTES") or str(
        ferry_settings.get("WS_MAX_FRAME_BYTES")
    )
    log_path = server_log(f"http://127.0.0.1:{port}")
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "--websocket-max-message-size",
                ws_max,
                "--websocket-max-frame-size",
                ws_max,
                "mqsite.asgi:application",
            ],
            cwd=ROOT,
            env=dict(env, **extra_env) if env is not None else server_env(**extra_env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    if not healthy(url, alive=lambda: proc.poll() is None):
        stop(proc)
        raise RuntimeError(f"daphne did not start: {log_path.read_text()[-2000:]}")
    return proc, url


def healthy(
    url: str, *, verify: ssl.SSLContext | bool = True, alive: Callable[[], bool] = lambda: True
) -> bool:
    """Whether GET url/api/v1/health answers 200 within START_TIMEOUT_S (while alive())."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while alive() and time.monotonic() <= deadline:
        try:
            if httpx.get(f"{url}/api/v1/health", verify=verify, timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


HAPROXY = str(ROOT / "scripts" / "haproxy")


@contextmanager
def balancer(*servers: str, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """scripts/haproxy in front of servers (HOST:PORT) on a free port, in a directory of its
    own: its URL (https:// when env names FERRY_LB_CERT); stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="ferry-lb-") as workdir:
        started = subprocess.run(
            [HAPROXY, "start", workdir, f"127.0.0.1:{free_port()}", *servers],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        try:
            assert started.returncode == 0, started.stderr[-2000:]
            yield started.stdout.strip().splitlines()[-1]
        finally:
            subprocess.run([HAPROXY, "stop", workdir], check=False)


def sign_in(client: httpx.Client, username: str, password: str, origin: str) -> httpx.Response:
    """The console's sign-in as a browser makes it: the form's CSRF cookie, then the POST from
    origin (the scheme, host and port the browser shows); the answer (302 when it worked)."""
    client.get("/login/")
    return client.post(
        "/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Origin": origin, "Referer": f"{origin}/login/"},
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a process we started, by its PID, and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def broker_url(django_db_setup, django_db_blocker) -> Iterator[str]:
    """Base URL of a Daphne process running mqsite.asgi against the test database."""
    with django_db_blocker.unblock():
        proc, url = start_daphne()
    try:
        yield url
    finally:
        stop(proc)
        with django_db_blocker.unblock():
            wait_for_sessions_to_end()


@dataclass(frozen=True)
class TlsBroker:
    """The suite's Daphne behind HAProxy with TLS: its https:// URL, and the self-signed
    certificate's .crt that a client trusts (scripts/haproxy cert)."""

    url: str
    ca_file: Path


@pytest.fixture(scope="session")
def tls_broker(broker_url: str) -> Iterator[TlsBroker]:
    """scripts/haproxy with FERRY_LB_CERT in front of broker_url, as the README's production
    set-up has it; stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="ferry-tls-") as workdir:
        made = subprocess.run(
            [HAPROXY, "cert", workdir, "broker.test"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        env = dict(os.environ, FERRY_LB_CERT=made.stdout.strip().splitlines()[-1])
        with balancer(broker_url.removeprefix("http://"), env=env) as url:
            tls = TlsBroker(url, Path(workdir) / "broker.test.crt")
            # HAProxy's first health check must pass before it sends requests on.
            context = ssl.create_default_context(cafile=str(tls.ca_file))
            assert healthy(tls.url, verify=context), "HAProxy did not serve the broker"
            yield tls


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A private Redis on loopback, started (and installed if missing) by scripts/redis."""
    with tempfile.TemporaryDirectory(prefix="ferry-redis-") as directory:
        started = subprocess.run(
            [str(ROOT / "scripts" / "redis"), "start", directory, str(free_port())],
            check=True,
            capture_output=True,
            text=True,
        )
        try:
            yield started.stdout.strip().splitlines()[-1]
        finally:
            subprocess.run([str(ROOT / "scripts" / "redis"), "stop", directory], check=False)


def other_sessions() -> set[int]:
    """Backend pids of the test database's sessions that may yet end: those of processes that
    stopped, or of unknown ones (PostgreSQL; empty on SQLite).

    A test process names its sessions after its pid (tests/settings.py). Those of a process
    still running (this one's pool, the session's Daphne) stay open as long as it runs:
    waiting for them would only time out.
    """
    if connection.vendor != "postgresql":
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        rows = cursor.fetchall()
    return {pid for pid, name in rows if not _of_a_running_process(name)}


def _of_a_running_process(application_name: str) -> bool:
    named = re.fullmatch(r"ferry-tests (\d+)", application_name)
    if named is None:
        return False
    try:
        os.kill(int(named[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def wait_for_sessions_to_end(keep: set[int] | None = None, timeout_s: float = 15) -> None:
    """On PostgreSQL, wait until sessions other than keep (killed or stopped processes') end.

    A killed client's server backend ends once it notices the closed socket; the test database
    can only be flushed or dropped after that.
    """
    deadline = time.monotonic() + timeout_s
    while other_sessions() - (keep or set()) and time.monotonic() < deadline:
        time.sleep(0.05)
