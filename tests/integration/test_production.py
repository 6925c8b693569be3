"""The README's production section, run as written: PostgreSQL, Redis, two Daphnes behind
HAProxy with TLS, Celery.

The commands are read from README.md's code block, so the test and the page cannot drift. What
the test changes, and only that: the services' directories and ports (private ones on
loopback, free ports for Daphne and HAProxy), the placeholders (`…`), the URLs of the services
it started, and `FERRY_LB_CERT` (a self-signed certificate for the README's host and
127.0.0.1, from `scripts/haproxy cert`); `scripts/setup` is skipped (the suite's own set-up
made `.venv`).
"""

import asyncio
import os
import re
import secrets
import shlex
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import psycopg
import pytest
import websockets

from ferry_client.partitioner import partition_for_key
from tests.integration.conftest import ROOT, free_port, sign_in, stop

pytestmark = [
    pytest.mark.integration,
    # Its stack is its own (a PostgreSQL, a Redis, HAProxy), whatever database the suite runs
    # on: make test runs it once, in the SQLite pass.
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")),
        reason="runs in the SQLite pass; its PostgreSQL is its own",
    ),
]
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


def test_operations_doc__the_load_balancer_config_is_what_scripts_haproxy_prints():
    """docs/operations.md shows `scripts/haproxy config`'s output for the README's set-up."""
    text = (ROOT / "docs" / "operations.md").read_text()
    shown = re.search(r"```console\n\$ (scripts/haproxy config .*?)\n(.*?)```", text, re.S)
    assert shown is not None
    env = {
        "PATH": os.environ["PATH"],
        "DJANGO_ALLOWED_HOSTS": "broker.example.com",
        "FERRY_LB_CERT": "/etc/ssl/private/broker.pem",
    }
    printed = subprocess.run(
        shlex.split(shown.group(1)), cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert printed.stdout == shown.group(2)


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
        self.ports: dict[str, str] = {}  # the README's Daphne ports, to the free ones used
        self.daphnes: dict[str, subprocess.Popen[bytes]] = {}  # by the port used
        self.balancer = ""
        self.key = ""
        self.login = ("", "")  # the console's user and password, from the bootstrap
        self.host = ""

    def run(self, line: str) -> None:
        argv = shlex.split(line)
        env = dict(self.env)
        while "=" in argv[0]:  # VAR=value before the command: for that command only
            name, _, _ = argv.pop(0).partition("=")
            assert name == "FERRY_LB_CERT", line
            env[name] = self._certificate()
        if argv[0] == "scripts/setup":
            return
        if argv[:2] == ["scripts/haproxy", "start"]:
            self.balancer = self._balancer(argv, env)
            return
        if argv[0] == "scripts/redis" and argv[1] == "start":
            self.env["REDIS_URL"] = self._service("redis", argv[:2])
        elif argv[0] == "export":
            for assignment in argv[1:]:
                name, _, value = assignment.partition("=")
                self._export(name, value)
        elif argv[0].endswith("bin/daphne"):
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
                login = re.search(r"Dashboard login: (\S+) / (\S+)", done.stdout)
                assert login, done.stdout
                self.login = (login.group(1), login.group(2))

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
        self.ports[argv[argv.index("-p") + 1]] = str(port)
        argv[argv.index("-p") + 1] = str(port)
        self._start(f"daphne-{port}", argv)
        self.daphnes[str(port)] = self.processes[-1]
        self.urls.append(f"http://127.0.0.1:{port}")

    def _balancer(self, argv: list[str], env: dict[str, str]) -> str:
        """scripts/haproxy start, on a free port, in front of the Daphnes the README started."""
        directory = self.workdir / "haproxy"
        servers = []
        for server in argv[4:]:
            host, _, port = server.rpartition(":")
            servers.append(f"{host}:{self.ports[port]}")
        self.services.append((argv[0], directory))  # stopped afterwards, even if it failed
        started = subprocess.run(
            [*argv[:2], str(directory), f"127.0.0.1:{free_port()}", *servers],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert started.returncode == 0, started.stderr[-2000:]
        return started.stdout.strip().splitlines()[-1]

    def _certificate(self) -> str:
        """scripts/haproxy cert: a self-signed certificate for the README's host and 127.0.0.1."""
        made = subprocess.run(
            ["scripts/haproxy", "cert", str(self.workdir / "tls"), self.host],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return made.stdout.strip().splitlines()[-1]

    def _start(self, name: str, argv: list[str]) -> None:
        with open(self.workdir / f"{name}.log", "wb") as out:
            self.processes.append(
                subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
            )

    def serving_websocket(self) -> subprocess.Popen[bytes]:
        """The Daphne that accepted the one WebSocket opened so far (its access log says so)."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for port, proc in self.daphnes.items():
                if "WSCONNECT /ws/v1/" in (self.workdir / f"daphne-{port}.log").read_text():
                    return proc
            time.sleep(0.1)
        raise AssertionError(f"no Daphne logged the WebSocket:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text()[-1500:] for p in self.workdir.glob("*.log"))

    def stop(self) -> None:
        for proc in self.processes:
            stop(proc)
        for script, directory in reversed(self.services):
            subprocess.run([script, "stop", str(directory)], cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    """One deployment for the module's tests; the last one stops a Daphne."""
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

        # The worker's runs reach the console's Background jobs table (from its pool's child).
        def worker_reports_its_runs() -> bool:
            with psycopg.connect(deployment.env["DATABASE_URL"]) as conn:
                rows = conn.execute(
                    "SELECT ok_ms FROM broker_jobrun WHERE name = 'release_due'"
                ).fetchall()
            return bool(rows) and rows[0][0] is not None

        wait_until(worker_reports_its_runs, "the worker to report its job runs", deployment)
        # A Host the deployment does not name is refused, on the API too.
        refused = a.get("/topics", headers={"Host": "127.0.0.1"})
        assert refused.json()["error"]["code"] == "invalid_host"
    # Beat's schedule went to the data directory, not into the checkout.
    assert list((deployment.workdir / "data").glob("celerybeat-schedule*"))
    assert not list(ROOT.glob("celerybeat-schedule*"))


def test_readme_production__one_address_in_front_of_both_processes(deployment):
    """HAProxy (scripts/haproxy, with TLS) in front of both Daphnes: REST and a WebSocket through
    one address, both processes serving; the console signed in over HTTPS, its live socket
    too; the client's own address in the audit log and in /metrics' loopback rule; a Daphne
    stopped with SIGTERM skipped, no request failed."""
    assert deployment.balancer.startswith("https://127.0.0.1:")
    trusted = deployment.workdir / "tls" / f"{deployment.host}.crt"
    context = ssl.create_default_context(cafile=str(trusted))
    headers = {"Authorization": f"Bearer {deployment.key}", "Host": deployment.host}
    # From 127.0.0.2: this machine, but not the 127.0.0.1 HAProxy itself connects from, so the
    # broker shows whose address it took.
    transport = httpx.HTTPTransport(verify=context, local_address="127.0.0.2")
    lb = httpx.Client(
        base_url=f"{deployment.balancer}/api/v1", headers=headers, transport=transport, timeout=30
    )
    with lb:
        wait_until(lambda: healthy(lb), "HAProxy to serve", deployment)
        created = lb.post(
            "/topics",
            json={"name": "behind-lb", "partitions": 2},
            headers={"X-Forwarded-For": "127.0.0.1"},  # a client's own header is replaced
        )
        assert created.status_code == 201, created.text[:500]
        # The console's HSTS: Django saw HAProxy's X-Forwarded-Proto (FERRY_HTTPS=1 trusts it).
        login = lb.get(f"{deployment.balancer}/login/")
        assert login.status_code == 200
        assert "strict-transport-security" in login.headers
        # /metrics answers loopback only (FERRY_METRICS_AUTH): a scraper on a Daphne's own port,
        # not a client through HAProxy, even one that says it is 127.0.0.1.
        metrics = f"{deployment.balancer}/metrics"
        assert lb.get(metrics, headers={"X-Forwarded-For": "127.0.0.1"}).status_code == 403
        assert httpx.get(f"{deployment.urls[0]}/metrics", headers=headers).status_code == 200
        # Both processes answer through the address, once HAProxy's checks have seen both up
        # (a Daphne still starting when HAProxy did is down for a few checks first).
        probes: list[str] = []

        def answered() -> list[set[str]]:
            logs = [
                (deployment.workdir / f"daphne-{port}.log").read_text()
                for port in deployment.daphnes
            ]
            return [{probe for probe in probes if f"probe={probe}" in log} for log in logs]

        def both_answer() -> bool:
            probes.append(secrets.token_hex(4))
            assert lb.get("/health", params={"probe": probes[-1]}).status_code == 200
            return all(answered())

        wait_until(both_answer, "both processes to answer through HAProxy", deployment)
        # And each probe was answered by one of them (its line written as it was answered).
        wait_until(
            lambda: set.union(*answered()) == set(probes), "the probes' log lines", deployment
        )

        entry = subprocess.run(
            [
                *(".venv/bin/python", "manage.py", "shell", "-c"),
                "from broker.models import AuditEntry as A; "
                "print(A.objects.get(action='topic.create', target='behind-lb').client_ip)",
            ],
            cwd=ROOT,
            env=deployment.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert entry.stdout.split()[-1:] == ["127.0.0.2"], entry.stdout + entry.stderr

        # The console through the same address, as a browser: signed in over HTTPS (Secure
        # cookies, the CSRF check against the https origin), a page, and the live socket.
        port = deployment.balancer.rsplit(":", 1)[1]
        origin = f"https://{deployment.host}:{port}"
        with httpx.Client(
            base_url=deployment.balancer,
            headers={"Host": f"{deployment.host}:{port}"},
            transport=httpx.HTTPTransport(verify=context),
        ) as browser:
            username, password = deployment.login
            signed_in = sign_in(browser, username, password, origin)
            assert signed_in.status_code == 302, signed_in.text[:500]
            session = next(
                c for c in signed_in.headers.get_list("set-cookie") if c.startswith("sessionid=")
            )
            assert "secure" in session.lower()
            assert browser.get("/topics/").status_code == 200
            cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())

        async def console_socket() -> dict[str, object]:
            async with websockets.connect(
                f"wss://{deployment.host}:{port}/ws/console/",
                host="127.0.0.1",
                ssl=context,
                additional_headers={"Cookie": cookie, "Origin": origin},
                open_timeout=10,
            ) as ws:
                return orjson.loads(await asyncio.wait_for(ws.recv(), 10))

        assert asyncio.run(console_socket())["type"] == "hello"

        # Producers send through the address all along, while a process stops under them: one
        # to the topic's URL, two to a partition's (HAProxy's daphne_partition backend, which
        # moves the stopped process's partition to the other), and one keyed to the topic's
        # URL with its partition in the hint header, as ferry_client's route_by_partition sends
        # (the same backend).
        answers: list[tuple[int, str]] = []  # status, and the message's value or the error
        sending = threading.Event()
        sending.set()
        paths = [
            "/topics/behind-lb/messages",
            "/topics/behind-lb/partitions/0/messages",
            "/topics/behind-lb/partitions/1/messages",
            "/topics/behind-lb/messages",
        ]

        def produce(worker: int) -> None:
            with httpx.Client(
                base_url=f"{deployment.balancer}/api/v1",
                headers=headers,
                transport=httpx.HTTPTransport(verify=context),
                timeout=30,
            ) as producer:
                n = 0
                while sending.is_set():
                    n += 1
                    value = f"producer {worker} message {n}"
                    message, hint = {"value": value}, {}
                    if worker == 3:
                        message["key"] = f"k{n}"
                        hint = {"Ferry-Partition-Hint": str(partition_for_key(f"k{n}", 2))}
                    try:
                        sent = producer.post(
                            paths[worker], json={"messages": [message]}, headers=hint
                        )
                    except httpx.TransportError as exc:  # no answer: a failure too
                        answers.append((0, repr(exc)))
                        continue
                    answers.append((sent.status_code, value if sent.is_success else sent.text))

        producers = [threading.Thread(target=produce, args=(w,)) for w in range(4)]

        # A WebSocket through the same address: subscribed, then a message produced over REST.
        async def subscriber() -> tuple[str, int]:
            # The README's host in the URL (its Host header and TLS name); the socket to HAProxy.
            async with websockets.connect(
                f"wss://{deployment.host}:{port}/ws/v1/",
                host="127.0.0.1",
                ssl=context,
                additional_headers={"Authorization": headers["Authorization"]},
                open_timeout=10,
            ) as ws:
                await ws.send(
                    orjson.dumps(
                        {"type": "subscribe", "sub": "s", "topic": "behind-lb", "group": "lb"}
                    ).decode()
                )
                assert orjson.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "subscribed"
                sent = await asyncio.to_thread(
                    lb.post, "/topics/behind-lb/messages", json={"messages": [{"value": "one"}]}
                )
                assert sent.status_code == 200
                frame = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
                assert frame["type"] == "messages"
                value = frame["items"][0]["value"]
                for producer in producers:
                    producer.start()
                await asyncio.sleep(1)
                # Then the process under it stops: `closing`, and the socket closes with 4503.
                deployment.serving_websocket().send_signal(signal.SIGTERM)
                closing = orjson.loads(await asyncio.wait_for(ws.recv(), 20))
                while closing["type"] == "messages":  # the producers' messages, until then
                    closing = orjson.loads(await asyncio.wait_for(ws.recv(), 20))
                assert closing["type"] == "closing"
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 20)
                return value, closed.value.rcvd.code if closed.value.rcvd else 0

        try:
            value, code = asyncio.run(subscriber())
            # HAProxy's health check marks the stopped process down within 4 s; until then a
            # connection it refuses is tried on the other one.
            time.sleep(5)
        finally:
            sending.clear()
            for producer in producers:
                if producer.ident is not None:  # started
                    producer.join(60)
        assert value == "one"
        assert code == 4503
        failed = [answer for answer in answers if answer[0] != 200]
        assert not failed, failed[:5]
        assert len(answers) > 30
        # Each answered produce stored once: none lost, none sent twice by HAProxy's retries.
        stored = [
            (partition, item["value"])
            for partition in (0, 1)
            for item in lb.get(
                f"/topics/behind-lb/partitions/{partition}/messages",
                params={"offset": 0, "limit": 10000},
            ).json()["messages"]
        ]
        values = [value for _, value in stored]
        assert sorted(values) == sorted(["one", *(value for _, value in answers)])
        # And a partition's URL put each of its messages in that partition, a key in its own.
        for partition, value in stored:
            for worker in (1, 2):
                if value.startswith(f"producer {worker} "):
                    assert partition == worker - 1, value
            if value.startswith("producer 3 "):
                n = value.rsplit(" ", 1)[1]
                assert partition == partition_for_key(f"k{n}", 2), value
