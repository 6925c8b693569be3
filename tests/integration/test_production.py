"""The README's production section, run as written: PostgreSQL, Redis, two Daphnes, Celery.

The commands are read from README.md's code block, so the test and the page cannot drift. What
the test changes, and only that: the services' directories and ports (private ones on
loopback), `-b 0.0.0.0 -p 8000` (loopback, free ports), the placeholders (`…`) and the URLs of
the services it started; `scripts/setup` is skipped (the suite's own set-up made `.venv`).
"""

import os
import re
import secrets
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ROOT, free_port, stop

pytestmark = [pytest.mark.integration]
WAIT_S = 30


def readme_commands() -> list[str]:
    """The production section's shell lines, continuations joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## PostgreSQL and Redis (production)", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    joined = re.sub(r"\\\n\s*", " ", block.group(1))
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def fresh_env(data_dir: Path) -> dict[str, str]:
    """A shell's environment on a fresh machine: nothing of the test run's settings."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["FERRY_DATA_DIR"] = str(data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Deployment:
    """What the README's commands started: services, servers, and how to stop them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.env = fresh_env(workdir / "data")
        self.services: list[tuple[str, Path]] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self.key = ""
        self.host = ""

    def run(self, line: str) -> None:
        argv = shlex.split(line)
        if argv[0] == "scripts/setup":
            return
        if argv[0] == "scripts/redis" and argv[1] == "start":
            self.env["REDIS_URL"] = self._service("redis", argv[:2])
        elif argv[0] == "export":
            for assignment in argv[1:]:
                name, _, value = assignment.partition("=")
                self._export(name, value)
        elif argv[0].endswith("bin/daphne"):
            for _ in range(2):  # "one per port or host, as many as you like": two
                self._daphne(argv)
        elif argv[0].endswith("bin/celery"):
            self._start("celery", argv)
        else:
            done = subprocess.run(
                argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, f"{line}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
            if "bootstrap" in argv:
                found = re.search(r"API key \(shown once\): (fry_\S+)", done.stdout)
                assert found, done.stdout
                self.key = found.group(1)

    def _export(self, name: str, value: str) -> None:
        if name == "DATABASE_URL":
            # What `make services` does: a PostgreSQL of our own on loopback.
            value = self._service("postgres", ["scripts/postgres", "start"])
        elif name == "REDIS_URL" and "REDIS_URL" in self.env:
            value = self.env["REDIS_URL"]  # the one scripts/redis started and printed
        elif "…" in value:
            value = secrets.token_urlsafe(40)
        if name == "DJANGO_ALLOWED_HOSTS":
            self.host = value.split(",")[0]
        self.env[name] = value

    def _service(self, name: str, argv: list[str]) -> str:
        directory = self.workdir / name
        started = subprocess.run(
            [*argv, str(directory), str(free_port())],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.services.append((argv[0], directory))
        return started.stdout.strip().splitlines()[-1]

    def _daphne(self, argv: list[str]) -> None:
        port = free_port()
        argv = list(argv)
        argv[argv.index("-b") + 1] = "127.0.0.1"  # loopback only, whatever the README binds
        argv[argv.index("-p") + 1] = str(port)
        self._start(f"daphne-{port}", argv)
        self.urls.append(f"http://127.0.0.1:{port}")

    def _start(self, name: str, argv: list[str]) -> None:
        with open(self.workdir / f"{name}.log", "wb") as out:
            self.processes.append(
                subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
            )

    def logs(self) -> str:
        return "\n".join(p.read_text()[-1500:] for p in self.workdir.glob("*.log"))

    def stop(self) -> None:
        for proc in self.processes:
            stop(proc)
        for script, directory in reversed(self.services):
            subprocess.run([script, "stop", str(directory)], cwd=ROOT, check=False)


@pytest.fixture
def deployment() -> Iterator[Deployment]:
    with tempfile.TemporaryDirectory(prefix="ferry-readme-") as workdir:
        deployed = Deployment(Path(workdir))
        # scripts/postgres runs the server as its own user when we are root: it must reach it.
        deployed.workdir.chmod(0o755)
        (deployed.workdir / "data").mkdir(mode=0o700)
        try:
            for line in readme_commands():
                deployed.run(line)
            yield deployed
        finally:
            deployed.stop()


def wait_until(condition, what: str, deployment: Deployment) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{deployment.logs()}"
        time.sleep(0.1)


def healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def test_readme_production__produce_and_consume_through_both_processes(deployment):
    assert deployment.key
    assert deployment.host
    assert len(deployment.urls) == 2
    headers = {"Authorization": f"Bearer {deployment.key}", "Host": deployment.host}
    a, b = (
        httpx.Client(base_url=f"{url}/api/v1", headers=headers, timeout=30)
        for url in deployment.urls
    )
    with a, b:
        for client in (a, b):
            wait_until(lambda c=client: healthy(c), "Daphne to serve", deployment)
        assert a.post("/topics", json={"name": "orders", "partitions": 2}).status_code == 201
        sent = a.post("/topics/orders/messages", json={"messages": [{"value": "via A"}]})
        assert sent.status_code == 200
        polled = b.post("/groups/g/poll", json={"topic": "orders", "auto_commit": True})
        assert [m["value"] for m in polled.json()["messages"]] == ["via A"]

        # A long poll on A is woken by a produce on B, through Redis, long before its wait ends.
        started = time.monotonic()
        with httpx.Client(timeout=30) as side:
            pending = side.build_request(
                "POST",
                f"{deployment.urls[0]}/api/v1/groups/g/poll",
                json={"topic": "orders", "auto_commit": True, "max_wait_ms": 20_000},
                headers=headers,
            )
            answer: list[httpx.Response] = []
            waiter = threading.Thread(target=lambda: answer.append(side.send(pending)))
            waiter.start()
            time.sleep(0.5)
            assert (
                b.post(
                    "/topics/orders/messages", json={"messages": [{"value": "via B"}]}
                ).status_code
                == 200
            )
            waiter.join(30)
        assert [m["value"] for m in answer[0].json()["messages"]] == ["via B"]
        assert time.monotonic() - started < 10

        # A delayed message is released by the Celery worker's beat (no in-process jobs).
        delayed = b.post(
            "/topics/orders/messages", json={"messages": [{"value": "later", "delay_ms": 300}]}
        )
        assert delayed.status_code == 200
        got: list[str] = []

        def released() -> bool:
            result = a.post("/groups/g/poll", json={"topic": "orders", "auto_commit": True})
            got.extend(m["value"] for m in result.json()["messages"])
            return got == ["later"]

        wait_until(released, "Celery beat to release the delayed message", deployment)
        # A Host the deployment does not name is refused, on the API too.
        refused = a.get("/topics", headers={"Host": "127.0.0.1"})
        assert refused.json()["error"]["code"] == "invalid_host"
    # Beat's schedule went to the data directory, not into the checkout.
    assert list((deployment.workdir / "data").glob("celerybeat-schedule*"))
    assert not list(ROOT.glob("celerybeat-schedule*"))
