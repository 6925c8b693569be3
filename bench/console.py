"""The console's pages at scale: server time per page, and the cost of the live socket.

Run by `make bench` (scripts/bench); not part of the test suite (STYLE.md §6). On the database
the environment names (the embedded SQLite under a temporary FERRY_DATA_DIR, or DATABASE_URL):

1. builds, through the core in this process: 1,000,000 messages over 10 topics of 4 partitions
   (keys, tags, 200-byte JSON values), 100 groups (10 per topic) committed at spread positions,
   10,000 dead letters (a member rejects what it was delivered), 10,000 scheduled messages,
   samples for the charts and a console login;
2. starts Daphne (background jobs on, as `make run` does), logs in through /login/ and requests
   every console page REQUESTS times in turn, quiet, then again while a producer thread sends
   batches of 100 messages as fast as the server takes them; prints p50 / p95 / max per page
   (target: p95 < 300 ms on every page);
3. measures the server process's CPU (from /proc) over WINDOW_S with no console socket open and
   then with SOCKETS sockets open on /ws/console/, both under the same steady produce load that
   changes what the pages show every second; the difference is what the live updates cost
   (target: < 5 % of a core), beside the time of one fingerprint read.

    .venv/bin/python bench/console.py [--scale 0.1]
"""

import argparse
import asyncio
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from produce_fetch import (
    command_line,
    cpu_seconds,
    database_description,
    free_port,
    progress,
    setup_django,
    start_daphne,
    stop_daphne,
    wait_healthy,
)

TOPICS = 10
PARTITIONS = 4
MESSAGES = 1_000_000
GROUPS_PER_TOPIC = 10
DEAD_LETTERS = 10_000
SCHEDULED = 10_000
REQUESTS = 20
SOCKETS = 10
WINDOW_S = 20.0
TARGET_P95_MS = 300.0
TARGET_LIVE_CORE = 0.05
USER, PASSWORD = "bench-operator", "bench-password-1"


def build(scale: float) -> dict[str, Any]:
    """The data set, through the core (as a producer and consumers would leave it)."""
    from django.contrib.auth.models import User

    from broker.core import delivery, groups, history, keys, log, membership, topics
    from broker.core.records import NewMessage

    console = keys.CONSOLE
    messages = int(MESSAGES * scale)
    per_topic = messages // TOPICS
    batch = 1000
    names = [f"bench-topic-{i}" for i in range(TOPICS)]
    started = time.perf_counter()
    for t, name in enumerate(names):
        topics.create_topic(console, name, PARTITIONS)
        for first in range(0, per_topic, batch):
            n = min(batch, per_topic - first)
            log.append_messages(
                console,
                name,
                [
                    NewMessage(
                        orjson.dumps({"order": first + i, "topic": t, "pad": "x" * 160}),
                        key=f"customer-{(first + i) % 5000}",
                        tag=("paid", "shipped", "refunded")[(first + i) % 3],
                        headers={"source": "bench"},
                        client_id=f"{name}-{first + i}",
                    )
                    for i in range(n)
                ],
            )
        progress(f"built {name}: {per_topic:,} messages ({time.perf_counter() - started:.0f} s)")
    rng = random.Random(7)
    for t, name in enumerate(names):
        for g in range(GROUPS_PER_TOPIC):
            info = topics.get_topic(console, name)
            groups.commit_offsets(
                console,
                f"bench-group-{t}-{g}",
                name,
                {p.number: rng.randint(0, p.end_offset) for p in info.partitions},
            )
    progress(f"committed {TOPICS * GROUPS_PER_TOPIC} groups")
    dead = int(DEAD_LETTERS * scale)
    membership.join_group(console, "bench-dlq", names[0], "bench-rejecter")
    while dead > 0:
        result = delivery.deliver_messages(
            console, "bench-dlq", names[0], "bench-rejecter", min(1000, dead)
        )
        receipts = [d.receipt for d in result.deliveries]
        delivery.reject_messages(console, "bench-dlq", receipts, error="bench: rejected")
        dead -= len(receipts)
    membership.leave_group(console, "bench-dlq", "bench-rejecter")
    progress(f"dead-lettered {int(DEAD_LETTERS * scale):,}")
    scheduled = int(SCHEDULED * scale)
    for first in range(0, scheduled, batch):
        log.append_messages(
            console,
            names[1],
            [
                NewMessage(b'{"later": true}', delay_ms=3_600_000 + (first + i) * 1000)
                for i in range(min(batch, scheduled - first))
            ],
        )
    progress(f"scheduled {scheduled:,}")
    # Two samples a little apart, so the charts and rates have something to show.
    history.sample_metrics()
    time.sleep(1)
    history.sample_metrics()
    User.objects.create_superuser(USER, password=PASSWORD)
    return {"topics": names, "seconds": time.perf_counter() - started}


def login(url: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=60, follow_redirects=False)
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    if token is None:
        raise RuntimeError(f"no login form at /login/: {page.status_code}")
    answer = client.post(
        "/login/",
        data={"username": USER, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": f"{url}/login/"},
    )
    if answer.status_code != 302:
        raise RuntimeError(f"login failed: {answer.status_code} {answer.text[:300]}")
    return client


def pages(names: list[str]) -> list[str]:
    topic = names[0]
    return [
        "/",
        "/topics/",
        f"/topics/{topic}/",
        f"/topics/{topic}/messages/",
        f"/topics/{topic}/messages/?field=key&q=customer-42",
        f"/topics/{topic}/messages/?field=id&q={topic}-4242",
        f"/topics/{topic}/messages/?field=tag&q=refunded",
        f"/topics/{topic}/messages/?field=header&q=source%3Dnowhere",
        "/groups/",
        "/groups/bench-group-0-0/",
        "/scheduled/",
        "/dead-letters/",
        "/dead-letters/?group=bench-dlq",
        "/keys/",
        "/audit/",
    ]


def time_pages(client: httpx.Client, paths: list[str]) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {path: [] for path in paths}
    for _ in range(REQUESTS):
        for path in paths:
            t0 = time.perf_counter()
            response = client.get(path)
            elapsed = time.perf_counter() - t0
            if response.status_code != 200:
                raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:300]}")
            timings[path].append(elapsed)
    return timings


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18] if len(values) > 1 else values[0]


class Producer:
    """A steady producer on its own thread: batches of 100, one request after another."""

    def __init__(self, url: str, secret: str, topic: str, pause_s: float = 0.0) -> None:
        self.url, self.secret, self.topic, self.pause_s = url, secret, topic, pause_s
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = orjson.dumps({"messages": [{"value": {"load": 1}}] * 100})
        with httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.secret}"}, timeout=60
        ) as client:
            while not self.stop.is_set():
                client.post(f"/api/v1/topics/{self.topic}/messages", content=body)
                self.sent += 100
                if self.pause_s:
                    self.stop.wait(self.pause_s)

    def __enter__(self) -> "Producer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def cpu_over(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return cpu_seconds(pid) - before


async def hold_sockets(
    url: str,
    cookies: httpx.Cookies,
    count: int,
    ready: threading.Event,
    done: threading.Event,
    updates: list[int],
) -> None:
    import websockets

    cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
    ws_url = url.replace("http://", "ws://") + "/ws/console/"
    sockets = [
        await websockets.connect(
            ws_url, additional_headers={"Cookie": cookie, "Origin": url}, max_size=None
        )
        for _ in range(count)
    ]

    async def drain(socket: Any) -> None:
        async for frame in socket:
            if orjson.loads(frame).get("type") == "update":
                updates[0] += 1

    tasks = [asyncio.create_task(drain(s)) for s in sockets]
    ready.set()
    while not done.is_set():
        await asyncio.sleep(0.1)
    for socket in sockets:
        await socket.close()
    for task in tasks:
        task.cancel()


def live_cost(
    url: str, pid: int, cookies: httpx.Cookies, secret: str, topic: str
) -> dict[str, float]:
    with Producer(url, secret, topic, pause_s=0.2):
        time.sleep(2)
        quiet = cpu_over(pid, WINDOW_S)
        ready, done, updates = threading.Event(), threading.Event(), [0]
        thread = threading.Thread(
            target=lambda: asyncio.run(hold_sockets(url, cookies, SOCKETS, ready, done, updates))
        )
        thread.start()
        ready.wait(30)
        time.sleep(2)
        live = cpu_over(pid, WINDOW_S)
        done.set()
        thread.join()
    return {
        "without_s": quiet,
        "with_s": live,
        "cost_core": max(0.0, live - quiet) / WINDOW_S,
        "updates_per_socket_s": updates[0] / SOCKETS / (WINDOW_S + 2),
    }


def fingerprint_ms() -> float:
    from django.db import connection

    from broker.core import activity

    runs = []
    for _ in range(50):
        t0 = time.perf_counter()
        activity.fingerprint()
        runs.append(time.perf_counter() - t0)
    connection.close()
    return statistics.median(runs) * 1000


def report(
    scale: float,
    built: dict[str, Any],
    quiet: dict[str, list[float]],
    busy: dict[str, list[float]],
    live: dict[str, float],
    check_ms: float,
) -> bool:
    ok = True
    print()
    print(f"# Console pages ({command_line()})")
    print(
        f"database: {database_description()}; scale {scale} "
        f"({int(MESSAGES * scale):,} messages, {TOPICS * GROUPS_PER_TOPIC} groups, "
        f"{int(DEAD_LETTERS * scale):,} dead letters); data built in {built['seconds']:.0f} s"
    )
    print()
    print(
        f"busy: a producer thread sends 100-message batches back to back beside the page "
        f"requests ({built['busy_rate']:,.0f} msgs/s); a header search scans (at most 10,000)."
    )
    print()
    print("| page | quiet p50 ms | quiet p95 ms | busy p50 ms | busy p95 ms | busy max ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for path in quiet:
        q, b = quiet[path], busy[path]
        worst = max(p95(q), p95(b)) * 1000
        ok &= worst < TARGET_P95_MS
        print(
            f"| `{path}` | {statistics.median(q) * 1000:.1f} | {p95(q) * 1000:.1f} | "
            f"{statistics.median(b) * 1000:.1f} | {p95(b) * 1000:.1f} | {max(b) * 1000:.1f} |"
        )
    print()
    print(f"live updates, {SOCKETS} sockets open, producer at ~500 msgs/s, {WINDOW_S:.0f} s each:")
    print(
        f"  server CPU without sockets {live['without_s']:.2f} s, with {live['with_s']:.2f} s "
        f"-> {live['cost_core'] * 100:.2f} % of a core (target < {TARGET_LIVE_CORE * 100:.0f} %)"
    )
    print(
        f"  updates per socket per second: {live['updates_per_socket_s']:.2f}; "
        f"one fingerprint read: {check_ms:.2f} ms (median of 50)"
    )
    ok &= live["cost_core"] < TARGET_LIVE_CORE
    print(f"targets {'met' if ok else 'MISSED'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the data set")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-dashboard-"))
    proc = None
    try:
        setup_django(data_dir)
        from broker.core import keys
        from broker.core.records import Permission

        built = build(args.scale)
        _, secret = keys.create_api_key(keys.CONSOLE, "bench-load", [Permission("admin", "*")])
        check_ms = fingerprint_ms()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = data_dir / "daphne.log"
        proc = start_daphne(port, log_path, background=True)
        wait_healthy(url, proc, log_path)
        client = login(url)
        paths = pages(built["topics"])
        progress("timing pages, quiet")
        time_pages(client, paths)  # warm caches and the server's imports
        quiet = time_pages(client, paths)
        progress("timing pages under a produce load")
        with Producer(url, secret, built["topics"][2]) as producer:
            started = time.perf_counter()
            busy = time_pages(client, paths)
            built["busy_rate"] = producer.sent / (time.perf_counter() - started)
        progress("measuring the live socket's cost")
        live = live_cost(url, proc.pid, client.cookies, secret, built["topics"][3])
        return 0 if report(args.scale, built, quiet, busy, live, check_ms) else 1
    finally:
        if proc is not None:
            stop_daphne(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
