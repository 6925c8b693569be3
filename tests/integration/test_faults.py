"""Outages under load (issue 17, docs/operations.md): Redis killed, PostgreSQL stopped, sessions
terminated, a full disk; Ferry answers JSON errors meanwhile, heals by itself, and loses nothing.

Two stacks, each started once by the project's scripts and shared by its scenarios:

- production: a PostgreSQL of its own (scripts/postgres, so that it can be stopped), Redis
  (scripts/redis), two Daphne processes on them (A runs the background jobs, as beat would);
- embedded: one Daphne on SQLite in a data directory on a small tmpfs (a real full disk; root
  only, skipped elsewhere).

Each scenario runs a workload through both processes (a producer retrying with the same message
ids, a member polling and acking over REST, a WebSocket subscriber that reconnects under a new
member id every few seconds, a fetch long poll), injects its fault, restores, and checks: only
documented JSON errors meanwhile, every client back within seconds, then every 2xx-answered
message stored once where its answer said, contiguous offsets, everything acked in both groups,
and no member left behind by a closed connection.
"""

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
import websockets

from tests.integration.conftest import ROOT, free_port, server_log, sign_in, start_daphne, stop

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    # Its stacks are its own (a PostgreSQL and a Redis it stops, SQLite on a tmpfs), whatever
    # database the suite runs on: make test runs it once, in the SQLite pass.
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")),
        reason="runs in the SQLite pass; its PostgreSQL is its own",
    ),
]

PARTITIONS = 3
SESSION_TIMEOUT_MS = 3000
# Errors a client may see while something is down (docs/operations.md); any other is a failure.
OUTAGE_CODES = {"unavailable", "insufficient_storage"}
# WebSocket close codes the server may use when it gives up (docs/websocket.md#close-codes).
SERVER_CLOSE_CODES = {1000, 4503}
BACK_WITHIN_S = 8
SETTLE_WITHIN_S = 30


def run_script(*args: str) -> str:
    done = subprocess.run(
        [str(ROOT / "scripts" / args[0]), *args[1:]], check=True, capture_output=True, text=True
    )
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return (done.stdout.strip().splitlines() or [""])[-1]


def site_env(**extra: str) -> dict[str, str]:
    """A production process's environment: mqsite.settings, not the tests' settings."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.pop("FERRY_TEST_DB_NAME", None)
    env.update(
        DJANGO_SETTINGS_MODULE="mqsite.settings",
        DJANGO_SECRET_KEY="faults-" + "x" * 50,
        # Members heartbeat often, so a 3 s session timeout holds for live ones.
        FERRY_HEARTBEAT_INTERVAL_MS="500",
        **extra,
    )
    return env


@dataclass
class Stack:
    urls: list[str]
    key: str
    # The production stack's services, to stop and start.
    pg_dir: Path | None = None
    pg_url: str = ""
    redis_dir: Path | None = None
    redis_port: int = 0
    data_dir: Path | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture(scope="module")
def production() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="ferry-faults-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o755)  # scripts/postgres runs the server as its own user under root
        pg_dir, redis_dir, data_dir = base / "pg", base / "redis", base / "data"
        data_dir.mkdir()
        pg_url = run_script("postgres", "start", str(pg_dir), str(free_port()))
        redis_port = free_port()
        stack = Stack(
            urls=[],
            key="",
            pg_dir=pg_dir,
            pg_url=pg_url,
            redis_dir=redis_dir,
            redis_port=redis_port,
        )
        try:
            redis_url = run_script("redis", "start", str(redis_dir), str(redis_port))
            env = site_env(DATABASE_URL=pg_url, REDIS_URL=redis_url, FERRY_DATA_DIR=str(data_dir))
            manage(env, "migrate", "--noinput", "-v0")
            stack.key = manage(env, "ferry", "apikey", "create", "faults", "--allow", "admin:*")
            for background in ("1", "0"):
                proc, url = start_daphne(env, FERRY_BACKGROUND_IN_PROCESS=background)
                stack.processes.append(proc)
                stack.urls.append(url)
            yield stack
        finally:
            for proc in stack.processes:
                stop(proc)
            subprocess.run([str(ROOT / "scripts" / "redis"), "stop", str(redis_dir)], check=False)
            subprocess.run([str(ROOT / "scripts" / "postgres"), "stop", str(pg_dir)], check=False)


@pytest.fixture(scope="module")
def embedded() -> Iterator[Stack]:
    """The embedded default on a 24 MB tmpfs of its own (mounted and unmounted here)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk needs a small tmpfs, which only root may mount")
    with tempfile.TemporaryDirectory(prefix="ferry-disk-") as tmp:
        mount_point = Path(tmp)
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(mount_point)],
            capture_output=True,
            check=False,
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
        stack = Stack(urls=[], key="", data_dir=mount_point)
        try:
            env = site_env(FERRY_DATA_DIR=str(mount_point))
            manage(env, "migrate", "--noinput", "-v0")
            stack.key = manage(env, "ferry", "apikey", "create", "faults", "--allow", "admin:*")
            proc, url = start_daphne(env, FERRY_BACKGROUND_IN_PROCESS="1")
            stack.processes.append(proc)
            stack.urls.append(url)
            yield stack
        finally:
            for proc in stack.processes:
                stop(proc)
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


class Workload:
    """The clients of one scenario, on threads, recording what they saw."""

    def __init__(self, stack: Stack, name: str, value_bytes: int = 16) -> None:
        self.stack = stack
        self.topic = f"faults-{name}"
        self.poll_group = f"poll-{name}"
        self.push_group = f"push-{name}"
        self.value = "v" * value_bytes
        self.stop_producing = threading.Event()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        # Message id -> (partition, offset), as the 2xx answers said.
        self.stored: dict[str, tuple[int, int]] = {}
        self.acked: dict[str, set[str]] = {self.poll_group: set(), self.push_group: set()}
        self.maybe_acked: set[str] = set()
        self.problems: list[str] = []
        self.outage_errors: dict[str, int] = {}
        self.last_ok: dict[str, float] = {}
        self.push_members: list[str] = []
        self.close_codes: list[int] = []
        self.fetched = 0
        self.threads: list[threading.Thread] = []

    # Bookkeeping.

    def ok(self, who: str) -> None:
        with self.lock:
            self.last_ok[who] = time.monotonic()

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def failed_answer(self, who: str, response: httpx.Response) -> float:
        """Check a non-2xx answer is a documented outage error; how long to wait before retrying."""
        try:
            body = response.json()
            code = body["error"]["code"]
            detail = body["error"]["detail"]
        except (ValueError, KeyError, TypeError):
            self.problem(
                f"{who}: {response.status_code} not the JSON error body: {response.text!r:.200}"
            )
            return 0.2
        if code in OUTAGE_CODES and response.status_code in (503, 507):
            with self.lock:
                self.outage_errors[code] = self.outage_errors.get(code, 0) + 1
            return min(float(detail.get("retry_after", 1)), 0.5)
        self.problem(f"{who}: {response.status_code} {code}: {body['error']['message']}")
        return 0.2

    def url(self, i: int) -> str:
        return self.stack.urls[i % len(self.stack.urls)]

    # Set-up.

    def prepare(self) -> None:
        h = self.stack.headers
        base = self.stack.urls[0] + "/api/v1"
        httpx.post(
            f"{base}/topics", json={"name": self.topic, "partitions": PARTITIONS}, headers=h
        ).raise_for_status()
        for group in (self.poll_group, self.push_group):
            httpx.patch(
                f"{base}/groups/{group}",
                json={"session_timeout_ms": SESSION_TIMEOUT_MS},
                headers=h,
            ).raise_for_status()

    def start(self) -> None:
        self.prepare()
        for target in (self.produce, self.poll, self.fetch, self.push):
            thread = threading.Thread(target=target, name=target.__name__, daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        self.stop_producing.set()
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=15)
            if thread.is_alive():
                self.problem(f"{thread.name} did not stop")

    # The clients.

    def produce(self) -> None:
        with httpx.Client(headers=self.stack.headers, timeout=15) as client:
            n = 0
            attempt = 0
            while not self.stop_producing.is_set():
                batch = [{"id": f"m{n}-{i}", "value": self.value} for i in range(5)]
                attempt += 1
                try:
                    response = client.post(
                        f"{self.url(attempt)}/api/v1/topics/{self.topic}/messages",
                        json={"messages": batch},
                    )
                except httpx.TransportError as exc:
                    self.problem(f"produce: {exc!r}")
                    time.sleep(0.2)
                    continue
                if response.status_code != 200:
                    time.sleep(self.failed_answer("produce", response))
                    continue  # the same ids again: a retry is safe
                self.ok("produce")
                with self.lock:
                    for m, r in zip(batch, response.json()["results"], strict=True):
                        where = (r["partition"], r["offset"])
                        if self.stored.setdefault(m["id"], where) != where:
                            self.problems.append(
                                f"{m['id']} stored at {where} and {self.stored[m['id']]}"
                            )
                n += 1
                time.sleep(0.03)

    def poll(self) -> None:
        group = self.poll_group
        with httpx.Client(headers=self.stack.headers, timeout=15) as client:
            member = None
            i = 0
            while not self.stopping.is_set():
                i += 1
                base = f"{self.url(i)}/api/v1/groups/{group}"
                try:
                    if member is None:
                        joined = client.post(f"{base}/members", json={"topic": self.topic})
                        if joined.status_code != 201:
                            time.sleep(self.failed_answer("join", joined))
                            continue
                        member = joined.json()["member_id"]
                    polled = client.post(
                        f"{base}/poll",
                        json={
                            "topic": self.topic,
                            "member_id": member,
                            "max_messages": 50,
                            "max_wait_ms": 500,
                        },
                    )
                    if polled.status_code == 404 and polled.json()["error"]["code"] == (
                        "member_not_found"
                    ):
                        member = None  # expired while the database was away: join again
                        continue
                    if polled.status_code != 200:
                        time.sleep(self.failed_answer("poll", polled))
                        continue
                    messages = polled.json()["messages"]
                    self.ok("poll")
                    if not messages:
                        continue
                    receipts = [m["receipt"] for m in messages]
                    for _ in range(50):  # an ack is safe to repeat: the same receipts again
                        acked = client.post(f"{base}/ack", json={"receipts": receipts})
                        if acked.status_code == 200:
                            break
                        time.sleep(self.failed_answer("ack", acked))
                    else:
                        continue  # not acked: the messages come back after their deadline
                    stale = set(acked.json()["stale"])
                    with self.lock:
                        self.acked[group].update(
                            m["id"] for m in messages if m["receipt"] not in stale
                        )
                except httpx.TransportError as exc:
                    self.problem(f"poll: {exc!r}")
                    time.sleep(0.2)
            if member is not None:
                with contextlib.suppress(httpx.HTTPError):
                    client.delete(f"{self.url(0)}/api/v1/groups/{group}/members/{member}")

    def fetch(self) -> None:
        offset = 0
        with httpx.Client(headers=self.stack.headers, timeout=15) as client:
            while not self.stopping.is_set():
                try:
                    response = client.get(
                        f"{self.url(1)}/api/v1/topics/{self.topic}/partitions/0/messages",
                        params={"offset": offset, "max_wait_ms": 500, "limit": 500},
                    )
                except httpx.TransportError as exc:
                    self.problem(f"fetch: {exc!r}")
                    time.sleep(0.2)
                    continue
                if response.status_code != 200:
                    time.sleep(self.failed_answer("fetch", response))
                    continue
                self.ok("fetch")
                body = response.json()
                for m in body["messages"]:
                    if m["offset"] != offset:
                        self.problem(f"fetch: offset {m['offset']} where {offset} was next")
                    offset = m["offset"] + 1
                self.fetched = offset

    def push(self) -> None:
        asyncio.run(self._push())

    async def _push(self) -> None:
        """A subscriber that reconnects every 2 s under a new member id (a restarted consumer)."""
        i = 0
        while not self.stopping.is_set():
            i += 1
            url = "ws" + self.url(i)[len("http") :] + "/ws/v1/"
            try:
                async with websockets.connect(
                    url, additional_headers=self.stack.headers, open_timeout=10
                ) as ws:
                    await self._subscription(ws)
            except websockets.exceptions.ConnectionClosed as exc:
                if exc.rcvd is not None and exc.rcvd.code not in SERVER_CLOSE_CODES:
                    self.problem(f"push: closed with {exc.rcvd.code} {exc.rcvd.reason}")
                if exc.rcvd is not None:
                    self.close_codes.append(exc.rcvd.code)
            except (OSError, TimeoutError) as exc:
                self.problem(f"push: {exc!r}")
            await asyncio.sleep(0.2)

    async def _subscription(self, ws: Any) -> None:
        await ws.send(
            orjson.dumps(
                {
                    "type": "subscribe",
                    "ref": "s",
                    "sub": "s",
                    "topic": self.topic,
                    "group": self.push_group,
                    "prefetch": 50,
                }
            ).decode()
        )
        loop = asyncio.get_running_loop()
        until = loop.time() + 2.0
        # After `until`, only the answers to acks already sent are waited for, this long.
        hard_until = until + 3.0
        pending: dict[str, list[Any]] = {}  # ack ref -> its deliveries
        try:
            await self._frames(ws, pending, until, hard_until)
        finally:
            # Acks whose answers never came may have been applied: the server's figures decide.
            with self.lock:
                self.maybe_acked.update(m["id"] for items in pending.values() for m in items)

    async def _frames(
        self, ws: Any, pending: dict[str, list[Any]], until: float, hard_until: float
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            closing = self.stopping.is_set() or loop.time() >= until
            if closing and not pending:
                break
            left = (hard_until if closing else until) - loop.time()
            if left <= 0:
                break
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=left)
            except TimeoutError:
                continue
            frame = orjson.loads(raw)
            kind = frame["type"]
            if kind == "messages" and closing:
                continue  # not handled: back to the group when this member leaves
            if kind == "subscribed":
                self.push_members.append(frame["member_id"])
                self.ok("push")
            elif kind == "messages":
                self.ok("push")
                ref = frame["items"][0]["receipt"]
                pending[ref] = frame["items"]
                await self._ack(ws, ref, pending[ref])
            elif kind == "acked":
                stale = set(frame["stale"])
                with self.lock:
                    self.acked[self.push_group].update(
                        m["id"] for m in pending.pop(frame["ref"]) if m["receipt"] not in stale
                    )
            elif kind == "error":
                code = frame["error"]["code"]
                if code not in OUTAGE_CODES:
                    self.problem(f"push: error frame {code}: {frame['error']['message']}")
                if frame.get("ref") in pending:
                    await asyncio.sleep(0.2)
                    await self._ack(ws, frame["ref"], pending[frame["ref"]])  # safe to repeat
                elif frame.get("ref") is None:
                    # The subscription ended: subscribe again after retry_after.
                    retry_after = frame["error"]["detail"].get("retry_after", 1)
                    await asyncio.sleep(min(retry_after, 0.5))
                    return
        # Gone without unsubscribing, as a killed consumer would: its member must leave.

    @staticmethod
    async def _ack(ws: Any, ref: str, items: list[Any]) -> None:
        receipts = [m["receipt"] for m in items]
        await ws.send(
            orjson.dumps({"type": "ack", "ref": ref, "sub": "s", "receipts": receipts}).decode()
        )


def api(stack: Stack, method: str, path: str, **kwargs: Any) -> Any:
    response = httpx.request(
        method, f"{stack.urls[0]}/api/v1{path}", headers=stack.headers, timeout=15, **kwargs
    )
    response.raise_for_status()
    return response.json()


def wait_for(condition: Callable[[], bool], within_s: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within_s, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - started


def run_scenario(
    stack: Stack,
    name: str,
    fault: Callable[[], object],
    restore: Callable[[], object],
    *,
    value_bytes: int = 16,
    outage_s: float = 4.0,
    served_meanwhile: bool = False,
) -> dict[str, Any]:
    """Warm up, fault, restore, then check everything the issue asks; returns figures.

    served_meanwhile: every client must also be served during the fault (Redis only carries
    wake-ups).
    """
    logs = {url: server_log(url) for url in stack.urls}
    logged_before = {url: log.stat().st_size for url, log in logs.items()}
    work = Workload(stack, name, value_bytes)
    work.start()
    try:
        wait_for(lambda: len(work.last_ok) == 4, 15, "every client to work before the fault")
        fault()
        faulted = time.monotonic()
        if served_meanwhile:
            wait_for(
                lambda: all(t > faulted + 0.5 for t in work.last_ok.values()),
                outage_s,
                f"every client served during the fault ({work.last_ok}, {work.problems[:5]})",
            )
        time.sleep(max(0.0, outage_s - (time.monotonic() - faulted)))
        restore()
        restored = time.monotonic()
        back = wait_for(
            lambda: all(t > restored for t in work.last_ok.values()),
            BACK_WITHIN_S,
            f"every client back after the restore (last ok: {work.last_ok}, {work.problems[:5]})",
        )
        time.sleep(1.0)
        work.stop_producing.set()
        time.sleep(0.5)
        with work.lock:
            stored = dict(work.stored)
        wait_for(
            lambda: (
                all(set(stored) <= work.acked[g] | work.maybe_acked for g in work.acked)
                and all(group_settled(stack, g) for g in work.acked)
            ),
            SETTLE_WITHIN_S,
            "both groups to ack every stored message "
            f"(missing: { {g: len(set(stored) - a) for g, a in work.acked.items()} }, "
            f"problems: {work.problems[:5]})",
        )
    finally:
        work.stop()
    check_storage(stack, work.topic, stored)
    check_members(stack, work)
    assert not work.problems, work.problems[:20]
    # docs/operations.md: an outage is one line for each thing that met it, no traceback.
    for url, log in logs.items():
        with log.open("rb") as f:
            f.seek(logged_before[url])
            written = f.read().decode(errors="replace")
        assert "Traceback" not in written, written[written.index("Traceback") - 300 :][:3000]
    return {"back_s": back, "stored": len(stored), "outage_errors": work.outage_errors}


def group_settled(stack: Stack, group: str) -> bool:
    """The server's view: nothing left to deliver, in flight or waiting for a retry."""
    (topic,) = api(stack, "GET", f"/groups/{group}")["topics"]
    return (topic["lag"], topic["in_flight"], topic["retry_waiting"]) == (0, 0, 0)


def check_storage(stack: Stack, topic: str, stored: dict[str, tuple[int, int]]) -> None:
    """Every 2xx-answered message once, where its answer said; offsets contiguous."""
    seen: dict[str, tuple[int, int]] = {}
    for partition in range(PARTITIONS):
        offset = 0
        while True:
            body = api(
                stack,
                "GET",
                f"/topics/{topic}/partitions/{partition}/messages",
                params={"offset": offset, "limit": 1000},
            )
            for m in body["messages"]:
                assert m["offset"] == offset, f"gap in partition {partition} at {offset}"
                assert m["id"] not in seen, (
                    f"{m['id']} stored twice: {seen[m['id']]}, {partition, offset}"
                )
                seen[m["id"]] = (partition, offset)
                offset += 1
            if offset >= body["end_offset"]:
                break
    missing = {i: w for i, w in stored.items() if seen.get(i) != w}
    assert not missing, f"answered 2xx but not stored there: {list(missing.items())[:10]}"


def check_members(stack: Stack, work: Workload) -> None:
    """After every client left, no member remains (the session timeout expires any stragglers)."""

    def members() -> list[str]:
        groups = (work.poll_group, work.push_group)
        return [
            m["member_id"] for g in groups for m in api(stack, "GET", f"/groups/{g}")["members"]
        ]

    wait_for(
        lambda: not members(),
        SESSION_TIMEOUT_MS / 1000 + 4,
        f"the members of closed connections to leave or expire ({members()})",
    )


LAYER_DOWN = "channel layer unreachable"
DEGRADED = {"status": "degraded", "database": "postgresql", "redis": "degraded"}
LAYER_BACK = "channel layer reachable again"


# The scenarios.


def test_redis_killed__consumption_goes_on_and_no_member_outlives_its_connection(production):
    assert production.redis_dir is not None

    def kill() -> None:
        pid = int((production.redis_dir / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)

    def restart() -> None:
        run_script("redis", "start", str(production.redis_dir), str(production.redis_port))

    def health(url: str) -> dict[str, Any]:
        return httpx.get(f"{url}/api/v1/health", timeout=10).json()

    def fault() -> None:
        kill()
        wait_for(
            # As docs/operations.md shows it.
            lambda: all(health(u) == DEGRADED for u in production.urls),
            5,
            "health to say Redis is degraded",
        )

    logs = [server_log(url) for url in production.urls]
    before = [log.read_text().count(LAYER_DOWN) for log in logs]
    figures = run_scenario(production, "redis", fault, restart, served_meanwhile=True)
    wait_for(lambda: all(health(u)["redis"] == "ok" for u in production.urls), 5, "Redis ok again")
    # Said once per process when it switched to the database poll, and once when back.
    downs = [log.read_text().count(LAYER_DOWN) - n for log, n in zip(logs, before, strict=True)]
    assert downs == [1, 1]
    assert all(log.read_text().count(LAYER_BACK) >= 1 for log in logs)
    print("redis killed:", figures)


def test_postgres_stopped__json_errors_then_back_by_itself(production):
    assert production.pg_dir is not None

    def stop_pg() -> None:
        run_script("postgres", "stop", str(production.pg_dir))
        answer = httpx.get(f"{production.urls[0]}/api/v1/health", timeout=10)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "unavailable"
        assert answer.json()["error"]["detail"]["dependency"] == "database"
        assert answer.headers["Retry-After"] == "1"
        # The console's sign-in and /metrics answer as the API does (docs/console-ui.md#outages).
        url = production.urls[0]
        with httpx.Client(base_url=url, timeout=10) as browser:
            signing_in = sign_in(browser, "olga", "pw", url)
            scraped = browser.get("/metrics")
        for page in (signing_in, scraped):
            assert page.status_code == 503, page.text[:300]
            assert page.json()["error"]["code"] == "unavailable"
            assert page.headers["Retry-After"] == "1"

    figures = run_scenario(
        production,
        "pgstop",
        stop_pg,
        lambda: run_script("postgres", "resume", str(production.pg_dir)),
        outage_s=3.0,
    )
    assert figures["outage_errors"].get("unavailable"), figures
    print("postgres stopped:", figures)


def test_sessions_terminated__not_an_error_for_the_client(production):
    terminator_stop = threading.Event()
    terminated: list[int] = []

    def terminate_every_half_second() -> None:
        with psycopg.connect(production.pg_url, autocommit=True) as conn:
            while not terminator_stop.wait(0.5):
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'"
                ).fetchall()
                terminated.append(len(rows))

    thread = threading.Thread(target=terminate_every_half_second, daemon=True)

    def restore() -> None:
        terminator_stop.set()
        thread.join()

    figures = run_scenario(production, "terminate", thread.start, restore, outage_s=5.0)
    assert sum(terminated) > 10, terminated
    print("sessions terminated:", sum(terminated), figures)


def test_disk_full__507_then_back_by_itself(embedded):
    assert embedded.data_dir is not None
    filler = embedded.data_dir / "filler"

    def fill() -> None:
        # Opening may already fail: the broker's writes can have filled the small disk.
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()

    figures = run_scenario(
        embedded,
        "disk",
        fill,
        lambda: filler.unlink(missing_ok=True),
        value_bytes=2000,
        outage_s=3.0,
    )
    assert figures["outage_errors"].get("insufficient_storage"), figures
    print("disk full:", figures)
