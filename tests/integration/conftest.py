"""A real Daphne process serving the test database on loopback, shared by the integration tests."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def broker_url(django_db_setup, django_db_blocker) -> Iterator[str]:
    """Base URL of a Daphne process running mqsite.asgi against the test database."""
    with django_db_blocker.unblock():
        db_name = str(connection.settings_dict["NAME"])
    port = free_port()
    env = dict(os.environ, FERRY_TEST_DB_NAME=db_name, DJANGO_SETTINGS_MODULE="tests.settings")
    log_path = Path(os.environ.get("FERRY_TEST_DIR", "/tmp")) / f"daphne-{port}.log"
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
                "mqsite.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/api/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
