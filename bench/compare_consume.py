"""Consume+ack of two checkouts of Ferry in one run, their rounds alternating.

Not part of the test suite (STYLE.md §6), nor of `make bench`: it needs a second checkout (a
git worktree of the commit to compare with, its .venv linked to this one's). On a machine whose
speed drifts by half within minutes, whole bench runs taken one after the other compare the
drift; rounds taken in turns by two servers side by side compare the code.

One Daphne process from each checkout, both on the same database (the embedded SQLite, or
PostgreSQL under scripts/with-postgres), the in-memory channel layer, background jobs off. Each
gets its own 1-partition topics, filled over REST (B keyed 256-byte messages per request), then
per round one WebSocket subscriber of each (in turns, the first of each pair alternating) takes
N messages with prefetch 2*B (or --prefetch) and an ack frame per B, as bench/postgres.py's
consume does. Printed: per checkout, the median msgs/s and the broker's (and PostgreSQL's) CPU
per message over the rounds, and each round's ratio of the two.

    git worktree add --detach ../base <commit> && ln -s "$PWD/.venv" ../base/.venv
    [scripts/with-postgres] .venv/bin/python bench/compare_consume.py ../base [--rounds 8]
        [--batch 100] [--prefetch 200] [--messages 50000]
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import postgres as pg_bench
from produce_fetch import (
    free_port,
    progress,
    setup_django,
    start_daphne,
    stop_daphne,
    wait_healthy,
)

ROOT = Path(__file__).resolve().parent.parent


def start(checkout: Path, tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    """Daphne serving the checkout's code (its own directory first on the import path)."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # in-memory channel layer
    port, log_path = free_port(), tmp / f"daphne-{name}.log"
    return start_daphne(port, log_path, env=env, root=checkout), port, log_path


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("other", type=Path, help="the checkout to compare this one with")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100, help="B: an ack frame per B")
    parser.add_argument("--prefetch", type=int, help="the subscriber's prefetch (default 2B)")
    parser.add_argument("--messages", type=int, default=50_000, help="per round and checkout")
    args = parser.parse_args()
    checkouts = {"other": args.other.resolve(), "this": ROOT}
    batch, count = args.batch, args.messages // args.batch * args.batch
    prefetch = args.prefetch or 2 * batch
    tmp = Path(tempfile.mkdtemp(prefix="ferry-compare-"))
    setup_django(tmp)
    from django.db import connections

    from broker.core import keys, topics

    _, secret = keys.create_api_key(
        keys.CONSOLE, f"bench-compare-{os.getpid()}", [keys.parse_permission("admin:*")]
    )
    names = {
        (r, which): f"bench-compare-{os.getpid()}-{which}-{r}"
        for r in range(args.rounds)
        for which in checkouts
    }
    for name in names.values():
        topics.create_topic(keys.CONSOLE, name, 1)
    connections.close_all()
    url = os.environ.get("DATABASE_URL") or None
    postmaster = pg_bench.postmaster_pid(url) if url else None
    servers = {which: start(path, tmp, which) for which, path in checkouts.items()}
    results: dict[str, list[tuple[float, float, float]]] = {which: [] for which in checkouts}
    try:
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        for which, (proc, port, log_path) in servers.items():
            http_url = f"http://127.0.0.1:{port}"
            wait_healthy(http_url, proc, log_path)
            progress(f"{which}: producing {args.rounds} x {count:,} messages")
            with httpx.Client(base_url=http_url, headers=headers, timeout=60) as client:
                for r in range(args.rounds):
                    pg_bench.produce_sequential(client, names[(r, which)], batch, count // batch)
        if url:
            pg_bench.analyze(url)
        for r in range(args.rounds):
            order = list(checkouts) if r % 2 == 0 else list(reversed(checkouts))
            for which in order:
                proc, port, _ = servers[which]
                meter = pg_bench.Meter(url, [proc.pid], postmaster)
                with meter.measure(count) as counted:
                    asyncio.run(
                        pg_bench.consume(
                            [f"ws://127.0.0.1:{port}/ws/v1/"],
                            secret,
                            names[(r, which)],
                            f"bench-compare-{which}-{r}",
                            count,
                            prefetch,
                            batch,
                        )
                    )
                cpu = (counted.per_1k(counted.broker_cpu), counted.per_1k(counted.postgres_cpu))
                results[which].append((counted.rate, *cpu))
                progress(f"round {r + 1} {which}: {counted.rate:,.0f} msgs/s")
    finally:
        for proc, _, _ in servers.values():
            stop_daphne(proc)
    print(f"consume+ack B={batch}, prefetch {prefetch}, {count:,} messages a round")
    for which, path in checkouts.items():
        rows = results[which]
        rate = statistics.median(row[0] for row in rows)
        broker = statistics.median(row[1] for row in rows) * 1000
        postgres = statistics.median(row[2] for row in rows) * 1000
        every = ", ".join(f"{row[0]:,.0f}" for row in rows)
        theirs = f", PostgreSQL {postgres:.1f} us" if url else ""
        print(
            f"  {which:5} {path}: median {rate:,.0f} msgs/s, CPU per message broker "
            f"{broker:.1f} us{theirs}; rounds {every}"
        )
    ratios = [a[0] / b[0] for a, b in zip(results["this"], results["other"], strict=True)]
    print(
        f"  this / other per round: {', '.join(f'{x:.2f}' for x in ratios)} "
        f"(median {statistics.median(ratios):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
