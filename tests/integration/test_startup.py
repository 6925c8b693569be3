"""Start-up checks against real processes started as the docs say (docs/operations.md).

Daphne, the Celery worker and scripts/run's pre-migrate check each refuse to start on an
unreachable database, unapplied migrations or an unreachable Redis: one line on stderr, a
non-zero exit, no traceback.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, free_port, server_env

EXIT_WITHIN_S = 60


def closed_port() -> int:
    """A loopback port nothing listens on (just freed)."""
    return free_port()


def bare_env(**extra: str) -> dict[str, str]:
    """The production settings (mqsite.settings) with only the given Ferry variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FERRY_", "DATABASE_URL", "REDIS_URL", "DJANGO_"))
    }
    env["DJANGO_SETTINGS_MODULE"] = "mqsite.settings"
    env.update(extra)
    return env


def daphne_command() -> list[str]:
    # As README.md's production command (tests/unit/test_serving.py checks the flags).
    return [
        sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(free_port()),
        "mqsite.asgi:application",
    ]  # fmt: skip


def celery_command() -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "mqsite", "worker", "-B", "--loglevel=info"]


def run_to_exit(command: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[int, str]:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=EXIT_WITHIN_S
    )
    return done.returncode, done.stderr


def assert_one_clear_line(code: int, stderr: str, *words: str) -> str:
    assert code != 0, stderr
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    (line,) = lines
    assert line.startswith("Ferry: "), line
    for word in words:
        assert word in line, line
    return line


def test_daphne__database_unreachable(tmp_path):
    port = closed_port()
    env = bare_env(
        DATABASE_URL=f"postgres://ferry:s3cret@127.0.0.1:{port}/ferry", FERRY_DATA_DIR=str(tmp_path)
    )
    code, stderr = run_to_exit(daphne_command(), env)
    line = assert_one_clear_line(code, stderr, f"127.0.0.1:{port}/ferry", "cannot be reached")
    assert "s3cret" not in line
    assert "DATABASE_URL" in line


def test_daphne__unmigrated_sqlite_data_dir(tmp_path):
    data_dir = tmp_path / "var"
    data_dir.mkdir(mode=0o700)
    code, stderr = run_to_exit(daphne_command(), bare_env(FERRY_DATA_DIR=str(data_dir)))
    assert_one_clear_line(code, stderr, "migrations are not applied", "manage.py migrate")


@pytest.mark.django_db
def test_daphne__redis_unreachable():
    port = closed_port()
    env = server_env(REDIS_URL=f"redis://:pw@127.0.0.1:{port}/0")
    code, stderr = run_to_exit(daphne_command(), env)
    line = assert_one_clear_line(code, stderr, "Redis", f"127.0.0.1:{port}", "REDIS_URL")
    assert "pw@" not in line


@pytest.mark.django_db
def test_daphne__starts_when_all_is_well():
    # The checks pass on the test database: a server that answers (conftest's start_daphne).
    from tests.integration.conftest import start_daphne, stop

    proc, _url = start_daphne()
    stop(proc)


@pytest.mark.django_db
def test_celery_worker__redis_unreachable():
    env = server_env(REDIS_URL=f"redis://127.0.0.1:{closed_port()}/0")
    code, stderr = run_to_exit(celery_command(), env)
    assert_one_clear_line(code, stderr, "Redis", "cannot be reached")


def test_celery_worker__database_unreachable(tmp_path):
    port = closed_port()
    env = bare_env(
        DATABASE_URL=f"postgres://ferry:x@127.0.0.1:{port}/ferry", FERRY_DATA_DIR=str(tmp_path)
    )
    code, stderr = run_to_exit(celery_command(), env)
    assert_one_clear_line(code, stderr, "database", "cannot be reached")


def test_scripts_run__checks_before_migrating(tmp_path):
    """scripts/run's first step after setup: the pre-migrate check, then migrate."""
    text = (ROOT / "scripts" / "run").read_text()
    check = ".venv/bin/python -m broker.startup --before-migrate"
    assert text.index(check) < text.index("manage.py migrate")
    port = closed_port()
    env = bare_env(DATABASE_URL=f"postgres://ferry:x@127.0.0.1:{port}/ferry")
    command = [sys.executable, "-m", "broker.startup", "--before-migrate"]
    code, stderr = run_to_exit(command, env)
    assert_one_clear_line(code, stderr, "cannot be reached")
    # Before migrating, an empty data directory passes: migrate comes next.
    data_dir = tmp_path / "var"
    data_dir.mkdir(mode=0o700)
    code, stderr = run_to_exit(command, bare_env(FERRY_DATA_DIR=str(data_dir)))
    assert (code, stderr) == (0, "")


@pytest.mark.django_db
def test_daphne__a_setting_of_the_wrong_kind():
    # As docs/operations.md#start-up-checks shows it: before the database is even asked.
    env = server_env(FERRY_WS_PUSH_BATCH="2k")
    code, stderr = run_to_exit(daphne_command(), env)
    line = assert_one_clear_line(code, stderr)
    assert line == (
        "Ferry: FERRY_WS_PUSH_BATCH='2k' is not an integer (its default: 2000); "
        "correct it or unset it"
    )
