"""The per-message path: one event per request, one ack per message, and the latency between.

Run by `make bench` (scripts/bench), once on SQLite and once on PostgreSQL; not part of the test
suite (STYLE.md §6). One process, one machine, one run; beside Ferry it measures the references
anyone can reproduce on the same machine:

1. a bare ASGI app (bench/bare_asgi.py) under the same Daphne: the sequential round trip, and
   the server CPU per request with 16 concurrent clients;
2. a raw single-row INSERT + COMMIT into the same database (the broker's own row and statement);
3. Ferry: a sequential single-message produce with key, headers and a binary value (p50/p99),
   and GET /api/v1/health;
4. single-message produce from 1, 4, 16 and 64 concurrent producers: msgs/s, and the server
   CPU per message (from /proc/<pid>/stat of the Daphne process, so the load generator on the
   same cores does not count);
5. WebSocket consume with prefetch 2 and an ack frame per message, first against the bare app
   (the same frames, nothing behind them: the transport's floor), then against Ferry;
6. end to end: single-message publish frames at 1,000 msgs/s to a WebSocket subscriber, p50/p99,
   first against the bare app's durable forwarder (an append and fdatasync per group commit,
   then the answer and the push: the transport's and the disk's share), then against Ferry:
   where the time went (the publish's answer, then the push), both processes' CPU, and the
   server's database calls from its /metrics: the calls each message cost, on the writer thread
   or the event loop, how busy the writer was and how long a call waited for it; and, on
   SQLite, the disk's own flush latency meanwhile (FlushProbe: every answer waits for a flush,
   so the disk's stalls bound the p99 any durable broker can reach here);
7. prints every figure with its ratio to the reference and the target (issue 12), and stops
   both servers by their PIDs (always).

    .venv/bin/python bench/per_message.py [--scale 0.2] [--only consume,e2e] [--server uvicorn]
        [--e2e-rate 200] [--processes 2]

REDIS_URL in the environment (a server scripts/redis started) makes the server use Redis as its
channel layer, as production does; --e2e-rate sets the end-to-end test's rate (msgs/s).
--processes N (PostgreSQL only) runs the concurrent single-message produce again against N
Daphne processes on the same database, the producers spread over them round robin and the
server CPU summed over the processes; it uses Redis as the channel layer, as several processes
must (a private one from scripts/redis unless REDIS_URL names one), for the one-process rows
too, so that both are measured alike.

--server uvicorn serves both apps under uvicorn instead of Daphne, for the side-by-side figures
of docs/decisions/0018-daphne-stays.md.
"""

import argparse
import asyncio
import base64
import functools
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from produce_fetch import (
    ROOT,
    command_line,
    cpu_seconds,
    create_fixtures,
    database_description,
    free_port,
    progress,
    run_together,
    server_command,
    setup_django,
    start_daphne,
    start_redis,
    stop_daphne,
    wait_healthy,
)
from prometheus_client.parser import text_string_to_metric_families
from websocket import expect, frame, open_ws, percentile, receive, subscribe

SEQUENTIAL = 2000
CONCURRENT = (1, 4, 16, 64)
CONCURRENT_MESSAGES = 4000
CPU_CLIENTS = 16
CONSUME_MESSAGES = 5000
LATENCY_RATE = 1000
LATENCY_SECONDS = 5
# A produce as a webhook or a browser sends it: a key, two headers and 200 binary bytes.
RICH_MESSAGE = {
    "key": "user-42",
    "headers": {"source": "web", "trace": "4bf92f3577b34da6"},
    "value_b64": base64.b64encode(bytes(range(200))).decode(),
}
RICH_BODY = orjson.dumps({"messages": [RICH_MESSAGE]})
TARGET_PRODUCE_VS_BARE = 3.0
TARGET_CPU_VS_BARE = 3.0
TARGET_CONSUME_MSGS_S = 2000
TARGET_E2E_P50_MS, TARGET_E2E_P99_MS = 3.0, 8.0


@dataclass
class Figures:
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, name: str, value: str, note: str = "") -> None:
        progress(f"  {name}: {value} {note}")
        self.rows.append((name, value, note))


def sequential(
    client: httpx.Client, call: Callable[[httpx.Client], httpx.Response], n: int
) -> list[float]:
    """Milliseconds of n calls one after another, after an untimed warm-up."""
    for _ in range(min(100, n)):
        call(client).raise_for_status()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = call(client)
        times.append((time.perf_counter() - t0) * 1000)
        if response.status_code >= 300:
            raise RuntimeError(f"{response.status_code} {response.text[:300]}")
    return sorted(times)


def machine_ticks() -> tuple[int, int]:
    """Busy and total CPU ticks of the whole machine so far, all cores (/proc/stat)."""
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


@dataclass
class Usage:
    """Cores busy during a timed run: the whole machine, the servers, this bench's clients."""

    machine: float = 0.0
    servers: float = 0.0
    clients: float = 0.0

    def describe(self) -> str:
        rest = self.machine - self.servers - self.clients
        return (
            f"machine busy {self.machine:.2f} of {os.cpu_count()} cores: servers "
            f"{self.servers:.2f}, bench clients {self.clients:.2f}, the rest (database, "
            f"Redis, other work) {rest:.2f}"
        )


def concurrent_posts(
    urls: list[str],
    path: str,
    headers: dict[str, str],
    body: bytes,
    total: int,
    clients: int,
    pids: list[int],
    usage: Usage | None = None,
) -> tuple[float, float]:
    """total POSTs from clients threads, client i to urls[i % len(urls)]; returns (requests/s,
    server CPU seconds per request, summed over the servers' pids). usage, if given, gets the
    cores busy meanwhile."""
    failures: list[str] = []

    def work(count: int, url: str) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            client.post(path, content=body).raise_for_status()  # warm-up, untimed
            barrier.wait()
            for _ in range(count):
                response = client.post(path, content=body)
                if response.status_code >= 300:
                    failures.append(f"{response.status_code} {response.text[:300]}")
                    return

    barrier = threading.Barrier(clients + 1)
    shares = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
    cpu0, client0, (busy0, all0), wall0 = (
        sum(cpu_seconds(pid) for pid in pids),
        cpu_seconds(os.getpid()),
        machine_ticks(),
        time.monotonic(),
    )
    seconds = run_together(
        [functools.partial(work, n, urls[i % len(urls)]) for i, n in enumerate(shares)], barrier
    )
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
    if usage is not None:
        # Over the whole call, the clients' start and warm-up included, for all three alike.
        busy1, all1 = machine_ticks()
        wall = time.monotonic() - wall0
        usage.machine = (busy1 - busy0) / max(1, all1 - all0) * (os.cpu_count() or 1)
        usage.servers = cpu / wall
        usage.clients = (cpu_seconds(os.getpid()) - client0) / wall
    if failures:
        raise RuntimeError(f"concurrent produce failed: {failures[0]}")
    return total / seconds, cpu / total


def raw_single_inserts(partition_id: int, n: int) -> list[float]:
    """Milliseconds of n single-row INSERT + COMMIT through Django's cursor (the broker's row)."""
    from django.db import connection, transaction

    from broker.core.log import INSERT_MESSAGES, now_ms

    headers = orjson.dumps(RICH_MESSAGE["headers"]).decode()
    value = bytes(range(200))
    times = []
    for i in range(n + 100):
        t0 = time.perf_counter()
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(
                INSERT_MESSAGES,
                (partition_id, i, now_ms(), "user-42", None, headers, value, False, 200, None),
            )
        if i >= 100:
            times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)


async def consume_one_by_one(ws_url: str, secret: str, topic: str, total: int) -> float:
    """msgs/s of a subscriber with prefetch 2 that sends an ack frame for each message."""
    async with await open_ws(ws_url, secret) as ws:
        await subscribe(ws, topic, "bench-per-message", prefetch=2)
        got = 0
        started = time.perf_counter()
        while got < total:
            data = await receive(ws)
            if data["type"] != "messages":
                continue
            for m in data["items"]:
                got += 1
                await ws.send(frame(type="ack", sub="s", receipts=[m["receipt"]]))
        return total / (time.perf_counter() - started)


def consume_measured(
    ws_url: str, server_pid: int, secret: str, topic: str, total: int
) -> tuple[float, float]:
    """consume_one_by_one's msgs/s, and the server's CPU seconds per message meanwhile."""
    cpu0 = cpu_seconds(server_pid)
    rate = asyncio.run(consume_one_by_one(ws_url, secret, topic, total))
    return rate, (cpu_seconds(server_pid) - cpu0) / total


@dataclass
class EndToEnd:
    """Milliseconds per message, each list sorted: from its publish frame to its arrival; to
    its `published` answer; from that answer to its arrival (where the time goes: the commit,
    or the push after it)."""

    arrived: list[float]
    answered: list[float]
    pushed: list[float]


async def end_to_end(
    ws_url: str, secret: str, topic: str, rate: int = LATENCY_RATE, seconds: int = LATENCY_SECONDS
) -> EndToEnd:
    """Single-message publish frames at rate msgs/s to a subscriber of the topic."""
    total = rate * seconds
    async with await open_ws(ws_url, secret) as sub, await open_ws(ws_url, secret) as pub:
        await subscribe(sub, topic, "bench-e2e", prefetch=64, **{"from": "latest"})
        arrived: dict[int, float] = {}

        async def listen() -> None:
            while len(arrived) < total:
                data = await receive(sub)
                if data["type"] == "messages":
                    now = time.perf_counter()
                    for m in data["items"]:
                        arrived[m["value"]] = now
                    receipts = [m["receipt"] for m in data["items"]]
                    await sub.send(frame(type="ack", sub="s", receipts=receipts))

        answered: dict[int, float] = {}

        async def answers() -> None:
            for i in range(total):
                await expect(pub, "published")
                answered[i] = time.perf_counter()

        sent_at: dict[int, float] = {}
        tasks = asyncio.gather(listen(), answers())
        start = time.perf_counter()
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent_at[i] = time.perf_counter()
            await pub.send(frame(type="publish", topic=topic, messages=[{"value": i}]))
        await asyncio.wait_for(tasks, 120)
    return EndToEnd(
        sorted((arrived[i] - sent_at[i]) * 1000 for i in range(total)),
        sorted((answered[i] - sent_at[i]) * 1000 for i in range(total)),
        sorted((arrived[i] - answered[i]) * 1000 for i in range(total)),
    )


def database_calls(url: str) -> dict[tuple[str, str], list[float]]:
    """The server's database-call figures from /metrics (docs/metrics.md): per (pool, core
    call), [calls, seconds busy, seconds queued]."""
    found: dict[tuple[str, str], list[float]] = {}
    names = {
        "ferry_database_calls_total": 0,
        "ferry_database_call_seconds_total": 1,
        "ferry_database_call_queued_seconds_total": 2,
    }
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name in names:
                key = (s.labels["pool"], s.labels["call"])
                found.setdefault(key, [0.0, 0.0, 0.0])[names[s.name]] = s.value
    return found


def start_bare(port: int, log_path: Path, server: str) -> subprocess.Popen[bytes]:
    command = server_command(server, port, "bare_asgi:application")
    # The /e2e side's log is flushed beside the database's, on the same disk.
    env = {**os.environ, "BARE_LOG_DIR": str(log_path.parent)}
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            command, cwd=ROOT / "bench", env=env, stdout=log_file, stderr=subprocess.STDOUT
        )


def wait_bare(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            httpx.post(url, content=b"{}", timeout=1).raise_for_status()
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the bare ASGI app did not start")


def p(values: list[float], fraction: float) -> float:
    return percentile(values, fraction)


class FlushProbe:
    """The disk's own flushes during a run: a 4 KiB append and its fdatasync every 10 ms, in a
    file beside the database, each timed. Every produce Ferry answers waits for such a flush
    (its group commit's); a flush that stalls delays every answer due meanwhile, whatever the
    broker does, so its stalls are the reference for the end-to-end p99 on this disk. Light:
    100 small flushes a second beside the broker's hundreds."""

    STALL_MS = 5.0

    def __init__(self, directory: Path, every_s: float = 0.01) -> None:
        self.path = directory / "flush-probe"
        self.every_s = every_s
        self.flushes: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flush-probe", daemon=True)

    def __enter__(self) -> "FlushProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            block = b"\0" * 4096
            while not self._stop.is_set():
                os.write(fd, block)
                started = time.perf_counter()
                os.fdatasync(fd)
                took = time.perf_counter() - started
                self.flushes.append(took * 1000)
                self._stop.wait(max(0.0, self.every_s - took))
        finally:
            os.close(fd)

    def describe(self) -> tuple[str, str]:
        flushes = sorted(self.flushes)
        stalls = [ms for ms in flushes if ms > self.STALL_MS]
        return (
            f"p50 {p(flushes, 0.5):.2f}, p99 {p(flushes, 0.99):.2f}, max {flushes[-1]:.0f} ms",
            f"{len(stalls)} of {len(flushes)} flushes over {self.STALL_MS:.0f} ms, "
            f"{sum(stalls):.0f} ms in all",
        )


def run(args: argparse.Namespace, tmp: Path, fig: Figures) -> dict[str, float]:
    from django.db import connections

    scaled = lambda n: max(10, round(n * args.scale))  # noqa: E731
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    secret, topic, _, scratch_partition = create_fixtures(stamp)
    from broker.core import keys, topics

    consume_topic, e2e_topic = f"bench-pm-consume-{stamp}", f"bench-pm-e2e-{stamp}"
    topics.create_topic(keys.CONSOLE, consume_topic, 1)
    topics.create_topic(keys.CONSOLE, e2e_topic, 1)
    out: dict[str, float] = {}

    if "produce" in args.only:
        progress("raw single-row INSERT + COMMIT into the same database")
        raw = raw_single_inserts(scratch_partition, scaled(SEQUENTIAL))
        out["raw_p50"] = p(raw, 0.5)
        fig.add(
            "raw insert+commit, one row", f"p50 {p(raw, 0.5):.2f} ms, p99 {p(raw, 0.99):.2f} ms"
        )
    connections.close_all()

    bare_port, port = free_port(), free_port()
    bare = start_bare(bare_port, tmp / "bare.log", args.server)
    server = start_daphne(port, tmp / "daphne.log", server=args.server)
    try:
        bare_url, url = f"http://127.0.0.1:{bare_port}", f"http://127.0.0.1:{port}"
        wait_bare(bare_url, bare)
        wait_healthy(url, server, tmp / "daphne.log")
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        path = f"/api/v1/topics/{topic}/messages"
        ws_url = f"ws://127.0.0.1:{port}/ws/v1/"

        if "produce" in args.only:
            progress("sequential round trips: bare ASGI app, health, single-message produce")
            with httpx.Client(base_url=bare_url, headers=headers) as client:
                bare_times = sequential(
                    client, lambda c: c.post("/", content=RICH_BODY), scaled(SEQUENTIAL)
                )
            with httpx.Client(base_url=url, headers=headers) as client:
                health = sequential(
                    client, lambda c: c.get("/api/v1/health"), scaled(SEQUENTIAL) // 2
                )
                produce = sequential(
                    client, lambda c: c.post(path, content=RICH_BODY), scaled(SEQUENTIAL)
                )
            out["bare_p50"], out["produce_p50"] = p(bare_times, 0.5), p(produce, 0.5)
            fig.add(
                "bare ASGI round trip",
                f"p50 {p(bare_times, 0.5):.2f} ms, p99 {p(bare_times, 0.99):.2f} ms",
            )
            fig.add(
                "GET /api/v1/health",
                f"p50 {p(health, 0.5):.2f} ms, p99 {p(health, 0.99):.2f} ms",
                f"{p(health, 0.5) / out['bare_p50']:.1f}x bare",
            )
            fig.add(
                "single-message produce (key, headers, bytes)",
                f"p50 {p(produce, 0.5):.2f} ms, p99 {p(produce, 0.99):.2f} ms",
                f"{out['produce_p50'] / out['bare_p50']:.1f}x bare "
                f"(target <= {TARGET_PRODUCE_VS_BARE:.0f}x)",
            )

            progress(f"server CPU per request, {CPU_CLIENTS} concurrent clients")
            total = scaled(CONCURRENT_MESSAGES)
            bare_rate, bare_cpu = concurrent_posts(
                [bare_url], "/", headers, RICH_BODY, total, CPU_CLIENTS, [bare.pid]
            )
            out["bare_cpu_ms"] = bare_cpu * 1000
            fig.add(
                f"bare ASGI x{CPU_CLIENTS}",
                f"{bare_rate:,.0f} req/s",
                f"server CPU {bare_cpu * 1e3:.3f} ms/request",
            )
            one_process: dict[int, float] = {}
            for clients in CONCURRENT:
                usage = Usage()
                rate, cpu = concurrent_posts(
                    [url], path, headers, RICH_BODY, total, clients, [server.pid], usage
                )
                one_process[clients] = rate
                note = f"server CPU {cpu * 1e3:.3f} ms/msg"
                if clients == CPU_CLIENTS:
                    out["produce_cpu_ms"] = cpu * 1000
                    note += f" = {cpu / bare_cpu:.1f}x bare (target <= {TARGET_CPU_VS_BARE:.0f}x)"
                fig.add(f"single-message produce x{clients}", f"{rate:,.0f} msgs/s", note)
                if clients == CPU_CLIENTS and args.processes > 1:
                    fig.add(f"… during x{clients}", "", usage.describe())
            if args.processes > 1:
                produce_on_processes(args, tmp, fig, url, server, path, headers, total, one_process)

        if "consume" in args.only:
            progress("WebSocket consume, prefetch 2, an ack frame per message")
            count = scaled(CONSUME_MESSAGES)
            with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
                for first in range(0, count, 1000):
                    chunk = range(first, min(count, first + 1000))
                    body = orjson.dumps({"messages": [{"value": i} for i in chunk]})
                    client.post(
                        f"/api/v1/topics/{consume_topic}/messages", content=body
                    ).raise_for_status()
            loop_on = lambda url, pid: consume_measured(url, pid, secret, consume_topic, count)  # noqa: E731
            rate, bare_cpu = loop_on(f"ws://127.0.0.1:{bare_port}/", bare.pid)
            out["bare_consume_msgs_s"] = rate
            fig.add(
                "bare WS loop prefetch 2, ack each",
                f"{rate:,.0f} msgs/s",
                f"server CPU {bare_cpu * 1e3:.3f} ms/msg",
            )
            rate, cpu = loop_on(ws_url, server.pid)
            out["consume_msgs_s"] = rate
            fig.add(
                "WS consume prefetch 2, ack each",
                f"{rate:,.0f} msgs/s",
                f"server CPU {cpu * 1e3:.3f} ms/msg = {cpu / bare_cpu:.1f}x bare "
                f"(target >= {TARGET_CONSUME_MSGS_S:,} msgs/s)",
            )

        if "e2e" in args.only:
            e2e_rate = args.e2e_rate
            progress(f"end to end: {e2e_rate} single-message publishes/s for {LATENCY_SECONDS} s")
            # The same run against the bare app's durable forwarder first: the transport's
            # and the disk's share of the trip on this machine, beside which Ferry's is read.
            cpu0, wall0 = cpu_seconds(bare.pid), time.time()
            bare_ws = f"ws://127.0.0.1:{bare_port}/e2e"
            bare_e2e = asyncio.run(end_to_end(bare_ws, secret, e2e_topic, e2e_rate)).arrived
            bare_cpu, wall = cpu_seconds(bare.pid) - cpu0, time.time() - wall0
            out["bare_e2e_p50"], out["bare_e2e_p99"] = p(bare_e2e, 0.5), p(bare_e2e, 0.99)
            out["bare_e2e_cpu_ms"] = bare_cpu / len(bare_e2e) * 1000
            fig.add(
                f"bare end to end at {e2e_rate} msgs/s (flush, forward)",
                f"p50 {p(bare_e2e, 0.5):.2f} ms, p99 {p(bare_e2e, 0.99):.2f} ms",
                f"server CPU {out['bare_e2e_cpu_ms']:.3f} ms/msg, busy {bare_cpu / wall:.0%}",
            )
            calls0 = database_calls(url)
            cpu0, client0, wall0 = cpu_seconds(server.pid), cpu_seconds(os.getpid()), time.time()
            with FlushProbe(tmp) as flushes:
                timings = asyncio.run(end_to_end(ws_url, secret, e2e_topic, e2e_rate))
            wall = time.time() - wall0
            calls = {
                key: [a - b for a, b in zip(now, calls0.get(key, [0.0] * 3), strict=True)]
                for key, now in database_calls(url).items()
            }
            cpu, client_cpu = cpu_seconds(server.pid) - cpu0, cpu_seconds(os.getpid()) - client0
            e2e = timings.arrived
            out["e2e_p50"], out["e2e_p99"] = p(e2e, 0.5), p(e2e, 0.99)
            fig.add(
                f"end to end at {e2e_rate} msgs/s",
                f"p50 {p(e2e, 0.5):.2f} ms, p99 {p(e2e, 0.99):.2f} ms",
                f"(target p50 <= {TARGET_E2E_P50_MS:.0f}, p99 <= {TARGET_E2E_P99_MS:.0f} ms)",
            )
            answered, pushed = timings.answered, timings.pushed
            fig.add(
                "… publish to its answer / answer to arrival",
                f"p50 {p(answered, 0.5):.2f} / {p(pushed, 0.5):.2f} ms",
                f"p99 {p(answered, 0.99):.2f} / {p(pushed, 0.99):.2f} ms",
            )
            # Both processes share the machine's cores: how busy each was says whether the
            # latency is the server's work or the machine's limit.
            fig.add(
                "… CPU during it, server / bench client",
                f"{cpu / len(e2e) * 1e3:.3f} / {client_cpu / len(e2e) * 1e3:.3f} ms/msg",
                f"busy {cpu / wall:.0%} / {client_cpu / wall:.0%} of a core; server "
                f"{cpu / len(e2e) * 1e3 / out['bare_e2e_cpu_ms']:.1f}x bare",
            )
            if connections["default"].vendor == "sqlite":
                # On the embedded default each answer waits for a flush of this disk.
                fig.add("… the disk meanwhile, a 4 KiB flush every 10 ms", *flushes.describe())
            # The server's database calls: where each message's ran (its writer thread, or
            # its event loop: ADR 0021), how busy the writer was, and its queue.
            per_message = {key: c / len(e2e) for key, (c, _, _) in calls.items()}
            shown = sorted((n, key) for key, n in per_message.items() if n >= 0.01)
            writer = [figures for (pool, _), figures in calls.items() if pool == "write"]
            writer_calls = sum(c for c, _, _ in writer) or 1
            fig.add(
                "… database calls per message",
                ", ".join(f"{pool} {name} {n:.2f}" for n, (pool, name) in reversed(shown)),
                f"writer busy {sum(b for _, b, _ in writer) / wall:.0%} of the run, "
                f"{sum(q for _, _, q in writer) / writer_calls * 1e3:.2f} ms queued a call",
            )
    finally:
        stop_daphne(server)
        stop_daphne(bare)
    return out


def produce_on_processes(
    args: argparse.Namespace,
    tmp: Path,
    fig: Figures,
    url: str,
    server: subprocess.Popen[bytes],
    path: str,
    headers: dict[str, str],
    total: int,
    one_process: dict[int, float],
) -> None:
    """The concurrent single-message produce again, over args.processes Daphne processes."""
    n = args.processes
    progress(f"single-message produce on {n} processes")
    ports = [free_port() for _ in range(n - 1)]
    others = [start_daphne(port, tmp / f"daphne-{port}.log", server=args.server) for port in ports]
    try:
        urls = [url] + [f"http://127.0.0.1:{port}" for port in ports]
        for other_url, other, port in zip(urls[1:], others, ports, strict=True):
            wait_healthy(other_url, other, tmp / f"daphne-{port}.log")
        pids = [server.pid] + [other.pid for other in others]
        for clients in CONCURRENT:
            usage = Usage()
            rate, cpu = concurrent_posts(
                urls, path, headers, RICH_BODY, total, clients, pids, usage
            )
            fig.add(
                f"single-message produce x{clients}, {n} processes",
                f"{rate:,.0f} msgs/s",
                f"{rate / one_process[clients]:.2f}x one process; "
                f"server CPU {cpu * 1e3:.3f} ms/msg (summed)",
            )
            if clients == CPU_CLIENTS:
                fig.add(f"… during x{clients}, {n} processes", "", usage.describe())
    finally:
        for other in others:
            stop_daphne(other)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every count (default 1.0)"
    )
    parser.add_argument(
        "--only",
        default="produce,consume,e2e",
        help="comma-separated parts to run: produce (with the references), consume, e2e",
    )
    parser.add_argument(
        "--server",
        choices=("daphne", "uvicorn"),
        default="daphne",
        help="serve Ferry and the bare app under Daphne (default, as Ferry runs) or uvicorn "
        "(docs/decisions/0018-daphne-stays.md)",
    )
    parser.add_argument(
        "--e2e-rate",
        type=int,
        default=LATENCY_RATE,
        help=f"the end-to-end test's single-message publishes per second (default {LATENCY_RATE})",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="also run the concurrent single-message produce against this many Daphne "
        "processes (PostgreSQL, with Redis)",
    )
    args = parser.parse_args()
    args.only = set(args.only.split(","))
    if args.processes > 1 and not os.environ.get("DATABASE_URL"):
        parser.error("--processes needs PostgreSQL: run it under scripts/with-postgres")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    redis_dir: Path | None = None
    if args.processes > 1 and not os.environ.get("REDIS_URL"):
        redis_dir, os.environ["REDIS_URL"] = start_redis(tmp)
        progress(f"redis at {os.environ['REDIS_URL']}")
    progress(f"data dir {tmp}; migrating")
    setup_django(tmp)
    fig = Figures()
    try:
        run(args, tmp, fig)
    finally:
        if redis_dir is not None:
            progress("stopping redis")
            subprocess.run([str(ROOT / "scripts/redis"), "stop", str(redis_dir)], check=False)
    print(f"\n== Per-message path ({database_description()}) ==")
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cpus")
    print(f"server : {args.server}")
    print(f"layer  : {'Redis' if os.environ.get('REDIS_URL') else 'in-memory'} channel layer")
    print(f"command: {command_line()}")
    width = max(len(name) for name, _, _ in fig.rows)
    for name, value, note in fig.rows:
        print(f"{name:<{width}}  {value:<28} {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
