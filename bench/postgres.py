"""PostgreSQL speed and scale-out (issue 18): Ferry beside plain SQL on the same server.

Run by `make bench` (scripts/bench) on a throwaway PostgreSQL (scripts/with-postgres exports
DATABASE_URL); not part of the test suite (STYLE.md §6). One process, one machine, one run:

1. reference (PostgreSQL only), psycopg 3 straight to the same server, one connection:
   - produce: `executemany` of a single-row INSERT of (key text, value bytea) rows, keyed
     256-byte values, into a plain table (bigserial primary key, no other index), then COMMIT,
     B rows per transaction (B = 1, 100, 1000);
   - consume: `SELECT id, key, value ... ORDER BY id LIMIT B FOR UPDATE SKIP LOCKED`, then
     `DELETE ... WHERE id = ANY(ids)`, then COMMIT, until the table is empty;
2. the floor (PostgreSQL only): the B=100 consume of 3., the same client, against
   bench/bare_asgi.py's /consume under the same Daphne. Each ack frame's receipts settled, the
   next messages read, marked in flight and the cursor moved in one transaction on a worker
   thread: no Django, no Channels, no groups. Once as one statement (one round trip), once as
   Ferry's two round trips through its own libpq path (broker/core/pgwire.py), once as one
   statement that reads no message (the messages pushed from the server's memory, as Ferry
   pushes its recent ones); msgs/s and CPU beside Ferry's;
3. Ferry on one Daphne process (the in-memory channel layer, background jobs off, as
   bench/websocket.py), on the database the environment names (PostgreSQL, or the embedded
   SQLite when DATABASE_URL is unset: `.venv/bin/python bench/postgres.py --only ferry`):
   - produce over REST, one sequential client, B keyed 256-byte messages per request, into a
     1-partition topic per B;
   - consume those messages over one WebSocket, prefetch 2*B, an ack frame per B messages,
     until every message is settled (the last `acked` answered); every (partition, offset)
     exactly once;
   - round trip at prefetch 2: with both messages of the credit in hand, ack them in one frame
     and time until the next `messages` frame arrives; p50/p99;
   - end to end at 100 msgs/s: single-message publish frames to a subscriber, p50/p99;
   - the broker's (Daphne's /proc/<pid>/stat) and PostgreSQL's CPU per 1,000 messages;
   - on PostgreSQL the message table is analyzed (untimed) between produce and consume, so
     that every consume reads its new partitions with the same plan (see analyze());
   - sqlite (PostgreSQL runs only): the same part again on the embedded SQLite, in a child
     run of this script right after it, for the target "consume+ack B=100 on PostgreSQL >=
     the same on SQLite" in one run, and the bare floor beside Ferry on SQLite;
4. scale-out (PostgreSQL only, as root with cgroup v1's cpu controller): 1, 2 and 4 Daphne
   processes on the same PostgreSQL, with a private Redis (scripts/redis) as the channel layer
   and background jobs off, each process held to 0.2 of a core (cpu.cfs_quota_us 20000 of
   cpu.cfs_period_us 100000 in /sys/fs/cgroup/cpu/ferry-bench-<pid>-<n>/): a stand-in for one
   process per machine. The clients connect through HAProxy on one port in front of them
   (scripts/haproxy, the README's production set-up; not held to a quota, its CPU printed
   apart), or with --no-balancer each to one process's port, round robin; with --tls HAProxy
   ends TLS (a self-signed certificate from `scripts/haproxy cert`, which the clients verify),
   as the README's set-up with FERRY_LB_CERT. Per process count:
   - produce: 16 producer threads, B=100 keyed messages per request, a 4-partition topic,
     measured after each producer's request to another topic (--warm: how many) has warmed up
     the new processes; afterwards every partition's offsets are contiguous (results and end
     offsets agree); then the same producers again, each request to one partition's URL
     (produce/p; --no-by-partition: not), and twice through ferry_client's Producer, keyed
     send_async flushed every 4 requests' worth as 4 requests: hints off, each request mixing
     the partitions (produce/c), and a request a partition with the Ferry-Partition-Hint
     header that HAProxy routes by (produce/k) (with --by-key);
   - consume: 4 WebSocket consumers in one clustering group (prefetch 200, an ack frame per 100
     messages) take every message exactly once;
   - msgs/s and the ratio to one process; CPU per 1,000 messages of the Daphne processes
     (summed) and of PostgreSQL (the postmaster and its children, exited ones included); how
     much of the quota the processes used and how long they were throttled; PostgreSQL's
     transaction ids assigned (a write transaction and each writing savepoint take one) and
     WAL written per 1,000 messages, and what its client backends were doing
     (pg_stat_activity sampled every 20 ms: running, waiting on a lock, idle in a
     transaction), with the statements most often seen waiting on a lock; and how busy the
     whole machine was (/proc/stat: the share of its cores in use);
   - first, each set of processes idle for 2 s: their CPU doing nothing;
   - with a count repeated (--processes 1,4,1,4,1,4), each phase's ratios against the
     one-process phase just before it, and their medians;
   - --statements: pg_stat_statements is loaded (ALTER SYSTEM, the throwaway server
     restarted) and each scale-out phase's top statements are printed per 1,000 messages;
   - then (--no-shape: not) PostgreSQL alone in each process count's produce shape
     (bench/pg_shape.py): as many writer processes, the same messages a commit and rate, no
     Ferry; its CPU a message against the one-process shape's, beside Ferry's: what of the
     rise at more processes is PostgreSQL's own.
5. prints one table with the targets beside the figures, and stops every process it started
   by its PID (Daphnes, Redis), removing the cgroups (always).

    scripts/with-postgres .venv/bin/python bench/postgres.py [--scale 0.2] [--only ...]
        [--processes 1,2,4] [--producers 16] [--warm 1] [--statements] [--no-balancer | --tls]
        [--no-by-partition] [--by-key] [--no-shape] [--figures FILE]
"""

import argparse
import asyncio
import os
import platform
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import orjson
import pg_shape
from bare_asgi import BARE_SCHEMA
from per_message import end_to_end, machine_ticks, start_bare, wait_bare
from pg_server import TICKS, data_directory, pg_connect, postgres_cpu, postmaster_pid
from produce_fetch import (
    ROOT,
    VALUE,
    VALUE_BYTES,
    command_line,
    cpu_seconds,
    database_description,
    free_port,
    progress,
    setup_django,
    start_daphne,
    start_redis,
    stop_daphne,
    wait_healthy,
)
from websocket import frame, open_ws, percentile, receive, subscribe
from websockets.asyncio.client import ClientConnection

if TYPE_CHECKING:
    from ferry_client import SendResult

BATCHES = (1, 100, 1000)
# Messages per batch size at --scale 1: the reference's and Ferry's.
REFERENCE_MESSAGES = {1: 5000, 100: 100_000, 1000: 200_000}
FERRY_MESSAGES = {1: 1000, 100: 50_000, 1000: 100_000}
ROUND_TRIPS = 300
E2E_RATE, E2E_SECONDS = 100, 5
PROCESSES = (1, 2, 4)
PRODUCERS, SCALE_BATCH, SCALE_PARTITIONS = 16, 100, 4
SCALE_REQUESTS = 50  # per producer at --scale 1
# Requests each producer sends to a warm-up topic before a scale-out phase is measured (--warm).
# Ten instead of one changed nothing of the phases' figures (docs/benchmarks.md, session 26).
SCALE_WARM_REQUESTS = 1
CONSUMERS, SCALE_PREFETCH, SCALE_ACK = 4, 200, 100
CORE_SHARE = 0.2
CFS_PERIOD_US = 100_000
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
SAMPLE_EVERY_S = 0.02
IDLE_S = 2.0
WAIT_S = 120
TARGET_CONSUME_VS_REFERENCE = 0.9
TARGET_CONSUME_VS_SQLITE = 1.0
TARGET_ROUND_TRIP_MS = 3.0
TARGET_SCALE = {2: 1.8, 4: 3.2}
TARGET_CPU_GROWTH = 0.15
CORES = os.cpu_count() or 1


def body(batch: int, prefix: str = "k") -> bytes:
    """A produce request of batch keyed 256-byte messages."""
    return orjson.dumps(
        {"messages": [{"key": f"{prefix}{i}", "value": VALUE} for i in range(batch)]}
    )


def scaled(n: int, scale: float, least: int = 10) -> int:
    return max(least, round(n * scale))


# --- CPU accounting ----------------------------------------------------------------------


def bench_cpu() -> float:
    times = os.times()
    return times.user + times.system


# --- PostgreSQL: the reference, the server's pid, statistics ------------------------------


def load_pg_stat_statements(url: str) -> None:
    """Restart the throwaway server with pg_stat_statements loaded (scripts/postgres resume)."""
    directory = data_directory(url).parent
    with pg_connect(url, "postgres") as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    progress(f"restarting PostgreSQL in {directory} with pg_stat_statements")
    for action in ("stop", "resume"):
        subprocess.run([str(ROOT / "scripts/postgres"), action, str(directory)], check=True)
    with pg_connect(url, "ferry") as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def reference(url: str, scale: float) -> dict[str, dict[int, float]]:
    """Plain executemany + COMMIT produce, then SELECT .. FOR UPDATE + DELETE + COMMIT consume."""
    out: dict[str, dict[int, float]] = {"produce": {}, "consume": {}}
    with pg_connect(url) as conn:
        for batch in BATCHES:
            table = f"bench_plain_{batch}"
            total = scaled(REFERENCE_MESSAGES[batch], scale, batch * 5) // batch * batch
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(
                f"CREATE TABLE {table} (id bigserial PRIMARY KEY, key text NOT NULL,"
                " value bytea NOT NULL)"
            )
            conn.commit()
            rows = [(f"k{i}", VALUE_BYTES) for i in range(batch)]
            insert = f"INSERT INTO {table} (key, value) VALUES (%s, %s)"
            progress(f"reference produce: {total // batch} transactions of {batch} row(s)")
            with conn.cursor() as cur:
                started = time.perf_counter()
                for _ in range(total // batch):
                    cur.executemany(insert, rows)
                    conn.commit()
                out["produce"][batch] = total / (time.perf_counter() - started)
            progress(f"  {out['produce'][batch]:,.0f} msgs/s")
            select = (
                f"SELECT id, key, value FROM {table} ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
            )
            delete = f"DELETE FROM {table} WHERE id = ANY(%s)"
            progress(f"reference consume: {batch} row(s) per transaction")
            got = 0
            with conn.cursor() as cur:
                started = time.perf_counter()
                for _ in range(total // batch + 1):
                    cur.execute(select, (batch,))
                    ids = [row[0] for row in cur.fetchall()]
                    if not ids:
                        break
                    cur.execute(delete, (ids,))
                    conn.commit()
                    got += len(ids)
                out["consume"][batch] = got / (time.perf_counter() - started)
            conn.commit()
            if got != total:
                raise RuntimeError(f"reference consume took {got} of {total} rows")
            progress(f"  {out['consume'][batch]:,.0f} msgs/s")
            conn.execute(f"DROP TABLE {table}")
            conn.commit()
    return out


def analyze(url: str) -> None:
    """ANALYZE the message table, so that the planner knows the partitions just filled.

    Without it a partition created after the table's last ANALYZE is estimated at about one
    row, and the read of a delivery (`partition_id = %s AND "offset" >= %s AND "offset" < %s
    ORDER BY "offset"`) may pick message_partition_ts_idx and filter the whole partition
    instead of the (partition_id, offset) index: see docs/benchmarks.md. Untimed.
    """
    with pg_connect(url, "ferry") as conn:
        conn.execute("ANALYZE broker_message")


def database_counters(url: str) -> dict[str, int]:
    """The next transaction id and the WAL position: unlike pg_stat_database, which backends
    report up to seconds late, both move at once. Neither query assigns an id or writes WAL."""
    with pg_connect(url, "postgres") as conn:
        row = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
            " pg_current_wal_lsn() - '0/0'::pg_lsn"
        ).fetchone()
    return {"xids": int(row[0]), "wal": int(row[1])}


class ActivitySampler:
    """pg_stat_activity of the ferry database's client backends, every SAMPLE_EVERY_S.

    Its own connection is to the `postgres` database, so that its queries are not counted with
    the ferry database's statements; its backend's CPU is taken off PostgreSQL's (own_cpu).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples = 0
        # CPU seconds of the sampler's own backend, to be taken off PostgreSQL's.
        self.own_cpu = 0.0
        self.states: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = (
            "SELECT state, wait_event_type, wait_event, left(query, 60) FROM pg_stat_activity"
            " WHERE datname = 'ferry' AND backend_type = 'client backend'"
        )
        with pg_connect(self.url, "postgres") as conn:
            backend = conn.info.backend_pid
            while not self._stop.wait(SAMPLE_EVERY_S):
                rows = conn.execute(query).fetchall()
                self.samples += 1
                for state, wait_type, wait_event, text in rows:
                    if state == "active" and wait_type == "Lock":
                        self.states["lock wait"] += 1
                        self.waiting[f"{wait_event}: {' '.join(text.split())}"] += 1
                    elif state == "active" and wait_type is None:
                        self.states["running"] += 1
                    elif state == "active":
                        self.states[f"{wait_type}"] += 1
                    elif state == "idle in transaction":
                        self.states["idle in txn"] += 1
            self.own_cpu = cpu_seconds(backend)

    def __enter__(self) -> "ActivitySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def mean(self, state: str) -> float:
        return self.states[state] / max(1, self.samples)


def statements_reset(url: str) -> None:
    with pg_connect(url, "ferry") as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def statements_top(url: str, limit: int = 10) -> list[tuple[int, float, int, str]]:
    """(calls, total ms, rows, query) of the ferry database's costliest statements."""
    with pg_connect(url, "ferry") as conn:
        rows = conn.execute(
            "SELECT calls, total_exec_time, rows, query FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'ferry')"
            " AND query NOT LIKE '%%pg_stat_statements%%'"
            " ORDER BY total_exec_time DESC LIMIT %s",
            (limit,),
        ).fetchall()
    return [(r[0], r[1], r[2], " ".join(r[3].split())) for r in rows]


def statements_control(url: str) -> dict[str, int]:
    """Calls of the transaction-control statements: commits, rollbacks, savepoints."""
    with pg_connect(url, "ferry") as conn:
        rows = conn.execute(
            "SELECT upper(split_part(query, ' ', 1)) || CASE WHEN query ILIKE 'rollback to%%'"
            " THEN ' TO' ELSE '' END, sum(calls) FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'ferry')"
            " AND split_part(upper(query), ' ', 1) IN"
            " ('BEGIN', 'COMMIT', 'ROLLBACK', 'SAVEPOINT', 'RELEASE') GROUP BY 1"
        ).fetchall()
        total = conn.execute(
            "SELECT sum(calls) FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'ferry')"
        ).fetchone()[0]
    return {"all statements": int(total or 0)} | {name: int(calls) for name, calls in rows}


# --- cgroup v1 CPU quota -------------------------------------------------------------------


def cgroup_unavailable() -> str | None:
    """Why the CPU quota cannot be set here, or None."""
    if os.geteuid() != 0:
        return "not root (cgroup v1 quotas need root)"
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CGROUP_CPU}"
    probe = CGROUP_CPU / f"ferry-bench-{os.getpid()}-probe"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"cannot create a cgroup under {CGROUP_CPU}: {exc}"
    return None


class Quota:
    """One cgroup per Daphne process, each held to CORE_SHARE of a core."""

    def __init__(self, index: int) -> None:
        self.path = CGROUP_CPU / f"ferry-bench-{os.getpid()}-{index}"
        self.path.mkdir()
        (self.path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (self.path / "cpu.cfs_quota_us").write_text(str(round(CFS_PERIOD_US * CORE_SHARE)))

    def add(self, pid: int) -> None:
        """The process and all its threads (cgroup.procs moves the thread group)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled_s(self) -> float:
        for line in (self.path / "cpu.stat").read_text().splitlines():
            name, value = line.split()
            if name == "throttled_time":
                return int(value) / 1e9
        return 0.0

    def remove(self) -> None:
        """rmdir, after moving any process still in it back to the root group."""
        with suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with suppress(OSError):
                    (CGROUP_CPU / "cgroup.procs").write_text(pid)
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        progress(f"could not remove {self.path}")


# --- Ferry over REST and WebSocket --------------------------------------------------------


@dataclass
class Counted:
    """A phase's rate and what it cost, per 1,000 messages."""

    messages: int
    seconds: float
    broker_cpu: float = 0.0
    postgres_cpu: float = 0.0
    bench_cpu: float = 0.0
    throttled: float = 0.0
    host_cpu: float = 0.0  # the whole machine's busy CPU seconds (per_message.machine_ticks)
    balancer_cpu: float = 0.0  # HAProxy's, when the clients go through it
    xids: int = 0
    wal_bytes: int = 0
    control: dict[str, int] = field(default_factory=dict)
    activity: dict[str, float] = field(default_factory=dict)
    waits: list[tuple[str, int]] = field(default_factory=list)
    statements: list[tuple[int, float, int, str]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    def per_1k(self, value: float) -> float:
        return value / self.messages * 1000

    def against(self, base: "Counted") -> tuple[float, float, float]:
        """This phase's msgs/s, broker CPU and PostgreSQL CPU a message, each ÷ base's."""
        return (
            self.rate / base.rate,
            self.per_1k(self.broker_cpu) / base.per_1k(base.broker_cpu),
            self.per_1k(self.postgres_cpu) / base.per_1k(base.postgres_cpu),
        )


class Meter:
    """CPU, commits, lock waits and statements around a phase."""

    def __init__(
        self,
        url: str | None,
        daphnes: list[int],
        postmaster: int | None,
        balancer: int | None = None,
    ) -> None:
        self.url, self.daphnes, self.postmaster = url, daphnes, postmaster
        self.balancer = balancer
        self.quotas: list[Quota] = []
        self.statements = False

    def cpu(self) -> tuple[float, float, float, float, float, float]:
        broker = sum(cpu_seconds(pid) for pid in self.daphnes)
        pg = postgres_cpu(self.postmaster) if self.postmaster else 0.0
        throttled = sum(q.throttled_s() for q in self.quotas)
        balancer = cpu_seconds(self.balancer) if self.balancer else 0.0
        # The whole machine's busy CPU too: beside the processes' own, it tells a saturated one.
        return broker, pg, bench_cpu(), throttled, machine_ticks()[0] / TICKS, balancer

    @contextmanager
    def measure(self, messages: int) -> Iterator[Counted]:
        result = Counted(messages, 0.0)
        if self.url and self.statements:
            statements_reset(self.url)
        counters = database_counters(self.url) if self.url else {}
        sampler = ActivitySampler(self.url) if self.url else None
        before = self.cpu()
        started = time.perf_counter()
        if sampler:
            sampler.__enter__()
        try:
            yield result
        finally:
            if sampler:
                sampler.__exit__()
        result.seconds = time.perf_counter() - started
        after = self.cpu()
        (
            result.broker_cpu,
            result.postgres_cpu,
            result.bench_cpu,
            result.throttled,
            result.host_cpu,
            result.balancer_cpu,
        ) = (a - b for a, b in zip(after, before, strict=True))
        if self.url:
            now = database_counters(self.url)
            result.xids = now["xids"] - counters["xids"]
            result.wal_bytes = now["wal"] - counters["wal"]
        if sampler:
            result.postgres_cpu -= sampler.own_cpu
            progress(f"  (the sampler's backend used {sampler.own_cpu:.2f} s, not counted)")
            result.activity = {s: sampler.mean(s) for s in sampler.states}
            result.waits = sampler.waiting.most_common(3)
        if self.url and self.statements:
            result.statements = statements_top(self.url)
            result.control = statements_control(self.url)


# bench/bare_asgi.py's two consume floors: the path each is served at, and its row's label.
BARE_SHAPES = {
    "one": ("/consume", "bare consume+ack, B=100: one statement"),
    "two": ("/consume/two", "bare consume+ack, B=100: two round trips"),
    "memory": ("/consume/memory", "bare consume+ack, B=100: one statement, from memory"),
}


def bare_consume(url: str, tmp: Path, scale: float, postmaster: int | None, shape: str) -> Counted:
    """The B=100 consume of Ferry's run, the same client, against bench/bare_asgi.py's /consume
    under the same Daphne: the least a durable broker with per-message acks does on this
    PostgreSQL behind a WebSocket, its transaction one statement, (shape "two") Ferry's two
    round trips, or (shape "memory") one statement that reads no message, the messages pushed
    from the server's memory as Ferry pushes its recent ones (ADR 0024)."""
    total = scaled(FERRY_MESSAGES[100], scale, 500) // 100 * 100
    with pg_connect(url) as conn:
        conn.execute("DROP TABLE IF EXISTS bare_log, bare_inflight, bare_cursor")
        conn.execute(BARE_SCHEMA)
        now = int(time.time() * 1000)
        with conn.cursor() as cur, cur.copy("COPY bare_log FROM STDIN") as copy:
            for i in range(total):
                copy.write_row((i, f"k{i % 100}", VALUE_BYTES, now))
        conn.commit()
        conn.execute("ANALYZE bare_log")
        conn.commit()
    port = free_port()
    log_path = tmp / "bare-consume.log"
    path = BARE_SHAPES[shape][0]
    progress(f"bare consume at {path} on 127.0.0.1:{port}: {total} messages")
    os.environ["BARE_DATABASE_URL"] = url
    # Shape "memory" reads the log into the server's memory as it starts (untimed); set for
    # that server only (this process's children after it import bare_asgi too).
    os.environ["BARE_PRELOAD"] = "1" if shape == "memory" else "0"
    try:
        proc = start_bare(port, log_path, "daphne")
    finally:
        del os.environ["BARE_PRELOAD"]
    try:
        wait_bare(f"http://127.0.0.1:{port}/", proc)
        meter = Meter(url, [proc.pid], postmaster)
        with meter.measure(total) as counted:
            asyncio.run(
                consume([f"ws://127.0.0.1:{port}{path}"], "-", "bare", "bare", total, 200, 100)
            )
    finally:
        stop_daphne(proc)
    with pg_connect(url) as conn:
        left = conn.execute("SELECT count(*) FROM bare_inflight").fetchone()
        conn.execute("DROP TABLE bare_log, bare_inflight, bare_cursor")
        conn.commit()
    if left and left[0]:
        raise RuntimeError(f"bare consume left {left[0]} messages in flight")
    progress(f"  {counted.rate:,.0f} msgs/s")
    return counted


def produce_sequential(client: httpx.Client, topic: str, batch: int, requests: int) -> None:
    payload = body(batch)
    for _ in range(requests):
        response = client.post(f"/api/v1/topics/{topic}/messages", content=payload)
        if response.status_code != 200:
            raise RuntimeError(f"produce failed: {response.status_code} {response.text[:300]}")


def placed(result: "SendResult") -> tuple[int, int]:
    """A ferry_client SendResult's partition and offset (a message stored, not scheduled)."""
    if result.partition is None or result.offset is None:
        raise RuntimeError(f"not stored: {result}")
    return result.partition, result.offset


def balanced_keys(prefix: str) -> list[str]:
    """Keys prefix<n>, SCALE_BATCH of them in each partition, in the order n comes: a round of
    the client's produce is SCALE_PARTITIONS requests of SCALE_BATCH, mixed or a partition
    each, and none larger than the group commit takes (100 messages)."""
    from ferry_client.partitioner import partition_for_key

    counts = [0] * SCALE_PARTITIONS
    keys: list[str] = []
    n = 0
    while len(keys) < SCALE_PARTITIONS * SCALE_BATCH:
        key, n = f"{prefix}{n}", n + 1
        partition = partition_for_key(key, SCALE_PARTITIONS)
        if counts[partition] < SCALE_BATCH:
            counts[partition] += 1
            keys.append(key)
    return keys


# How the scale-out's producers route their requests (--by-partition, --by-key).
SPREAD, BY_PARTITION, CLIENT, BY_KEY = "spread", "partition", "client", "key"
ROUTE_LABELS = {
    BY_PARTITION: "each request to one partition's URL",
    CLIENT: "through ferry_client, a topic's batches mixing partitions (hints off)",
    BY_KEY: "through ferry_client, a batch a partition with its hint",
}


def produce_spread(
    urls: list[str],
    headers: dict[str, str],
    topics_: tuple[str, str],
    requests: int,
    meter: Meter,
    producers: int,
    warm_requests: int = 1,
    verify: ssl.SSLContext | bool = True,
    route: str = SPREAD,
) -> tuple[dict[int, list[int]], Counted]:
    """producers threads, producer i on urls[i % len]; the offsets each partition got.

    Each producer warms up (warm_requests requests to topics_[1]) before the measured part
    starts. SPREAD: each request of SCALE_BATCH keyed messages to the topic's URL, its keys
    spread over the partitions. BY_PARTITION: producer i sends each request to partition
    i % SCALE_PARTITIONS's URL (POST …/partitions/{p}/messages), which scripts/haproxy sends
    to one process a partition. CLIENT and BY_KEY: a ferry_client Producer queues
    SCALE_PARTITIONS requests' worth of keyed messages (send_async) and flushes them, as
    SCALE_PARTITIONS requests either way (the client gives every message an id). CLIENT: hints
    off, so each batch of SCALE_BATCH mixes the partitions, as the client batched before;
    BY_KEY: a batch a partition, each with the hint header that scripts/haproxy routes by
    (docs/client.md#partitions).
    """
    topic, warm_topic = topics_
    offsets: dict[int, list[int]] = {}
    failures: list[str] = []
    lock = threading.Lock()
    # The client sends whole rounds of SCALE_PARTITIONS requests' worth.
    rounds = max(1, requests // SCALE_PARTITIONS)
    through_client = route in (CLIENT, BY_KEY)
    per_producer = rounds * SCALE_PARTITIONS * SCALE_BATCH if through_client else None

    def keyed_client(i: int, url: str) -> list[tuple[int, int]]:
        from ferry_client import Message, Producer

        secret = headers["Authorization"].removeprefix("Bearer ")
        got: list[tuple[int, int]] = []
        hinted = route == BY_KEY
        with Producer(
            url,
            secret,
            verify=verify,
            linger_ms=WAIT_S * 1000,
            # A round: a batch a partition, or SCALE_PARTITIONS mixed ones; SCALE_BATCH each.
            batch_size=SCALE_BATCH,
            route_by_partition=hinted,
        ) as producer:
            for n in range(warm_requests):
                producer.send_batch(
                    warm_topic, [Message(VALUE, key=f"w{i}-{n}-{j}") for j in range(SCALE_BATCH)]
                )
            # Reads the measured topic's partition count before the clock starts.
            got.append(placed(producer.send(topic, VALUE, key=f"p{i}-first")))
            keys = [balanced_keys(f"p{i}-{r}-") for r in range(rounds)]
            barrier.wait()
            for r in range(rounds):
                futures = [producer.send_async(topic, VALUE, key=key) for key in keys[r]]
                producer.flush()
                got.extend(placed(f.result()) for f in futures)
        return got

    def work(i: int) -> None:
        payload = body(SCALE_BATCH, f"p{i}-")
        path = (
            f"partitions/{i % SCALE_PARTITIONS}/messages" if route == BY_PARTITION else "messages"
        )
        got: list[tuple[int, int]] = []
        try:
            if through_client:
                got = keyed_client(i, urls[i % len(urls)])
                return
            with httpx.Client(
                base_url=urls[i % len(urls)], headers=headers, timeout=60, verify=verify
            ) as client:
                for _ in range(warm_requests):
                    client.post(f"/api/v1/topics/{warm_topic}/{path}", content=payload)
                barrier.wait()
                for _ in range(requests):
                    response = client.post(f"/api/v1/topics/{topic}/{path}", content=payload)
                    if response.status_code != 200:
                        failures.append(f"{response.status_code} {response.text[:300]}")
                        return
                    got.extend((r["partition"], r["offset"]) for r in response.json()["results"])
        except Exception as exc:
            failures.append(repr(exc))
            raise
        finally:
            with lock:
                for partition, offset in got:
                    offsets.setdefault(partition, []).append(offset)

    barrier = threading.Barrier(producers + 1, timeout=WAIT_S)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(producers)]
    for t in threads:
        t.start()
    barrier.wait()
    with meter.measure((per_producer or requests * SCALE_BATCH) * producers) as counted:
        for t in threads:
            t.join()
    if failures:
        raise RuntimeError(f"produce failed: {failures[0]}")
    return offsets, counted


def check_contiguous(client: httpx.Client, topic: str, offsets: dict[int, list[int]]) -> None:
    """Each partition's offsets are 0..n-1, each once, and its end offset is n."""
    info = client.get(f"/api/v1/topics/{topic}").raise_for_status().json()
    for p in info["partition_offsets"]:
        mine = sorted(offsets.get(p["partition"], []))
        if mine != list(range(len(mine))) or p["end_offset"] != len(mine):
            raise RuntimeError(
                f"guarantee broken: partition {p['partition']} of {topic} has end offset "
                f"{p['end_offset']}, {len(mine)} offsets produced, contiguous: "
                f"{mine == list(range(len(mine)))}"
            )


async def consume(
    ws_urls: list[str],
    secret: str,
    topic: str,
    group: str,
    total: int,
    prefetch: int,
    ack: int,
    tls: ssl.SSLContext | None = None,
) -> None:
    """len(ws_urls) subscribers in one group take total messages, an ack frame per ack
    messages; returns when every message is settled. Each (partition, offset) exactly once."""
    seen: set[tuple[int, int]] = set()
    duplicates: list[tuple[int, int]] = []
    settled = 0
    received = asyncio.Event()
    all_settled = asyncio.Event()
    pending: dict[int, list[str]] = {}

    async def member(i: int, ws: ClientConnection) -> None:
        nonlocal settled
        mine = pending[i]
        while True:
            data = await receive(ws)
            if data["type"] == "messages":
                for m in data["items"]:
                    where = (m["partition"], m["offset"])
                    if where in seen:
                        duplicates.append(where)
                    seen.add(where)
                    mine.append(m["receipt"])
                while len(mine) >= ack:
                    await ws.send(frame(type="ack", sub="s", receipts=mine[:ack]))
                    del mine[:ack]
                if len(seen) >= total:
                    received.set()
            elif data["type"] == "acked":
                settled += data["settled"]
                if settled >= total:
                    all_settled.set()

    sockets = [await open_ws(url, secret, tls) for url in ws_urls]
    tasks: list[asyncio.Task[None]] = []
    try:
        for i, ws in enumerate(sockets):
            pending[i] = []
            await subscribe(ws, topic, group, prefetch=prefetch, client=f"bench-{i}")
            tasks.append(asyncio.create_task(member(i, ws)))
        for event in (received, all_settled):
            waiter = asyncio.create_task(event.wait())
            finished, _ = await asyncio.wait(
                [waiter, *tasks], timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED
            )
            for task in finished:
                if task is not waiter:
                    task.result()  # a member ended: raise its error
            if not event.is_set():
                waiter.cancel()
                raise RuntimeError(
                    f"consume: {len(seen)} of {total} received, {settled} settled in {WAIT_S} s"
                )
            if event is received:
                # What each member holds short of a full ack frame, settled now.
                for i, ws in enumerate(sockets):
                    if pending[i]:
                        receipts = list(pending[i])
                        pending[i].clear()
                        await ws.send(frame(type="ack", sub="s", receipts=receipts))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    if duplicates or len(seen) != total or settled != total:
        raise RuntimeError(
            f"guarantee broken: {len(seen)} distinct of {total} messages received, "
            f"{len(duplicates)} twice (first {duplicates[:3]}), {settled} settled"
        )


async def round_trips(ws_url: str, secret: str, topic: str, count: int) -> list[float]:
    """Milliseconds from an ack of both messages in hand (prefetch 2) to the next messages."""
    times: list[float] = []
    async with await open_ws(ws_url, secret) as ws:
        await subscribe(ws, topic, "bench-round-trip", prefetch=2)
        held: list[str] = []
        sent_at = 0.0
        while len(times) < count:
            data = await receive(ws)
            if data["type"] != "messages":
                continue
            if sent_at:
                times.append((time.perf_counter() - sent_at) * 1000)
                sent_at = 0.0
            held.extend(m["receipt"] for m in data["items"])
            if len(held) >= 2:
                await ws.send(frame(type="ack", sub="s", receipts=held))
                sent_at = time.perf_counter()
                held = []
    return sorted(times)


@dataclass
class Single:
    """Ferry on one Daphne process: per batch size, produce and consume; round trip; e2e."""

    produce: dict[int, Counted] = field(default_factory=dict)
    consume: dict[int, Counted] = field(default_factory=dict)
    round_trip: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    on_postgres: bool = False
    round_trip_cost: Counted | None = None


def ferry_single(
    args: argparse.Namespace, tmp: Path, secret: str, url: str | None, postmaster: int | None
) -> Single:
    from broker.core import keys, topics

    stamp = f"{os.getpid()}-{time.strftime('%H%M%S')}"
    names = {b: f"bench-pg-b{b}-{stamp}" for b in BATCHES}
    warm, rt, e2e = (f"bench-pg-{k}-{stamp}" for k in ("warm", "rt", "e2e"))
    for name in [*names.values(), warm, rt, e2e]:
        topics.create_topic(keys.CONSOLE, name, 1)
    from django.db import connections

    connections.close_all()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # in-memory channel layer
    port = free_port()
    log_path = tmp / "daphne-single.log"
    progress(f"starting daphne on 127.0.0.1:{port} (in-memory channel layer)")
    proc = start_daphne(port, log_path, env=env)
    out = Single(on_postgres=postmaster is not None)
    try:
        http_url, ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws/v1/"
        wait_healthy(http_url, proc, log_path)
        meter = Meter(url, [proc.pid], postmaster)
        meter.statements = args.statements
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        with httpx.Client(base_url=http_url, headers=headers, timeout=60) as client:
            for batch in BATCHES:
                requests = scaled(FERRY_MESSAGES[batch], args.scale, batch * 5) // batch
                produce_sequential(client, warm, batch, max(1, 20 // batch))  # untimed
                progress(f"ferry produce: {requests} requests of {batch}")
                with meter.measure(requests * batch) as counted:
                    produce_sequential(client, names[batch], batch, requests)
                out.produce[batch] = counted
                if url:
                    analyze(url)
                progress(f"  {counted.rate:,.0f} msgs/s")
                progress(f"ferry consume: prefetch {2 * batch}, an ack per {batch}")
                with meter.measure(requests * batch) as counted:
                    asyncio.run(
                        consume(
                            [ws_url],
                            secret,
                            names[batch],
                            f"bench-pg-{batch}",
                            requests * batch,
                            2 * batch,
                            batch,
                        )
                    )
                out.consume[batch] = counted
                progress(f"  {counted.rate:,.0f} msgs/s")
            trips = scaled(ROUND_TRIPS, args.scale)
            produce_sequential(client, rt, 100, (2 * trips + 10) // 100 + 1)
        progress(f"round trip at prefetch 2: {trips} acks")
        # Counted per 1,000 round trips (its "messages" are the acks).
        with meter.measure(trips) as counted:
            out.round_trip = asyncio.run(round_trips(ws_url, secret, rt, trips))
        out.round_trip_cost = counted
        progress(f"  p50 {statistics.median(out.round_trip):.2f} ms")
        seconds = max(2, round(E2E_SECONDS * args.scale))
        progress(f"end to end: {E2E_RATE} msgs/s for {seconds} s")
        out.e2e = asyncio.run(end_to_end(ws_url, secret, e2e, E2E_RATE, seconds)).arrived
        progress(f"  p50 {statistics.median(out.e2e):.2f} ms")
    finally:
        stop_daphne(proc)
    return out


def ferry_on_sqlite(args: argparse.Namespace, tmp: Path) -> Single:
    """Ferry's part (3.) on the embedded SQLite, in a child run of this script with
    DATABASE_URL unset and its own data directory, right after the part on PostgreSQL: the
    target "consume+ack B=100 on PostgreSQL >= the same on SQLite" compared within one run
    (this machine's speed swings by a third within an hour)."""
    figures = tmp / "sqlite-figures.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    command = [sys.executable, __file__, "--only", "ferry", "--scale", str(args.scale)]
    progress("ferry on SQLite: the same part in a child run, DATABASE_URL unset")
    # Its progress goes to this stderr; its report (stdout) is this one's rows.
    subprocess.run(
        [*command, "--figures", str(figures)], env=env, stdout=subprocess.DEVNULL, check=True
    )
    return single_from_json(figures.read_bytes())


COUNTED_FIELDS = ("messages", "seconds", "broker_cpu", "bench_cpu", "host_cpu")


def single_to_json(single: Single) -> bytes:
    """What report() prints of an SQLite run's Single (no PostgreSQL counters)."""

    def counted(c: Counted) -> dict[str, float]:
        return {name: getattr(c, name) for name in COUNTED_FIELDS}

    return orjson.dumps(
        {
            "produce": {str(b): counted(c) for b, c in single.produce.items()},
            "consume": {str(b): counted(c) for b, c in single.consume.items()},
            "round_trip": single.round_trip,
            "e2e": single.e2e,
        }
    )


def single_from_json(data: bytes) -> Single:
    found = orjson.loads(data)
    return Single(
        produce={int(b): Counted(**c) for b, c in found["produce"].items()},
        consume={int(b): Counted(**c) for b, c in found["consume"].items()},
        round_trip=found["round_trip"],
        e2e=found["e2e"],
    )


# --- Scale-out ----------------------------------------------------------------------------


@dataclass
class Scale:
    processes: int
    produce: Counted
    consume: Counted
    idle_cpu: float  # CPU seconds per second of the Daphne processes, summed, doing nothing
    # The same producers again, each request to one partition's URL (--by-partition).
    by_partition: Counted | None = None
    # Again, through ferry_client: hints off, then a batch a partition with its hint (--by-key).
    client: Counted | None = None
    by_key: Counted | None = None


# The scale-out's phases in the report: (label, Scale attribute).
SCALE_PHASES = (
    ("produce", "produce"),
    ("produce/p", "by_partition"),
    ("produce/c", "client"),
    ("produce/k", "by_key"),
    ("consume", "consume"),
)


def scale_phases(scale: list["Scale"]) -> list[tuple[str, str]]:
    """The phases the runs measured (produce/p with --by-partition, /c and /k with --by-key)."""
    return [(label, name) for label, name in SCALE_PHASES if getattr(scale[0], name) is not None]


def scale_out(
    args: argparse.Namespace, tmp: Path, secret: str, url: str, postmaster: int, redis_url: str
) -> list[Scale]:
    from django.db import connections

    from broker.core import keys, topics
    from ferry_client.transport import ws_url

    results = []
    requests = scaled(SCALE_REQUESTS, args.scale, 2)
    total = requests * args.producers * SCALE_BATCH
    env = dict(os.environ, REDIS_URL=redis_url)
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    lb_env, tls = tls_setup(tmp) if args.tls else (os.environ, None)
    verify: ssl.SSLContext | bool = tls or True
    for phase, n in enumerate(args.processes):
        stamp = f"{os.getpid()}-{phase}-{n}"  # a count may come back (--processes 1,4,1)
        topic, warm = f"bench-pg-scale-{stamp}", f"bench-pg-scale-warm-{stamp}"
        # Each produce's topic: the keys spread, then each request to one partition's URL
        # (--by-partition), then through ferry_client, without and with hints (--by-key).
        routes = {SPREAD: topic}
        if args.by_partition:
            routes[BY_PARTITION] = f"bench-pg-scale-p-{stamp}"
        if args.by_key:
            routes[CLIENT] = f"bench-pg-scale-c-{stamp}"
            routes[BY_KEY] = f"bench-pg-scale-k-{stamp}"
        for name in (*routes.values(), warm):
            topics.create_topic(keys.CONSOLE, name, SCALE_PARTITIONS)
        connections.close_all()
        procs: list[subprocess.Popen[bytes]] = []
        quotas: list[Quota] = []
        balancer_dir = tmp / f"haproxy-{phase}"
        try:
            ports = [free_port() for _ in range(n)]
            for i, port in enumerate(ports):
                log_path = tmp / f"daphne-{n}-{i}.log"
                procs.append(start_daphne(port, log_path, env=env))
            for proc, port, i in zip(procs, ports, range(n), strict=True):
                wait_healthy(f"http://127.0.0.1:{port}", proc, tmp / f"daphne-{n}-{i}.log")
                quotas.append(Quota(i))
                quotas[-1].add(proc.pid)
            progress(f"{n} daphne(s) up, each held to {CORE_SHARE} of a core")
            urls = [f"http://127.0.0.1:{port}" for port in ports]
            ws_urls = [f"ws://127.0.0.1:{ports[i % n]}/ws/v1/" for i in range(CONSUMERS)]
            balancer = None
            if args.balancer:
                urls = [start_balancer(balancer_dir, ports, lb_env)]
                balancer = balancer_pid(balancer_dir)
                ws_urls = [ws_url(urls[0])] * CONSUMERS
                progress(f"haproxy at {urls[0]} in front of them")
            meter = Meter(url, [p.pid for p in procs], postmaster, balancer)
            idle_started, idle_cpu = time.perf_counter(), meter.cpu()[0]
            time.sleep(IDLE_S)
            idle = (meter.cpu()[0] - idle_cpu) / (time.perf_counter() - idle_started)
            meter.quotas, meter.statements = quotas, args.statements
            progress(
                f"scale-out x{n}: {args.producers} producers, {requests} requests each "
                f"after {args.warm} to warm up"
            )
            # The producers' requests to each topic, its offsets checked.
            produced: dict[str, Counted] = {}
            for route, to in routes.items():
                if route != SPREAD:
                    progress(f"scale-out x{n}: the same, {ROUTE_LABELS[route]}")
                offsets, produced[route] = produce_spread(
                    urls,
                    headers,
                    (to, warm),
                    requests,
                    meter,
                    args.producers,
                    args.warm,
                    verify,
                    route,
                )
                with httpx.Client(
                    base_url=urls[0], headers=headers, timeout=60, verify=verify
                ) as client:
                    check_contiguous(client, to, offsets)
                progress(f"  {produced[route].rate:,.0f} msgs/s; offsets contiguous")
            analyze(url)
            progress(f"scale-out x{n}: {CONSUMERS} consumers, prefetch {SCALE_PREFETCH}")
            with meter.measure(total) as consumed:
                asyncio.run(
                    consume(
                        ws_urls,
                        secret,
                        topic,
                        f"bench-pg-scale-{stamp}",
                        total,
                        SCALE_PREFETCH,
                        SCALE_ACK,
                        tls,
                    )
                )
            progress(f"  {consumed.rate:,.0f} msgs/s; each message once")
            results.append(
                Scale(
                    n,
                    produced[SPREAD],
                    consumed,
                    idle,
                    produced.get(BY_PARTITION),
                    produced.get(CLIENT),
                    produced.get(BY_KEY),
                )
            )
        finally:
            subprocess.run([str(ROOT / "scripts/haproxy"), "stop", str(balancer_dir)], check=False)
            for proc in procs:
                stop_daphne(proc)
            for quota in quotas:
                quota.remove()
    return results


def tls_setup(tmp: Path) -> tuple[dict[str, str], ssl.SSLContext]:
    """scripts/haproxy cert: HAProxy's environment with FERRY_LB_CERT, and the clients' context
    that trusts the self-signed certificate (as ferry_client's verify= would)."""
    made = subprocess.run(
        [str(ROOT / "scripts/haproxy"), "cert", str(tmp / "tls"), "bench.test"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    env = dict(os.environ, FERRY_LB_CERT=made.stdout.strip().splitlines()[-1])
    return env, ssl.create_default_context(cafile=str(tmp / "tls" / "bench.test.crt"))


def start_balancer(directory: Path, ports: list[int], env: Mapping[str, str]) -> str:
    """scripts/haproxy in front of the Daphnes on ports, on a free port; its URL."""
    started = subprocess.run(
        [str(ROOT / "scripts/haproxy"), "start", str(directory), f"127.0.0.1:{free_port()}"]
        + [f"127.0.0.1:{port}" for port in ports],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return started.stdout.strip().splitlines()[-1]


def balancer_pid(directory: Path) -> int:
    return int((directory / "haproxy.pid").read_text().split()[0])


# --- Report -------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(
    producers: int,
    header: list[tuple[str, str]],
    ref: dict[str, dict[int, float]] | None,
    single: Single | None,
    scale: list[Scale] | None,
    skipped: str | None,
    bare: dict[str, Counted] | None = None,
    warm: int = SCALE_WARM_REQUESTS,
    balancer: bool = False,
    tls: bool = False,
    sqlite: Single | None = None,
) -> str:
    lines = ["", "Ferry bench: PostgreSQL speed and scale-out (bench/postgres.py)"]
    width = max(len(k) for k, _ in header)
    lines += [f"  {k.ljust(width)} : {v}" for k, v in header]
    lines.append("")
    cols = "".join(f"{'B=' + str(b):>10}" for b in BATCHES)
    cpu = "broker / PG CPU" if single and single.on_postgres else "broker CPU"
    lines.append(f"  {'msgs/s':<52}{cols}   {cpu} s per 1k msgs at B=1, 100, 1000")
    lines.append("  " + "-" * 120)
    if ref:
        for kind, text in (
            ("produce", "reference produce: executemany + COMMIT"),
            ("consume", "reference consume: SELECT FOR UPDATE + DELETE + COMMIT"),
        ):
            cells = "".join(f"{ref[kind][b]:>10,.0f}" for b in BATCHES)
            lines.append(f"  {text:<52}{cells}")
    for shape, floor in (bare or {}).items():
        cells = f"{'':>10}{floor.rate:>10,.0f}{'':>10}"
        cpu = (
            f"{'':>7}{floor.per_1k(floor.broker_cpu):.3f} / {floor.per_1k(floor.postgres_cpu):.3f}"
        )
        lines.append(f"  {BARE_SHAPES[shape][1]:<52}{cells}   {cpu}")
    if single:
        for name, phases in (
            ("Ferry produce, REST, 1 client", single.produce),
            ("Ferry consume+ack, WS, prefetch 2B, ack per B", single.consume),
        ):
            cells = "".join(f"{phases[b].rate:>10,.0f}" for b in BATCHES)
            cpu = ", ".join(
                f"{phases[b].per_1k(phases[b].broker_cpu):.3f}"
                + (
                    f" / {phases[b].per_1k(phases[b].postgres_cpu):.3f}"
                    if single.on_postgres
                    else ""
                )
                for b in BATCHES
            )
            lines.append(f"  {name:<52}{cells}   {cpu}")
        if sqlite:
            for name, phases in (
                ("Ferry on SQLite: produce, REST, 1 client", sqlite.produce),
                ("Ferry on SQLite: consume+ack, the same", sqlite.consume),
            ):
                cells = "".join(f"{phases[b].rate:>10,.0f}" for b in BATCHES)
                cpu = ", ".join(f"{phases[b].per_1k(phases[b].broker_cpu):.3f}" for b in BATCHES)
                lines.append(f"  {name:<52}{cells}   {cpu}")
        lines.append("")
        rt, e2e = single.round_trip, single.e2e
        rt50 = statistics.median(rt)
        rt_ok = verdict(rt50 <= TARGET_ROUND_TRIP_MS)
        lines.append(
            f"  round trip at prefetch 2 (ack both in hand -> next messages), {len(rt)} acks: "
            f"p50 {rt50:.2f} ms, p99 {percentile(rt, 0.99):.2f} ms"
            f"   target p50 <= {TARGET_ROUND_TRIP_MS:.0f} ms: {rt_ok}"
        )
        lines.append(
            f"  end to end at {E2E_RATE} msgs/s, {len(e2e)} messages: "
            f"p50 {statistics.median(e2e):.2f} ms, p99 {percentile(e2e, 0.99):.2f} ms"
        )
        if ref:
            ratio = single.consume[100].rate / ref["produce"][100]
            lines.append(
                f"  consume+ack B=100 / reference produce B=100: {ratio:.2f}x"
                f"   target >= {TARGET_CONSUME_VS_REFERENCE}x: "
                f"{verdict(ratio >= TARGET_CONSUME_VS_REFERENCE)}"
            )
            ours = single.consume[100]
            for shape, floor in (bare or {}).items():
                cpu_x = ours.per_1k(ours.broker_cpu) / floor.per_1k(floor.broker_cpu)
                lines.append(
                    f"  bare, {shape}: its consume+ack B=100 / reference produce B=100 "
                    f"{floor.rate / ref['produce'][100]:.2f}x; Ferry's / its "
                    f"{ours.rate / floor.rate:.2f}x, at {cpu_x:.2f}x its broker CPU a message"
                )
        if sqlite:
            rt, e2e = sqlite.round_trip, sqlite.e2e
            lines.append(
                f"  on SQLite: round trip at prefetch 2 p50 {statistics.median(rt):.2f} ms, "
                f"p99 {percentile(rt, 0.99):.2f} ms; end to end p50 "
                f"{statistics.median(e2e):.2f} ms, p99 {percentile(e2e, 0.99):.2f} ms"
            )
        for where, run in (
            ("on PostgreSQL" if single.on_postgres else "", single),
            ("on SQLite", sqlite),
        ):
            if run is not None:
                lines.append(
                    cycle_cpu(where, run.consume[100], single.on_postgres and run is single)
                )
        if sqlite and single.on_postgres:
            ours, theirs = single.consume[100], sqlite.consume[100]
            ratio = ours.rate / theirs.rate
            cpu_x = ours.per_1k(ours.broker_cpu) / theirs.per_1k(theirs.broker_cpu)
            lines.append(
                f"  consume+ack B=100 on PostgreSQL / on SQLite: {ratio:.2f}x   target >= "
                f"{TARGET_CONSUME_VS_SQLITE:.0f}x: {verdict(ratio >= TARGET_CONSUME_VS_SQLITE)}"
                f"; broker CPU a message {cpu_x:.2f}x"
            )
            for shape, floor in (bare or {}).items():
                lines.append(
                    f"  bare, {shape}: its consume+ack B=100 / Ferry's on SQLite "
                    f"{floor.rate / theirs.rate:.2f}x"
                )
        elif single.on_postgres and ref:
            lines.append(
                "  (the other target, consume+ack B=100 >= the same on SQLite: add the part "
                "sqlite to --only)"
            )
    if skipped:
        lines += ["", f"  scale-out skipped: {skipped}"]
    if scale:
        lines += [
            "",
            f"  scale-out: each Daphne held to {CORE_SHARE} of a core (cgroup v1 quota), "
            f"Redis channel layer; {producers} producers x B={SCALE_BATCH} on "
            f"{SCALE_PARTITIONS} partitions (after {warm} warm-up "
            f"request{'' if warm == 1 else 's'} each), then "
            f"{CONSUMERS} consumers in one clustering "
            f"group (prefetch {SCALE_PREFETCH}, ack per {SCALE_ACK}); "
            + (
                "clients through HAProxy on one port (scripts/haproxy, no quota"
                + (
                    ", TLS at HAProxy: a self-signed certificate the clients verify)"
                    if tls
                    else ")"
                )
                if balancer
                else "clients round robin over the processes' ports (no load balancer)"
            )
            + "; group commit wait "
            f"{os.environ.get('FERRY_GROUP_COMMIT_WAIT_MS', '-1 (5 ms on PostgreSQL)')} "
            "(FERRY_GROUP_COMMIT_WAIT_MS)",
            f"  {'phase':<10}{'procs':>6}{'msgs/s':>9}{'x 1 proc':>9}{'target':>12}"
            f"{'broker CPU':>11}{'x':>6}{'PG CPU':>8}{'x':>6}{'quota':>7}{'thrtl s':>8}"
            f"{'bench':>7}{'xids':>7}{'WAL kB':>8}{'run':>6}{'lockw':>6}{'idleTx':>7}"
            f"{'host':>6}",
            f"  {'':<46}{'s/1k msgs':>11}{'':>6}{'s/1k':>8}{'':>6}{'used':>7}{'':>8}"
            f"{'s/1k':>7}{'/1k':>7}{'/1k':>8}{'(mean backends)':>19}{'busy':>6}",
            "  " + "-" * 126,
        ]
        for kind, name in scale_phases(scale):
            base: Counted = getattr(scale[0], name)
            for s in scale:
                c: Counted = getattr(s, name)
                growth, broker, pg = c.against(base)
                target = ""
                if s.processes in TARGET_SCALE:
                    goal = TARGET_SCALE[s.processes]
                    target = f">={goal}x {'ok' if growth >= goal else 'MISS'}"
                used = c.broker_cpu / (c.seconds * CORE_SHARE * s.processes)
                lines.append(
                    f"  {kind:<10}{s.processes:>6}{c.rate:>9,.0f}{growth:>8.2f}x{target:>12}"
                    f"{c.per_1k(c.broker_cpu):>11.4f}{broker:>5.2f}x"
                    f"{c.per_1k(c.postgres_cpu):>8.4f}{pg:>5.2f}x{used:>7.0%}"
                    f"{c.throttled:>8.1f}{c.per_1k(c.bench_cpu):>7.3f}"
                    f"{c.per_1k(c.xids):>7.1f}{c.per_1k(c.wal_bytes) / 1024:>8.0f}"
                    f"{c.activity.get('running', 0):>6.2f}{c.activity.get('lock wait', 0):>6.2f}"
                    f"{c.activity.get('idle in txn', 0):>7.2f}"
                    f"{c.host_cpu / c.seconds / CORES:>6.0%}"
                )
        if scale[0].by_partition is not None:
            lines.append(
                "  produce: each request's keys spread it over the partitions; produce/p: the "
                "same producers, producer i sending each request to partition i mod "
                f"{SCALE_PARTITIONS}'s URL (POST …/partitions/{{p}}/messages), which "
                "scripts/haproxy sends to one process a partition"
            )
        if scale[0].by_key is not None:
            lines.append(
                "  produce/c, produce/k: the same keyed messages through ferry_client's Producer "
                f"(an id each), {SCALE_PARTITIONS * SCALE_BATCH} queued with send_async then "
                f"flushed as {SCALE_PARTITIONS} requests: /c with hints off, each request mixing "
                "the partitions; /k a request a partition with the Ferry-Partition-Hint header "
                "that scripts/haproxy routes by"
            )
        lines.append(
            f"  host busy: the machine's CPU in use, all processes, of its {CORES} cores "
            "(/proc/stat): near 100 % the processes share what is left, and a process's CPU "
            "a message rises with the waits for a core"
        )
        if balancer:
            spent = ", ".join(
                f"{kind} x{s.processes} {c.per_1k(c.balancer_cpu):.4f}"
                for kind, name in scale_phases(scale)
                for s in scale
                for c in [getattr(s, name)]
            )
            lines.append(f"  HAProxy CPU s/1k msgs (not in broker CPU): {spent}")
        idle = ", ".join(f"x{s.processes} {s.idle_cpu * 1000:.0f} ms/s" for s in scale)
        lines.append(f"  broker CPU while idle ({IDLE_S:.0f} s before produce, summed): {idle}")
        lines.append(
            f"  target: broker and PG CPU per message within {TARGET_CPU_GROWTH:.0%} of one "
            "process's (the 'x' columns <= "
            f"{1 + TARGET_CPU_GROWTH:.2f})"
        )
        lines += paired_lines(scale)
        for s in scale:
            for kind, name in scale_phases(scale):
                c = getattr(s, name)
                other = ", ".join(
                    f"{name} {mean:.2f}"
                    for name, mean in sorted(c.activity.items())
                    if name not in ("running", "lock wait", "idle in txn")
                )
                if other:
                    lines.append(f"  other waits, {kind} x{s.processes} (mean backends): {other}")
                if c.waits:
                    waits = "; ".join(f"{n} x {w}" for w, n in c.waits)
                    lines.append(f"  lock waits, {kind} x{s.processes}: {waits}")
        lines.append("  guarantees: ok (contiguous offsets per partition; every message once)")
        for s in scale:
            for kind, name in scale_phases(scale):
                c = getattr(s, name)
                if c.statements:
                    lines += statement_lines(f"{kind} x{s.processes}", c)
    if single:
        for batch in BATCHES:
            for kind, phases in (("produce", single.produce), ("consume", single.consume)):
                if phases[batch].statements:
                    lines += statement_lines(f"Ferry {kind} B={batch}", phases[batch])
        cost = single.round_trip_cost
        if cost and cost.statements:
            lines += statement_lines("round trip at prefetch 2", cost, "round trips")
    lines.append("")
    return "\n".join(lines)


SHAPE_ROUNDS, SHAPE_SECONDS = 3, 6.0


def alone_shapes(scale: list[Scale]) -> list[pg_shape.Shape]:
    """Each process count's first produce phase (keys spread): its processes as writers, its
    messages a transaction and its rate."""
    shapes: dict[int, pg_shape.Shape] = {}
    for s in scale:
        c = s.produce
        if s.processes not in shapes and c.xids:
            size = max(1, round(c.messages / c.xids))
            shapes[s.processes] = pg_shape.Shape(f"x{s.processes}", s.processes, size, c.rate)
    return list(shapes.values())


def alone_lines(scale: list[Scale], alone: dict[str, list[pg_shape.Result]]) -> list[str]:
    """PostgreSQL's CPU a message alone against Ferry's, each ÷ its one-process phase's."""
    ferry = {s.processes: s.produce for s in reversed(scale)}  # each count's first phase
    base_n = scale[0].processes
    base = pg_shape.medians(alone[f"x{base_n}"]).postgres_per_1k
    lines = [
        "",
        f"  PostgreSQL alone in the produce's shape (bench/pg_shape.py; medians of "
        f"{SHAPE_ROUNDS} rounds of {SHAPE_SECONDS:.0f} s): the same writers, messages a commit "
        "and rate, no Ferry",
        "  processes  msgs a commit   msgs/s  PG CPU s/1k alone (÷ x1)  Ferry's PG CPU ÷ x1",
    ]
    for label, results in alone.items():
        n = int(label[1:])
        m = pg_shape.medians(results)
        shape_size = round(1000 / m.transactions_per_1k) if m.transactions_per_1k else 0
        ferry_ratio = ferry[n].against(ferry[base_n])[2]
        lines.append(
            f"  x{n:<9}{shape_size:>14}{m.rate:>9,.0f}{m.postgres_per_1k:>13.4f} "
            f"({m.postgres_per_1k / base:.2f}x){ferry_ratio:>22.2f}x"
        )
    return lines


def paired_lines(scale: list[Scale]) -> list[str]:
    """With the process counts repeated (--processes 1,4,1,4,1,4), each phase's ratios against
    the one-process phase just before it, and their medians: the machine's load swings a
    phase's CPU a message by a fifth or more, so one pair cannot judge a 15 % target."""
    base_count = scale[0].processes
    pairs: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for kind, name in scale_phases(scale):
        base: Counted | None = None
        for s in scale:
            c: Counted = getattr(s, name)
            if s.processes == base_count:
                base = c
            elif base is not None:
                pairs.setdefault((kind, s.processes), []).append(c.against(base))
    lines = []
    for (kind, processes), found in pairs.items():
        if len(found) < 2:
            continue
        columns = []
        for label, index in (("msgs/s", 0), ("broker CPU", 1), ("PG CPU", 2)):
            ratios = [f[index] for f in found]
            listed = ", ".join(f"{r:.2f}" for r in ratios)
            columns.append(f"{label} {listed} (median {statistics.median(ratios):.2f}x)")
        lines.append(
            f"  {kind} x{processes} ÷ the x{base_count} phase before it, {len(found)} pairs: "
            + "; ".join(columns)
        )
    return lines


def cycle_cpu(where: str, c: Counted, postgres: bool) -> str:
    """Who spent the CPU of the consume+ack at B=100 (per 1,000 messages), and how busy the
    machine was: whether the broker, the database or the bench's own client is the limit."""
    pg = f", PostgreSQL {c.per_1k(c.postgres_cpu):.4f}" if postgres else ""
    busy = c.host_cpu / c.seconds / CORES
    return (
        f"  consume+ack B=100{' ' + where if where else ''}, CPU s per 1k msgs: broker "
        f"{c.per_1k(c.broker_cpu):.4f}{pg}, the bench's client {c.per_1k(c.bench_cpu):.4f}; "
        f"the machine {busy:.0%} busy ({CORES} cores)"
    )


def statement_lines(title: str, c: Counted, unit: str = "msgs") -> list[str]:
    """A phase's costliest statements and its transaction control, per 1,000 messages."""
    control = ", ".join(
        f"{name} {c.per_1k(calls):.1f}" for name, calls in sorted(c.control.items())
    )
    lines = [
        "",
        f"  statements, {title} (per 1k {unit}: calls, ms, rows); per 1k {unit}: {control}",
    ]
    for calls, ms, rows, query in c.statements:
        lines.append(
            f"  {c.per_1k(calls):>8.1f}{c.per_1k(ms):>9.1f}{c.per_1k(rows):>9.0f}  {query[:90]}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count")
    parser.add_argument(
        "--only",
        default="reference,bare,ferry,sqlite,scale",
        help="comma-separated parts: reference, bare, ferry, sqlite (Ferry's part again on "
        "the embedded SQLite, in a child run), scale; all but ferry need PostgreSQL",
    )
    parser.add_argument(
        "--figures",
        type=Path,
        help="also write the ferry part's figures to this JSON file (the sqlite part's child run)",
    )
    parser.add_argument(
        "--processes",
        type=lambda text: [int(n) for n in text.split(",")],
        default=list(PROCESSES),
        help="Daphne process counts of the scale-out, the first the base (default 1,2,4)",
    )
    parser.add_argument(
        "--producers", type=int, default=PRODUCERS, help="scale-out producers (default 16)"
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=SCALE_WARM_REQUESTS,
        help=f"scale-out warm-up requests per producer (default {SCALE_WARM_REQUESTS})",
    )
    parser.add_argument(
        "--by-partition",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="scale-out: produce a second time, producer i sending each request to partition "
        "i %% 4's URL, which HAProxy sends to one process a partition (default); "
        "--no-by-partition: only the keys spread over the partitions",
    )
    parser.add_argument(
        "--by-key",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="scale-out: produce twice more through ferry_client's Producer, keyed "
        "send_async: hints off (produce/c), then a batch a partition with the "
        "Ferry-Partition-Hint header that HAProxy routes by (produce/k) (ferry_client's "
        "route_by_partition=True); off by default",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="load pg_stat_statements (restarts the throwaway server) and print each "
        "scale-out phase's top statements",
    )
    parser.add_argument(
        "--balancer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="scale-out clients through HAProxy on one port (scripts/haproxy), as the README's "
        "production set-up (default); --no-balancer: round robin over the processes' ports",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="HAProxy ends TLS (FERRY_LB_CERT, a self-signed certificate from scripts/haproxy "
        "cert) and the scale-out's clients verify it",
    )
    parser.add_argument(
        "--shape",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the scale-out, PostgreSQL alone appending in each process count's shape: "
        "writers, messages a commit and rate of its produce (bench/pg_shape.py; default)",
    )
    args = parser.parse_args()
    if args.tls and not args.balancer:
        parser.error("--tls is HAProxy's: it needs the balancer (drop --no-balancer)")
    parts = set(args.only.split(","))
    if "sqlite" in parts and "ferry" not in parts:
        parser.error("the part sqlite is compared with the part ferry: name both")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    url = os.environ.get("DATABASE_URL") or None
    os.environ.pop("REDIS_URL", None)
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-pg-"))
    ok = False
    redis_dir: Path | None = None
    try:
        if url and args.statements:
            load_pg_stat_statements(url)
        postmaster = postmaster_pid(url) if url else None
        progress(f"data dir {tmp}; migrating")
        setup_django(tmp)
        from django.db import connection, connections

        from broker.core import keys

        vendor, database = connection.vendor, database_description()
        _, secret = keys.create_api_key(
            keys.CONSOLE, f"bench-pg-{os.getpid()}", [keys.parse_permission("admin:*")]
        )
        connections.close_all()
        ref = single = None
        alone: dict[str, list[pg_shape.Result]] | None = None
        bare: dict[str, Counted] | None = None
        scale: list[Scale] | None = None
        skipped = None
        if url and "reference" in parts:
            ref = reference(url, args.scale)
        if url and "bare" in parts:
            bare = {s: bare_consume(url, tmp, args.scale, postmaster, s) for s in BARE_SHAPES}
        sqlite: Single | None = None
        if "ferry" in parts:
            single = ferry_single(args, tmp, secret, url, postmaster)
            if args.figures:
                args.figures.write_bytes(single_to_json(single))
        if url and "sqlite" in parts:
            sqlite = ferry_on_sqlite(args, tmp)
        if "scale" in parts:
            skipped = cgroup_unavailable() if url else "needs PostgreSQL (DATABASE_URL)"
            if skipped is None and url and postmaster:
                redis_dir, redis_url = start_redis(tmp)
                progress(f"redis at {redis_url}")
                scale = scale_out(args, tmp, secret, url, postmaster, redis_url)
                if args.shape:
                    progress("PostgreSQL alone in the scale-out's shapes (bench/pg_shape.py)")
                    shapes = alone_shapes(scale)
                    alone = pg_shape.measure(
                        url, lambda: postgres_cpu(postmaster), shapes, SHAPE_ROUNDS, SHAPE_SECONDS
                    )
            else:
                progress(f"scale-out skipped: {skipped}")
        load = os.getloadavg()
        header = [
            ("command", command_line()),
            ("database", f"{vendor}: {database}"),
            (
                "machine",
                f"nproc={os.cpu_count()}, {platform.system()} {platform.machine()}, Python "
                f"{platform.python_version()}, load average after the run "
                f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            ),
            ("message", f"key k<n>, value {len(VALUE_BYTES)} bytes (a JSON string)"),
            (
                "ferry",
                "1 Daphne on 127.0.0.1, in-memory channel layer, background jobs off; clients "
                "in this process",
            ),
        ]
        print(
            report(
                args.producers,
                header,
                ref,
                single,
                scale,
                skipped,
                bare,
                args.warm,
                args.balancer,
                args.tls,
                sqlite,
            ),
            flush=True,
        )
        if scale and alone:
            print("\n".join(alone_lines(scale, alone)), flush=True)
        ok = True
        return 0
    finally:
        if redis_dir is not None:
            progress("stopping redis")
            subprocess.run([str(ROOT / "scripts/redis"), "stop", str(redis_dir)], check=False)
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            progress(f"failed; kept {tmp} (daphne logs) for inspection")


if __name__ == "__main__":
    sys.exit(main())
