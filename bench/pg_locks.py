"""What an append's partition lock costs PostgreSQL when it waits for another transaction.

Not part of the test suite (STYLE.md §6); PostgreSQL only, under scripts/with-postgres (which
exports DATABASE_URL and runs the server on this machine: the backends' CPU is read from
/proc). Issue 18's produce scale-out pays more PostgreSQL CPU a message at 4 processes than at
one, and it commits more often: each process's group commit holds only its own producers. This
measures one part of a commit's cost alone, without the broker: a transaction shaped like an
append's bookkeeping (lock a topic's 4 partition rows FOR NO KEY UPDATE in number order, hold
them for PAUSE_S while the process would build its rows, update the rows, COMMIT):

1. alone: one session, so no lock ever waits (one process's group commits);
2. contended: 4 sessions on the same rows, as 4 processes' group commits are;
3. advisory first: the same 4 sessions, each taking a transaction-level advisory lock of the
   topic before the rows, so that they wait on it and then lock rows nobody holds.

It prints the transactions a second and the backends' CPU a transaction, summed over the
sessions. A scratch table shaped like broker_partition is made and dropped.

    scripts/with-postgres .venv/bin/python bench/pg_locks.py [--transactions 4000] [--rounds 2]
"""

import argparse
import os
import sys
import threading
import time

import psycopg
from produce_fetch import cpu_seconds, progress

PAUSE_S = 0.0003  # the process's Python between the lock's answer and the rows
SESSIONS = 4
ADVISORY_CLASS = 4242  # pg_advisory_xact_lock(class, topic): a key of this bench's own
SETUP = """
DROP TABLE IF EXISTS bench_partition;
CREATE TABLE bench_partition (
    id bigint PRIMARY KEY, topic_id bigint NOT NULL, number integer NOT NULL,
    next_offset bigint NOT NULL, start_offset bigint NOT NULL, bytes_stored bigint NOT NULL,
    UNIQUE (topic_id, number));
INSERT INTO bench_partition SELECT n, 1, n - 1, 0, 0, 0 FROM generate_series(1, 4) n;
"""
LOCK = (
    "SELECT id, next_offset FROM bench_partition WHERE topic_id = 1 AND number IN (0, 1, 2, 3) "
    "ORDER BY number FOR NO KEY UPDATE"
)
UPDATE = (
    "UPDATE bench_partition SET next_offset = next_offset + 100, bytes_stored = bytes_stored "
    "+ 25600 WHERE topic_id = 1"
)


def appends(conn: psycopg.Connection, count: int, advisory: bool) -> None:
    for _ in range(count):
        with conn.transaction():
            if advisory:
                conn.execute("SELECT pg_advisory_xact_lock(%s, 1)", [ADVISORY_CLASS])
            conn.execute(LOCK).fetchall()
            time.sleep(PAUSE_S)
            conn.execute(UPDATE)


def measure(url: str, sessions: int, advisory: bool, transactions: int) -> tuple[float, float]:
    """Transactions a second, and the backends' CPU a transaction in µs."""
    conns = [psycopg.connect(url) for _ in range(sessions)]
    try:
        pids = [c.info.backend_pid for c in conns]
        each = transactions // sessions
        cpu, started = sum(map(cpu_seconds, pids)), time.perf_counter()
        threads = [threading.Thread(target=appends, args=(c, each, advisory)) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - started
        used = sum(map(cpu_seconds, pids)) - cpu
    finally:
        for c in conns:
            c.close()
    done = each * sessions
    return done / seconds, used / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=4000, help="per part and round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("PostgreSQL only: run under scripts/with-postgres")
    url = url.replace("postgres://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP)
        version = conn.execute("SHOW server_version").fetchone()
    parts = (
        ("alone", 1, False),
        ("contended", SESSIONS, False),
        ("advisory first", SESSIONS, True),
    )
    rows = []
    try:
        for round_ in range(args.rounds):
            for name, sessions, advisory in parts:
                progress(f"round {round_ + 1}: {name}")
                rows.append((name, sessions, *measure(url, sessions, advisory, args.transactions)))
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_partition")
    print("\nFerry bench: an append's partition lock when it waits (bench/pg_locks.py)")
    print(
        f"  command  : scripts/with-postgres .venv/bin/python bench/pg_locks.py "
        f"--transactions {args.transactions} --rounds {args.rounds}"
    )
    print(
        f"  database : PostgreSQL {version[0] if version else '?'}; load average after "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(
        f"  each transaction: lock 4 partition rows, {PAUSE_S * 1e6:.0f} µs pause, update, COMMIT\n"
    )
    print(f"  {'part':<16}{'sessions':>9}{'tx/s':>9}{'backend CPU µs a tx':>22}")
    for name, sessions, rate, cpu in rows:
        print(f"  {name:<16}{sessions:>9}{rate:>9,.0f}{cpu:>22,.0f}")


if __name__ == "__main__":
    main()
