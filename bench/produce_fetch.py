"""REST produce and fetch throughput on a real Daphne server, beside the raw storage rate.

Run by `make bench` (scripts/bench), once on SQLite and once on PostgreSQL; not part of the test
suite (STYLE.md §6). One process does everything, on one machine and in one run:

1. starts Daphne on 127.0.0.1 (a free port) against the database the environment names: the
   embedded SQLite under a temporary FERRY_DATA_DIR, or DATABASE_URL as is;
2. produces 256-byte messages over REST in batches of 1, 100 and 1000 from a single sequential
   keep-alive httpx client, then fetches them all back with limit=1000;
3. inserts the same rows the broker stores, with a plain executemany through Django's cursor into
   the same broker_message table (a scratch topic's partition), one transaction per batch;
4. prints the figures, broker/raw ratios and the targets, then stops Daphne by its PID (always).

    .venv/bin/python bench/produce_fetch.py [--scale 0.2]
"""

import argparse
import functools
import logging
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from pg_server import TICKS, proc_stat

ROOT = Path(__file__).resolve().parent.parent

# A JSON string whose serialized form (what the broker stores as the value) is 256 bytes.
VALUE = "x" * 254
VALUE_BYTES = orjson.dumps(VALUE)
assert len(VALUE_BYTES) == 256

# (batch size, requests); the batch-1000 phase also fixes how many rows the raw phase writes.
PRODUCE_PHASES = ((1, 2000), (100, 200), (1000, 50))
FETCH_LIMIT = 1000
# Producers in flight at once for the concurrent produce row.
CLIENTS = 4
# Interleaved batch-1000 comparison: rounds of ROUND_BATCHES produce calls then raw batches.
ROUNDS = 15
# Consumers reading at once for the concurrent fetch row.
FETCH_CLIENTS = 2
ROUND_BATCHES = 10
TARGET_PRODUCE_VS_RAW = 0.40
TARGET_FETCH_MSGS_S = 100_000
HEALTH_TIMEOUT_S = 30.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (its threads included), from /proc/<pid>/stat."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Phase:
    name: str
    requests: int
    messages: int
    seconds: float
    latencies: list[float]
    # Time the client spent decoding and checking responses (included in seconds).
    client_seconds: float = 0.0

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000


def timed(name: str, count: int, step: Callable[[int], int]) -> Phase:
    """Run step(i) count times; step returns how many messages it moved."""
    latencies = []
    messages = 0
    started = time.perf_counter()
    for i in range(count):
        t0 = time.perf_counter()
        messages += step(i)
        latencies.append(time.perf_counter() - t0)
    return Phase(name, count, messages, time.perf_counter() - started, latencies)


# --- Django side: set-up in the bench process and the raw insert ---------------------------


def setup_django(data_dir: Path) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "mqsite.settings"
    os.environ["FERRY_DATA_DIR"] = str(data_dir)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    # Django's LOGGING sends INFO to the console; httpx would log every request there.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def filesystem_of(path: Path) -> str:
    """The type of the file system holding path (fsync costs differ: ext4 vs tmpfs)."""
    best, fstype = "", "?"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return fstype
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = fields[1]
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > len(best):
            best, fstype = mount_point, fields[2]
    return fstype


def database_description() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sqlite_version()")
            version = cursor.fetchone()[0]
            cursor.execute("PRAGMA journal_mode")
            journal = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous")
            sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(cursor.fetchone()[0], "?")
            fs = filesystem_of(Path(connection.settings_dict["NAME"]))
            return f"sqlite {version} (file on {fs}, journal_mode={journal}, synchronous={sync})"
        if connection.vendor == "postgresql":
            settings = {}
            for name in ("server_version", "fsync", "synchronous_commit"):
                cursor.execute(f"SHOW {name}")
                settings[name] = cursor.fetchone()[0]
            return (
                f"postgresql {settings['server_version']} (fsync={settings['fsync']}, "
                f"synchronous_commit={settings['synchronous_commit']})"
            )
    return connection.vendor


def create_fixtures(stamp: str) -> tuple[str, str, str, int]:
    """An admin key, the produce topic and the raw scratch topic; returns them and its partition."""
    from broker import models
    from broker.core import keys, topics

    _, secret = keys.create_api_key(
        keys.CONSOLE, f"bench-{stamp}", [keys.parse_permission("admin:*")]
    )
    topic = f"bench-produce-{stamp}"
    scratch = f"bench-raw-{stamp}"
    topics.create_topic(keys.CONSOLE, topic, 1)
    topics.create_topic(keys.CONSOLE, scratch, 1)
    partition_id = models.Partition.objects.get(topic__name=scratch, number=0).id
    return secret, topic, scratch, partition_id


def raw_insert(name: str, partition_id: int, first_offset: int, batch: int, batches: int) -> Phase:
    """The broker's rows and INSERT, one executemany per batch; each batch its own transaction."""
    from django.db import connection, transaction

    from broker.core.log import INSERT_MESSAGES, now_ms

    headers = orjson.dumps({}).decode()

    def step(i: int) -> int:
        start = first_offset + i * batch
        ts = now_ms()
        rows = [
            (partition_id, start + n, ts, None, None, headers, VALUE_BYTES, True, 256, None)
            for n in range(batch)
        ]
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.executemany(INSERT_MESSAGES, rows)
        return batch

    return timed(name, batches, step)


def raw_insert_one_transaction(
    name: str, partition_id: int, first_offset: int, batch: int, batches: int
) -> Phase:
    """Reference only: the same batches, all in a single transaction (one commit in total)."""
    from django.db import connection, transaction

    from broker.core.log import INSERT_MESSAGES, now_ms

    headers = orjson.dumps({}).decode()
    started = time.perf_counter()
    latencies = []
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        for i in range(batches):
            t0 = time.perf_counter()
            start = first_offset + i * batch
            ts = now_ms()
            rows = [
                (partition_id, start + n, ts, None, None, headers, VALUE_BYTES, True, 256, None)
                for n in range(batch)
            ]
            cursor.executemany(INSERT_MESSAGES, rows)
            latencies.append(time.perf_counter() - t0)
    return Phase(name, batches, batch * batches, time.perf_counter() - started, latencies)


def cleanup_fixtures(stamp: str, topic_names: list[str]) -> None:
    from broker.core import keys, topics

    for name in topic_names:
        topics.delete_topic(keys.CONSOLE, name)
    keys.revoke_api_key(keys.CONSOLE, f"bench-{stamp}")


# --- Server side: Daphne and the REST client ------------------------------------------------


def start_daphne(
    port: int,
    log_path: Path,
    background: bool = False,
    env: dict[str, str] | None = None,
    server: str = "daphne",
    root: Path = ROOT,
) -> subprocess.Popen[bytes]:
    """Daphne on 127.0.0.1:port; background=True runs its in-process jobs (the scheduler).

    env replaces the bench's own environment when given (FERRY_BACKGROUND_IN_PROCESS is set
    either way). server="uvicorn" serves the same application under uvicorn instead, for
    docs/decisions/0018-daphne-stays.md (a dev dependency; not how Ferry is run). root: the
    checkout whose code it serves (bench/compare_consume.py serves another one too).
    """
    env = dict(os.environ if env is None else env)
    env["FERRY_BACKGROUND_IN_PROCESS"] = "1" if background else "0"
    command = server_command(server, port, "mqsite.asgi:application")
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            command, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )


def start_redis(tmp: Path) -> tuple[Path, str]:
    """A Redis on loopback from scripts/redis, its files under tmp; (its directory, its URL).
    Stop it with `scripts/redis stop <directory>`."""
    directory = tmp / "redis"
    started = subprocess.run(
        [str(ROOT / "scripts/redis"), "start", str(directory), str(free_port())],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return directory, started.stdout.strip().splitlines()[-1]


def server_command(server: str, port: int, app: str) -> list[str]:
    """The command serving app on 127.0.0.1:port under Daphne or uvicorn, access log on."""
    if server == "uvicorn":
        # Its pure-Python HTTP parser (h11) and the websockets library Ferry already pins.
        return [
            *(sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)),
            *("--http", "h11", "--ws", "websockets", "--loop", "asyncio", app),
        ]
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), app]


def stop_daphne(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    progress(f"stopping daphne (pid {proc.pid})")
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> dict[str, Any]:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while True:
        try:
            response = httpx.get(f"{url}/api/v1/health", timeout=1)
            if response.status_code == 200:
                return dict(response.json())
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"daphne not healthy after {HEALTH_TIMEOUT_S:.0f} s:\n{tail}")
        time.sleep(0.1)


def produce_body(batch: int) -> bytes:
    return orjson.dumps({"messages": [{"value": VALUE}] * batch})


def produce_phase(client: httpx.Client, topic: str, batch: int, requests: int) -> Phase:
    body = produce_body(batch)
    path = f"/api/v1/topics/{topic}/messages"

    def step(i: int) -> int:
        response = client.post(path, content=body)
        if response.status_code != 200:
            raise RuntimeError(f"produce failed: {response.status_code} {response.text[:500]}")
        results = orjson.loads(response.content)["results"]
        if len(results) != batch:
            raise RuntimeError(f"produce stored {len(results)} of {batch} messages")
        return batch

    # Untimed warm-up: imports, connection, first queries.
    for _ in range(max(1, 20 // batch)):
        step(0)
    return timed(f"produce batch={batch}", requests, step)


def run_together(targets: list[Callable[[], None]], barrier: threading.Barrier) -> float:
    """Start a thread per target; time from the shared barrier until the last one ends."""
    threads = [threading.Thread(target=target) for target in targets]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def concurrent_produce_phase(
    url: str, headers: dict[str, str], topic: str, batch: int, requests: int, clients: int
) -> Phase:
    """requests produce calls spread over clients threads, each with its own connection."""
    body = produce_body(batch)
    path = f"/api/v1/topics/{topic}/messages"
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def work(count: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            client.post(path, content=body).raise_for_status()  # warm-up, untimed
            barrier.wait()
            for _ in range(count):
                t0 = time.perf_counter()
                response = client.post(path, content=body)
                elapsed = time.perf_counter() - t0
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:300]}")
                    return
                with lock:
                    latencies.append(elapsed)

    barrier = threading.Barrier(clients + 1)
    shares = [requests // clients + (1 if i < requests % clients else 0) for i in range(clients)]
    seconds = run_together([functools.partial(work, n) for n in shares], barrier)
    if failures:
        raise RuntimeError(f"concurrent produce failed: {failures[0]}")
    name = f"produce batch={batch} x{clients}"
    return Phase(name, requests, batch * requests, seconds, latencies)


def interleaved_rounds(
    client: httpx.Client, topic: str, scratch_partition: int, first_offset: int, batch: int
) -> list[float]:
    """broker/raw ratios of ROUNDS rounds, each REST produce then raw insert, back to back.

    Shared machines drift: comparing the two within one round, then taking the median of the
    rounds, keeps a slow minute from landing on one side only.
    """
    ratios = []
    for r in range(ROUNDS):
        broker = produce_phase(client, topic, batch, ROUND_BATCHES)
        raw = raw_insert(
            "raw", scratch_partition, first_offset + r * batch * ROUND_BATCHES, batch, ROUND_BATCHES
        )
        ratios.append(broker.msgs_per_s / raw.msgs_per_s)
    return ratios


def fetch_phase(client: httpx.Client, topic: str, end_offset: int) -> Phase:
    path = f"/api/v1/topics/{topic}/partitions/0/messages"
    next_offset = 0
    parsing = 0.0

    def step(i: int) -> int:
        nonlocal next_offset, parsing
        response = client.get(path, params={"offset": next_offset, "limit": FETCH_LIMIT})
        if response.status_code != 200:
            raise RuntimeError(f"fetch failed: {response.status_code} {response.text[:500]}")
        t0 = time.perf_counter()
        messages = orjson.loads(response.content)["messages"]
        expected = min(FETCH_LIMIT, end_offset - next_offset)
        if len(messages) != expected or messages[0]["offset"] != next_offset:
            raise RuntimeError(f"fetch at {next_offset}: got {len(messages)}, want {expected}")
        if messages[-1]["value"] != VALUE:
            raise RuntimeError(f"fetch at {next_offset}: unexpected value")
        parsing += time.perf_counter() - t0
        next_offset += len(messages)
        return len(messages)

    # Untimed warm-up on the first page.
    client.get(path, params={"offset": 0, "limit": FETCH_LIMIT}).raise_for_status()
    pages = -(-end_offset // FETCH_LIMIT)
    phase = timed(f"fetch limit={FETCH_LIMIT}", pages, step)
    phase.client_seconds = parsing
    return phase


def concurrent_fetch_phase(
    url: str, headers: dict[str, str], topic: str, end_offset: int, clients: int
) -> Phase:
    """clients threads each walk their share of the partition, as several consumers would."""
    path = f"/api/v1/topics/{topic}/partitions/0/messages"
    latencies: list[float] = []
    counts: list[int] = []
    lock = threading.Lock()
    share = -(-end_offset // clients)

    def work(first: int) -> None:
        last = min(end_offset, first + share)
        offset, fetched = first, 0
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            barrier.wait()
            while offset < last:
                t0 = time.perf_counter()
                limit = min(FETCH_LIMIT, last - offset)
                response = client.get(path, params={"offset": offset, "limit": limit})
                messages = orjson.loads(response.content)["messages"]
                elapsed = time.perf_counter() - t0
                if not messages or messages[0]["offset"] != offset:
                    raise RuntimeError(f"concurrent fetch at {offset}: unexpected page")
                offset += len(messages)
                fetched += len(messages)
                with lock:
                    latencies.append(elapsed)
        with lock:
            counts.append(fetched)

    barrier = threading.Barrier(clients + 1)
    seconds = run_together([functools.partial(work, i * share) for i in range(clients)], barrier)
    name = f"fetch limit={FETCH_LIMIT} x{clients}"
    return Phase(name, len(latencies), sum(counts), seconds, latencies)


# --- Report ----------------------------------------------------------------------------------


def percent(ratio: float) -> str:
    return f"{ratio * 100:.0f} %"


def report(
    header: list[tuple[str, str]],
    produce: list[Phase],
    concurrent: Phase,
    ratios: list[float],
    fetches: list[Phase],
    raw: list[Phase],
    raw_one_txn: Phase,
) -> str:
    fetch = fetches[0]
    client_ms = fetch.client_seconds / fetch.requests * 1000
    lines = ["", "Ferry bench: REST produce / fetch vs raw storage (bench/produce_fetch.py)"]
    width = max(len(k) for k, _ in header)
    lines += [f"  {k.ljust(width)} : {v}" for k, v in header]
    lines.append("")
    columns = (
        f"  {'phase':<22}{'requests':>9}{'messages':>10}{'seconds':>9}{'p50 ms':>9}"
        f"{'msgs/s':>11}{'raw msgs/s':>12}{'broker/raw':>12}   target"
    )
    lines += [columns, "  " + "-" * (len(columns) + 22)]

    def row(p: Phase, raw_rate: str = "", ratio: str = "", target: str = "") -> str:
        return (
            f"  {p.name:<22}{p.requests:>9}{p.messages:>10}{p.seconds:>9.2f}{p.p50_ms:>9.2f}"
            f"{p.msgs_per_s:>11,.0f}{raw_rate:>12}{ratio:>12}   {target}"
        ).rstrip()

    def produce_target(ratio: float) -> str:
        verdict = "ok" if ratio >= TARGET_PRODUCE_VS_RAW else "MISSED"
        return f">= {percent(TARGET_PRODUCE_VS_RAW)} of raw: {verdict}"

    for p, r in zip(produce, raw, strict=True):
        ratio = p.msgs_per_s / r.msgs_per_s
        target = produce_target(ratio) if p is produce[-1] else ""
        lines.append(row(p, f"{r.msgs_per_s:,.0f}", percent(ratio), target))
    ratio = concurrent.msgs_per_s / raw[-1].msgs_per_s
    lines.append(
        row(concurrent, f"{raw[-1].msgs_per_s:,.0f}", percent(ratio), produce_target(ratio))
    )
    median = statistics.median(ratios)
    lines.append(
        f"  batch=1000 interleaved, {len(ratios)} rounds: median broker/raw {percent(median)}"
        f" ({', '.join(percent(r) for r in ratios)})   {produce_target(median)}"
    )
    for f in fetches:
        verdict = "ok" if f.msgs_per_s >= TARGET_FETCH_MSGS_S else "MISSED"
        lines.append(row(f, target=f">= {TARGET_FETCH_MSGS_S:,} msgs/s: {verdict}"))
    for r in raw:
        lines.append(row(r))
    lines.append(row(raw_one_txn))
    lines += [
        "",
        "  produce/fetch: REST through Daphne, single sequential client (one keep-alive",
        "  httpx.Client, no concurrency), client time included; warm-up requests not counted.",
        f"  'x{CLIENTS}': the same batches from {CLIENTS} client threads at once, each with its"
        " own connection",
        "  (producers in flight at once, as Kafka's max.in.flight allows).",
        "  interleaved: each round times 10 REST produce calls, then 10 raw batches, back to",
        "  back; the median ratio over the rounds is the figure least moved by a noisy machine.",
        "  raw: the broker's INSERT_MESSAGES rows via cursor.executemany through Django's",
        "  connection, same table and DB, one transaction per batch (as the broker commits one",
        "  per produce request); 'one txn' is a reference with every batch in one transaction.",
        f"  'fetch x{FETCH_CLIENTS}': {FETCH_CLIENTS} consumer threads, each walking its half.",
        f"  fetch: the client's JSON decoding and checks took {client_ms:.2f} ms of the "
        f"{fetch.seconds / fetch.requests * 1000:.2f} ms per page.",
        "",
    ]
    return "\n".join(lines)


def command_line() -> str:
    """How this run was started, with the interpreter relative to the repo when it lives there."""
    python = Path(sys.executable)
    if python.is_relative_to(ROOT):
        python = python.relative_to(ROOT)
    argv = [str(python), *sys.argv]
    if os.environ.get("DATABASE_URL"):
        argv.insert(0, "DATABASE_URL=...")
    return shlex.join(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every request count (default 1.0)"
    )
    args = parser.parse_args()
    # Make `kill` run the finally blocks below (Daphne is stopped by its PID there).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    phases = [(batch, max(1, round(n * args.scale))) for batch, n in PRODUCE_PHASES]
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    ok = False
    try:
        progress(f"data dir {tmp}; migrating")
        setup_django(tmp)
        from django.db import connection, connections

        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        secret, topic, scratch, scratch_partition = create_fixtures(stamp)
        vendor = connection.vendor
        database = database_description()
        connections.close_all()

        port = free_port()
        log_path = tmp / "daphne.log"
        progress(f"starting daphne on 127.0.0.1:{port} (log {log_path})")
        proc = start_daphne(port, log_path)
        try:
            url = f"http://127.0.0.1:{port}"
            health = wait_healthy(url, proc, log_path)
            if health.get("database") != vendor:
                raise RuntimeError(f"server uses {health.get('database')}, bench uses {vendor}")
            progress(f"daphne is up (pid {proc.pid}, database {health['database']})")
            produce: list[Phase] = []
            with httpx.Client(
                base_url=url,
                headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
                timeout=60,
            ) as client:
                for batch, requests in phases:
                    progress(f"produce: {requests} requests of {batch} message(s)")
                    produce.append(produce_phase(client, topic, batch, requests))
                    progress(f"  {produce[-1].msgs_per_s:,.0f} msgs/s")
                batch, requests = phases[-1]
                progress(f"produce: {requests} requests of {batch} from {CLIENTS} clients")
                concurrent = concurrent_produce_phase(
                    url, dict(client.headers), topic, batch, requests, CLIENTS
                )
                progress(f"  {concurrent.msgs_per_s:,.0f} msgs/s")
                progress(f"interleaved: {ROUNDS} rounds of produce vs raw, batch {batch}")
                ratios = interleaved_rounds(client, topic, scratch_partition, 10**9, batch)
                progress("  " + ", ".join(percent(r) for r in ratios))
                info = client.get(f"/api/v1/topics/{topic}").raise_for_status().json()
                end_offset = info["partition_offsets"][0]["end_offset"]
                progress(f"fetch: {end_offset} messages, limit={FETCH_LIMIT}")
                fetch = fetch_phase(client, topic, end_offset)
                progress(f"  {fetch.msgs_per_s:,.0f} msgs/s")
                progress(f"fetch: the same from {FETCH_CLIENTS} consumers at once")
                fetch_many = concurrent_fetch_phase(
                    url, dict(client.headers), topic, end_offset, FETCH_CLIENTS
                )
                progress(f"  {fetch_many.msgs_per_s:,.0f} msgs/s")
        finally:
            stop_daphne(proc)

        connections.close_all()
        raw: list[Phase] = []
        offset = 0
        for batch, requests in phases:
            progress(f"raw insert: {requests} transactions of {batch} row(s)")
            raw.append(raw_insert(f"raw batch={batch}", scratch_partition, offset, batch, requests))
            offset += batch * requests
            progress(f"  {raw[-1].msgs_per_s:,.0f} rows/s")
        batch, requests = phases[-1]
        progress(f"raw insert: {requests} batches of {batch} rows in one transaction")
        raw_one_txn = raw_insert_one_transaction(
            f"raw batch={batch}, 1 txn", scratch_partition, offset, batch, requests
        )

        if os.environ.get("DATABASE_URL"):
            # The database outlives this run: leave no bench topics or usable key behind.
            progress("removing the bench topics and revoking the bench key")
            cleanup_fixtures(stamp, [topic, scratch])
        connections.close_all()

        nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        header = [
            ("command", command_line()),
            ("database", f"{vendor}: {database}"),
            (
                "machine",
                f"nproc={nproc}, {platform.system()} {platform.machine()}, "
                f"Python {platform.python_version()}",
            ),
            ("server", f"1 Daphne process on 127.0.0.1:{port}, FERRY_BACKGROUND_IN_PROCESS=0"),
            (
                "client",
                f"single client, sequential requests (and {CLIENTS} at once where marked), "
                "httpx keep-alive, same machine",
            ),
            (
                "message",
                f"value = JSON string of {len(VALUE)} chars, serialized {len(VALUE_BYTES)}"
                " bytes; no key, tag, headers or id",
            ),
        ]
        print(
            report(header, produce, concurrent, ratios, [fetch, fetch_many], raw, raw_one_txn),
            flush=True,
        )
        ok = True
        return 0
    finally:
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            progress(f"failed; kept {tmp} (daphne.log) for inspection")


if __name__ == "__main__":
    sys.exit(main())
