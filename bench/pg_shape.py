"""PostgreSQL alone, appending in Ferry's shape: what its CPU a message does with no Ferry.

Part `shape` of bench/postgres.py, after the scale-out: for each of the scale-out's produce
phases, writer processes (one a Daphne process, one connection each) append to a table shaped
as broker_message, with its indexes, as Ferry's group commits do: lock the 4 partition rows
(`FOR NO KEY UPDATE`, in order), `COPY` the keyed 256-byte rows (at every size; Ferry from 200
rows on), update the partitions, `COMMIT`. Each writer is paced so that together they append
at the phase's rate in transactions of the phase's size (its messages per transaction).
PostgreSQL's CPU a message in these phases, against the one-process phase's, is what
PostgreSQL's own work does at those sizes and rates: the floor under the scale-out's
"PostgreSQL CPU a message within 15 %" (docs/benchmarks.md, session 43).

    scripts/with-postgres .venv/bin/python bench/pg_shape.py  # the shapes of session 43
"""

import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from pg_server import postgres_cpu, postmaster_pid

PARTITIONS = 4
VALUE = b'"' + b"x" * 254 + b'"'
TABLES = """
DROP TABLE IF EXISTS bench_shape_message;
DROP TABLE IF EXISTS bench_shape_partition;
CREATE TABLE bench_shape_partition (id int PRIMARY KEY, next_offset bigint NOT NULL,
    bytes_stored bigint NOT NULL);
INSERT INTO bench_shape_partition SELECT n, 0, 0 FROM generate_series(1, 4) AS n;
CREATE TABLE bench_shape_message (id bigserial PRIMARY KEY, partition_id int NOT NULL,
    "offset" bigint NOT NULL, timestamp_ms bigint NOT NULL, "key" text, tag text,
    headers text NOT NULL, value bytea NOT NULL, is_json bool NOT NULL, size_bytes int NOT NULL,
    client_id text) WITH (autovacuum_enabled = false);
CREATE UNIQUE INDEX ON bench_shape_message (partition_id, "offset");
CREATE INDEX ON bench_shape_message (partition_id, timestamp_ms);
CREATE INDEX ON bench_shape_message (partition_id, "key", "offset") WHERE "key" IS NOT NULL;
CREATE INDEX ON bench_shape_message (partition_id, client_id, "offset")
    WHERE client_id IS NOT NULL;
"""
LOCK = (
    "SELECT id, next_offset FROM bench_shape_partition WHERE id = ANY(%s) ORDER BY id "
    "FOR NO KEY UPDATE"
)
COPY = (
    'COPY bench_shape_message (partition_id, "offset", timestamp_ms, "key", tag, headers, '
    "value, is_json, size_bytes, client_id) FROM STDIN"
)
UPDATE = (
    "UPDATE bench_shape_partition AS p SET next_offset = v.next_offset, "
    "bytes_stored = p.bytes_stored + v.added FROM (VALUES "
    + ", ".join(["(%s::int, %s::bigint, %s::bigint)"] * PARTITIONS)
    + ") AS v (id, next_offset, added) WHERE p.id = v.id"
)


@dataclass
class Shape:
    label: str
    writers: int
    per_transaction: int
    rate: float  # messages a second, all writers together


@dataclass
class Result:
    rate: float
    transactions_per_1k: float
    postgres_per_1k: float  # CPU seconds per 1,000 messages


def writer(url: str, shape: Shape, seconds: float, done: "mp.Queue[tuple[int, int]]") -> None:
    """Append for seconds at shape.rate / shape.writers; put (messages, transactions)."""
    import psycopg

    ids = list(range(1, PARTITIONS + 1))
    rate, size = shape.rate / shape.writers, shape.per_transaction
    appended = transactions = 0
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        started = due = time.monotonic()
        while time.monotonic() - started < seconds:
            next_offset: dict[int, int] = dict(cur.execute(LOCK, (ids,)).fetchall())
            added = dict.fromkeys(ids, 0)
            now_ms = time.time_ns() // 1_000_000
            with cur.copy(COPY) as copy:
                for i in range(appended, appended + size):
                    partition = i % PARTITIONS + 1
                    offset = next_offset[partition]
                    next_offset[partition] = offset + 1
                    added[partition] += len(VALUE)
                    key = f"k{os.getpid()}-{i}"
                    copy.write_row(
                        (partition, offset, now_ms, key, None, "{}", VALUE, True, 256, None)
                    )
            cur.execute(UPDATE, [v for p in ids for v in (p, next_offset[p], added[p])])
            conn.commit()
            appended += size
            transactions += 1
            due += size / rate
            time.sleep(max(0.0, due - time.monotonic()))
    done.put((appended, transactions))


def autovacuum_done(url: str, limit_s: float = 120.0) -> None:
    """Wait (up to limit_s) until no autovacuum worker runs: after the scale-out's millions of
    rows one often does, and its CPU would count as the writers' (PostgreSQL's, summed)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        started = time.monotonic()
        while time.monotonic() - started < limit_s:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            ).fetchone()
            if not row or not row[0]:
                return
            time.sleep(0.5)
    print(f"[bench] autovacuum still running after {limit_s:.0f} s", flush=True)


def run(url: str, server_cpu: Callable[[], float], shape: Shape, seconds: float) -> Result:
    """One phase: shape.writers processes for seconds; PostgreSQL's CPU over it (server_cpu:
    the server's CPU seconds so far), once no autovacuum runs."""
    autovacuum_done(url)
    context = mp.get_context("spawn")
    done: mp.Queue[tuple[int, int]] = context.Queue()
    procs = [
        context.Process(target=writer, args=(url, shape, seconds, done))
        for _ in range(shape.writers)
    ]
    cpu, started = server_cpu(), time.monotonic()
    for proc in procs:
        proc.start()
    counts = [done.get(timeout=seconds + 60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    wall, cpu = time.monotonic() - started, server_cpu() - cpu
    messages, transactions = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return Result(messages / wall, transactions / messages * 1000, cpu / messages * 1000)


def measure(
    url: str, server_cpu: Callable[[], float], shapes: list[Shape], rounds: int, seconds: float
) -> dict[str, list[Result]]:
    """Each shape rounds times, every other round in the reverse order, on fresh tables."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLES)
    results: dict[str, list[Result]] = {s.label: [] for s in shapes}
    for round_ in range(rounds):
        for shape in shapes if round_ % 2 == 0 else shapes[::-1]:
            result = run(url, server_cpu, shape, seconds)
            results[shape.label].append(result)
            print(
                f"[bench] PostgreSQL alone, {shape.label}: {result.rate:,.0f} msgs/s, "
                f"{result.transactions_per_1k:.2f} transactions and "
                f"{result.postgres_per_1k:.4f} s of PostgreSQL CPU per 1,000",
                flush=True,
            )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_shape_message; DROP TABLE bench_shape_partition")
    return results


def medians(results: list[Result]) -> Result:
    return Result(
        statistics.median(r.rate for r in results),
        statistics.median(r.transactions_per_1k for r in results),
        statistics.median(r.postgres_per_1k for r in results),
    )


# Session 43's shapes: the scale-out's one process (about 700 messages a commit at 5,000 a
# second) and four (about 270 at 17,000), and each factor on its own.
SESSION_43 = [
    Shape("x1, 700 a commit, 5,000/s", 1, 700, 5000),
    Shape("x4, 270 a commit, 17,000/s", 4, 270, 17000),
    Shape("x1, 270 a commit, 17,000/s", 1, 270, 17000),
    Shape("x4, 700 a commit, 5,000/s", 4, 700, 5000),
    Shape("x1, 270 a commit, 5,000/s", 1, 270, 5000),
    Shape("x1, 700 a commit, 17,000/s", 1, 700, 17000),
]


def main() -> int:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        sys.exit("needs PostgreSQL: scripts/with-postgres .venv/bin/python bench/pg_shape.py")
    postmaster = postmaster_pid(url)
    results = measure(url, lambda: postgres_cpu(postmaster), SESSION_43, rounds=3, seconds=8.0)
    base = medians(results[SESSION_43[0].label]).postgres_per_1k
    print("\n  medians of 3 rounds                 msgs/s  commits/1k  PG CPU s/1k  ÷ first")
    for shape in SESSION_43:
        m = medians(results[shape.label])
        print(
            f"  {shape.label:<32}{m.rate:>9,.0f}{m.transactions_per_1k:>12.2f}"
            f"{m.postgres_per_1k:>13.4f}{m.postgres_per_1k / base:>8.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
