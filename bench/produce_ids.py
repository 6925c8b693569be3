"""What a message's client id costs a produce: the same requests with and without an id each.

Not part of the test suite (STYLE.md §6), nor of `make bench`: a measurement for
docs/benchmarks.md (session 41). `ferry_client` gives every message an id (its retries then
store a message once), so this is what a producer through the client pays. One process:

1. starts Daphne on 127.0.0.1 (background jobs off) on the database the environment names
   (DATABASE_URL, or a temporary embedded SQLite);
2. ROUNDS times, alternating (every other round in the reverse order): 16 threads post the
   same keyed 256-byte messages in requests of 100 to a new 4-partition topic, without ids,
   then with an id each: ferry_client's (the time, then random bits), or with --ids uuid4 a
   random uuid4 (the client's before session 41);
3. prints each round's msgs/s and the CPU per 1,000 messages of Daphne and, on PostgreSQL, of
   the postmaster with its children (its backends), then the medians; stops Daphne by its PID
   and removes its temporary directory.

--prefill N (PostgreSQL) first stores N ids of the same kind for one 4-partition topic, as a
day of a producer's ids in the dedup window would be (COPY, then ANALYZE), and every round
posts to that topic: beyond shared_buffers, a random id's index pages are more often out of
PostgreSQL's cache than a time-ordered one's.

--triggers-off (PostgreSQL, a throwaway server only: `scripts/with-postgres` starts one)
alternates every round with and without the triggers of broker_message and broker_producedid
(ALTER TABLE ... DISABLE TRIGGER ALL), to weigh their foreign keys' checks; they are on again
at the end. Before migration 0011 broker_producedid's check of its topic was one of them;
since, neither table has one on PostgreSQL (ADR 0017).

--batch B --requests R: R requests of B messages a thread instead of 30 of 100 (--batch 1
--requests 200: producers that send one event a request, the client's default). Each round
also prints the median and 99th percentile of a request's time.

    scripts/with-postgres .venv/bin/python bench/produce_ids.py [--rounds 4] [--triggers-off]
        [--ids client|uuid4] [--prefill 3000000] [--batch 100 --requests 30]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
from pg_server import postgres_cpu, postmaster_pid
from produce_fetch import (
    VALUE,
    command_line,
    cpu_seconds,
    database_description,
    free_port,
    setup_django,
    start_daphne,
    stop_daphne,
    wait_healthy,
)
from websocket import percentile

PRODUCERS, REQUESTS, BATCH, PARTITIONS = 16, 30, 100, 4
CHECKED_TABLES = ("broker_message", "broker_producedid")


def triggers(on: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in CHECKED_TABLES:
            cursor.execute(f"ALTER TABLE {table} {'ENABLE' if on else 'DISABLE'} TRIGGER ALL")
    connection.close()


def client_id() -> str:
    """ferry_client's id for a message (records.new_id)."""
    from ferry_client.records import new_id  # importable once setup_django put ROOT on the path

    return new_id()


ID_MAKERS = {"client": client_id, "uuid4": lambda: uuid.uuid4().hex}
PREFILL_CHUNK = 500_000


def prefill(topic: str, count: int, make_id: Callable[[], str]) -> None:
    """count ids of make_id's kind stored for topic, in the window (created now)."""
    from django.db import connection

    from broker import models

    topic_id = models.Topic.objects.get(name=topic).id
    now_ms = int(time.time() * 1000)
    columns = 'topic_id, client_id, partition_number, "offset", created_ms'
    with connection.cursor() as cursor:
        for start in range(0, count, PREFILL_CHUNK):
            with cursor.cursor.copy(f"COPY broker_producedid ({columns}) FROM STDIN") as copy:
                for i in range(start, min(count, start + PREFILL_CHUNK)):
                    copy.write_row((topic_id, make_id(), i % PARTITIONS, i // PARTITIONS, now_ms))
            print(f"[bench] prefilled {min(count, start + PREFILL_CHUNK):,} ids", flush=True)
        cursor.execute("ANALYZE broker_producedid")
    connection.close()


def create_topic(url: str, headers: dict[str, str], topic: str) -> None:
    httpx.post(
        f"{url}/api/v1/topics", json={"name": topic, "partitions": PARTITIONS}, headers=headers
    ).raise_for_status()


def produce_round(
    url: str,
    headers: dict[str, str],
    topic: str,
    ids: bool,
    make_id: Callable[[], str],
    shape: tuple[int, int],
) -> tuple[float, list[float]]:
    """The round's seconds, and each request's: PRODUCERS threads, shape = (requests, batch)."""
    requests, batch = shape

    def message(i: int, j: int) -> dict[str, object]:
        return {"key": f"p{i}-{j}", "value": VALUE, **({"id": make_id()} if ids else {})}

    bodies = [
        [orjson.dumps({"messages": [message(i, j) for j in range(batch)]}) for _ in range(requests)]
        for i in range(PRODUCERS)
    ]
    took: list[float] = []

    def work(i: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            for body in bodies[i]:
                sent = time.perf_counter()
                client.post(f"/api/v1/topics/{topic}/messages", content=body).raise_for_status()
                took.append(time.perf_counter() - sent)  # list.append: atomic under the GIL

    threads = [threading.Thread(target=work, args=(i,)) for i in range(PRODUCERS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4, help="pairs of rounds (default 4)")
    parser.add_argument(
        "--triggers-off",
        action="store_true",
        help="also alternate with the tables' triggers off (a throwaway PostgreSQL only)",
    )
    parser.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="store this many ids for one topic first, and post every round to it (PostgreSQL)",
    )
    parser.add_argument(
        "--ids",
        choices=sorted(ID_MAKERS),
        default="client",
        help="the ids: ferry_client's (default) or random uuid4s",
    )
    parser.add_argument("--batch", type=int, default=BATCH, help="messages a request (100)")
    parser.add_argument(
        "--requests", type=int, default=REQUESTS, help="requests a thread a round (30)"
    )
    args = parser.parse_args()
    shape = (args.requests, args.batch)
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-ids-"))
    setup_django(tmp)
    from broker.core import keys

    database_url = os.environ.get("DATABASE_URL", "")
    postmaster = postmaster_pid(database_url) if database_url.startswith("postgres") else None
    if args.triggers_off and postmaster is None:
        sys.exit("--triggers-off needs PostgreSQL (scripts/with-postgres)")
    if args.prefill and postmaster is None:
        sys.exit("--prefill needs PostgreSQL (scripts/with-postgres)")
    _, secret = keys.create_api_key(
        keys.CONSOLE, f"bench-ids-{os.getpid()}", [keys.parse_permission("admin:*")]
    )
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    states = (True, False) if args.triggers_off else (True,)
    kinds = [(ids, enabled) for enabled in states for ids in (False, True)]
    results: dict[tuple[bool, bool], list[tuple[float, ...]]] = {k: [] for k in kinds}
    port, log_path = free_port(), tmp / "daphne.log"
    proc = start_daphne(port, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log_path)
        count = PRODUCERS * args.requests * args.batch
        prefilled = f"bench-ids-{os.getpid()}-prefilled" if args.prefill else None
        if prefilled:
            create_topic(url, headers, prefilled)
            prefill(prefilled, args.prefill, ID_MAKERS[args.ids])
        for round_ in range(args.rounds):
            # Every other round in the reverse order: a round's later phases ran cheaper on
            # PostgreSQL, whatever they measured (the triggers off with none left to fire).
            for ids, enabled in kinds if round_ % 2 == 0 else kinds[::-1]:
                if args.triggers_off:
                    triggers(enabled)
                topic = prefilled or f"bench-ids-{os.getpid()}-{round_}-{ids:d}{enabled:d}"
                if not prefilled:
                    create_topic(url, headers, topic)
                broker, pg = cpu_seconds(proc.pid), postgres_cpu(postmaster) if postmaster else 0.0
                seconds, took = produce_round(url, headers, topic, ids, ID_MAKERS[args.ids], shape)
                broker = (cpu_seconds(proc.pid) - broker) / count * 1000
                pg = (postgres_cpu(postmaster) - pg) / count * 1000 if postmaster else 0.0
                took.sort()
                p50, p99 = percentile(took, 0.5) * 1000, percentile(took, 0.99) * 1000
                results[(ids, enabled)].append((count / seconds, broker, pg, p50, p99))
                print(
                    f"[bench] ids {'on ' if ids else 'off'} triggers {'on ' if enabled else 'off'}"
                    f"  {count / seconds:>8,.0f} msgs/s  broker {broker:.4f}  PG {pg:.4f} s/1k"
                    f"  request p50 {p50:.1f} p99 {p99:.1f} ms",
                    flush=True,
                )
    finally:
        if args.triggers_off:
            triggers(True)
        stop_daphne(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n  command  : {command_line()}\n  database : {database_description()}")
    print(
        f"  {PRODUCERS} threads x {args.requests} requests x {args.batch} keyed 256-byte messages"
    )
    if args.prefill:
        print(f"  every round to one topic, {args.prefill:,} ids of the same kind stored first")
    print(
        "  medians of",
        args.rounds,
        "rounds      msgs/s  broker CPU s/1k  PG CPU s/1k  request p50 / p99 ms",
    )
    for ids, enabled in kinds:
        rate, broker, pg, p50, p99 = (
            statistics.median(r[i] for r in results[(ids, enabled)]) for i in range(5)
        )
        label = f"ids {'on' if ids else 'off'}, triggers {'on' if enabled else 'off'}"
        print(f"  {label:<27}{rate:>9,.0f}{broker:>17.4f}{pg:>13.4f}{p50:>12.1f} / {p99:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
