"""Transactional produce against plain batch produce over REST, in the same run.

Run by `make bench` (scripts/bench), once on SQLite and once on PostgreSQL; not part of the test
suite (STYLE.md §6). Starts Daphne on 127.0.0.1 (a free port, background jobs off), then for 10
and 100 messages per batch, with CLIENTS client threads each on its own keep-alive connection:

- *plain*: POST /topics/{t}/messages with the batch (one request, one commit);
- *transaction*: POST /transactions, POST /transactions/{id}/messages with the batch,
  POST /transactions/{id}/commit (three requests, three commits);
- *begin with messages*: POST /transactions carrying the batch, then the commit (two);

each until MESSAGES messages are stored, timing from the common start to the last thread done.
Checks that every topic ends with exactly the messages sent, offsets gapless. Target (issue 11):
transactional >= 0.5 x plain at 100 per transaction.

    .venv/bin/python bench/transactions.py [--messages 20000] [--clients 4]
"""

import argparse
import functools
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson
from produce_fetch import (
    command_line,
    database_description,
    free_port,
    progress,
    run_together,
    setup_django,
    start_daphne,
    stop_daphne,
    wait_healthy,
)

SIZES = (10, 100)
VALUE = {"payload": "x" * 200}


def body(batch: int, start: int) -> bytes:
    return orjson.dumps(
        {"messages": [{"value": VALUE, "key": str(start + i)} for i in range(batch)]}
    )


def plain(client: httpx.Client, topic: str, batch: int, rounds: int) -> None:
    for r in range(rounds):
        response = client.post(
            f"/api/v1/topics/{topic}/messages",
            content=body(batch, r * batch),
            headers={"Content-Type": "application/json"},
        )
        response.raise_for_status()


def transactional(client: httpx.Client, topic: str, batch: int, rounds: int, who: str) -> None:
    for r in range(rounds):
        begun = client.post("/api/v1/transactions", json={"producer_id": who, "timeout_ms": 60000})
        begun.raise_for_status()
        tx = begun.json()["id"]
        added = client.post(
            f"/api/v1/transactions/{tx}/messages",
            content=orjson.dumps({"topic": topic, **orjson.loads(body(batch, r * batch))}),
            headers={"Content-Type": "application/json"},
        )
        added.raise_for_status()
        client.post(f"/api/v1/transactions/{tx}/commit").raise_for_status()


def one_trip(client: httpx.Client, topic: str, batch: int, rounds: int, who: str) -> None:
    """The begin carries the messages: two requests (begin with messages, commit)."""
    for r in range(rounds):
        begun = client.post(
            "/api/v1/transactions",
            content=orjson.dumps(
                {"producer_id": who, "timeout_ms": 60000, "topic": topic}
                | orjson.loads(body(batch, r * batch))
            ),
            headers={"Content-Type": "application/json"},
        )
        begun.raise_for_status()
        client.post(f"/api/v1/transactions/{begun.json()['id']}/commit").raise_for_status()


def phase(url: str, key: str, topic: str, batch: int, total: int, clients: int, mode: str) -> float:
    rounds = max(1, total // batch // clients)
    barrier = threading.Barrier(clients + 1)
    failures: list[BaseException] = []

    def work(n: int) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            client.get("/api/v1/health").raise_for_status()  # connect before the clock starts
            barrier.wait()
            try:
                if mode == "plain":
                    plain(client, topic, batch, rounds)
                elif mode == "transaction":
                    transactional(client, topic, batch, rounds, f"bench-{topic}-{n}")
                else:
                    one_trip(client, topic, batch, rounds, f"bench-{topic}-{n}")
            except BaseException as exc:
                failures.append(exc)

    seconds = run_together([functools.partial(work, n) for n in range(clients)], barrier)
    if failures:
        raise RuntimeError(f"{mode} failed: {failures[0]!r}")
    return rounds * batch * clients / seconds


def check(topic: str, expected: int) -> None:
    from broker import models

    offsets = sorted(
        models.Message.objects.filter(partition__topic__name=topic).values_list("offset", flat=True)
    )
    assert offsets == list(range(expected)), f"{topic}: {len(offsets)} stored, not {expected}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per phase")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-tx-"))
    setup_django(data_dir)
    from broker.core import keys, topics

    _, key = keys.create_api_key(
        keys.CONSOLE, f"bench-tx-{os.getpid()}", [keys.parse_permission("admin:*")]
    )
    stamp = str(int(time.time()))
    port = free_port()
    log_path = data_dir / "daphne.log"
    proc = start_daphne(port, log_path)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        wait_healthy(url, proc, log_path)
        for batch in SIZES:
            figures = {}
            for mode in ("plain", "transaction", "begin-with-messages"):
                name = f"bench-tx-{stamp}-{mode}-{batch}"
                topics.create_topic(keys.CONSOLE, name, 1)
                progress(f"{mode}, {batch} per batch")
                figures[mode] = phase(url, key, name, batch, args.messages, args.clients, mode)
                rounds = max(1, args.messages // batch // args.clients)
                check(name, rounds * batch * args.clients)
            rows.append(
                (batch, figures["plain"], figures["transaction"], figures["begin-with-messages"])
            )
    finally:
        stop_daphne(proc)
    print(f"# {command_line()}")
    print(f"# {database_description()}, {platform.machine()}, load {os.getloadavg()[0]:.1f}")
    print(f"# {args.messages} messages per phase, {args.clients} client threads, 256-byte values")
    print(
        "| per batch | plain msgs/s | begin, add, commit msgs/s | ratio "
        "| begin with messages, commit msgs/s | ratio |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch, plain_rate, tx_rate, one_rate in rows:
        print(
            f"| {batch} | {plain_rate:,.0f} | {tx_rate:,.0f} | {tx_rate / plain_rate:.2f}x "
            f"| {one_rate:,.0f} | {one_rate / plain_rate:.2f}x |"
        )
    if not os.environ.get("DATABASE_URL"):
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
