"""Memory: the server process's peak RSS under concurrent big produces (issue 9, item 8).

Run by `make bench` (scripts/bench); not part of the test suite (STYLE.md §6). Before the
parsing budget, four concurrent 60 MB produce requests took the server to 1.4 GB, which it kept.
For each run of RUNS (a budget, clients, rounds) this script:

1. starts Daphne (background jobs off) with FERRY_MAX_PARSING_BYTES set to it, on the database
   the environment names (a temporary embedded SQLite, or DATABASE_URL);
2. reads the Daphne process's VmHWM (peak resident set) from /proc/<pid>/status once healthy;
3. sends `clients` produce requests of about 60 MB at once (60 messages of a 1,000,000-character
   JSON string each), `rounds` times, retrying a 503 `busy` after its retry_after;
4. reads VmHWM and VmRSS again, prints them beside the budget, and stops Daphne by its PID.

    .venv/bin/python bench/memory.py
"""

import os
import shutil
import signal
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
    setup_django,
    start_daphne,
    stop_daphne,
    wait_healthy,
)

MIB = 1024 * 1024
CLIENTS = 4
ROUNDS = 3
MESSAGES = 60
VALUE_CHARS = 1_000_000
# (budget, clients, rounds): one request alone (what one costs), then the default budget (256
# MiB: all four requests at once) and one request at a time (64 MiB).
RUNS = ((256 * MIB, 1, 1), (256 * MIB, CLIENTS, ROUNDS), (64 * MIB, CLIENTS, ROUNDS))


def status_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak) and VmRSS (now) of a process, in KiB, from /proc/<pid>/status."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            found[name] = int(value.split()[0])
    return found


def body() -> bytes:
    value = "m" * VALUE_CHARS
    return orjson.dumps({"messages": [{"value": value} for _ in range(MESSAGES)]})


def produce_all(
    url: str, secret: str, payload: bytes, clients: int, rounds: int
) -> tuple[int, int, float]:
    """`clients` concurrent requests, `rounds` times: (accepted, answered busy, seconds)."""
    accepted = busy = 0
    lock = threading.Lock()

    def client() -> None:
        nonlocal accepted, busy
        with httpx.Client(timeout=600) as c:
            for _ in range(rounds):
                while True:
                    response = c.post(
                        f"{url}/api/v1/topics/big/messages",
                        content=payload,
                        headers={
                            "Authorization": f"Bearer {secret}",
                            "Content-Type": "application/json",
                        },
                    )
                    if response.status_code == 503:
                        with lock:
                            busy += 1
                        time.sleep(response.json()["error"]["detail"]["retry_after"])
                        continue
                    assert response.status_code == 200, response.text[:500]
                    with lock:
                        accepted += 1
                    break

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return accepted, busy, time.perf_counter() - started


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-memory-"))
    rows = []
    try:
        setup_django(data_dir)
        from broker.core import keys, topics

        topics.create_topic(keys.CONSOLE, "big", 4)
        _, secret = keys.create_api_key(
            keys.CONSOLE, "bench-memory", [keys.parse_permission("admin:*")]
        )
        payload = body()
        progress(f"request body: {len(payload) / MIB:.1f} MiB")
        for budget, clients, rounds in RUNS:
            os.environ["FERRY_MAX_PARSING_BYTES"] = str(budget)
            port = free_port()
            log_path = data_dir / f"daphne-{budget}.log"
            proc = start_daphne(port, log_path)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_healthy(url, proc, log_path)
                before = status_kib(proc.pid)
                progress(f"budget {budget // MIB} MiB: {clients} x {rounds} produces")
                accepted, busy, took = produce_all(url, secret, payload, clients, rounds)
                after = status_kib(proc.pid)
                rows.append((budget, clients, rounds, before, after, accepted, busy, took))
            finally:
                stop_daphne(proc)
    finally:
        os.environ.pop("FERRY_MAX_PARSING_BYTES", None)
        shutil.rmtree(data_dir, ignore_errors=True)
    print()
    print(f"# bench/memory.py: {database_description()}")
    print(f"command: {command_line()}")
    print(
        f"requests of {len(payload) / MIB:.1f} MiB ({MESSAGES} messages of {VALUE_CHARS:,} "
        "characters), from clients at once, each sending its requests one after the other"
    )
    print()
    print(
        "| FERRY_MAX_PARSING_BYTES | clients x requests | peak RSS (VmHWM) before | peak RSS "
        "after | RSS after | accepted | answered 503 busy | seconds |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for budget, clients, rounds, before, after, accepted, busy, took in rows:
        print(
            f"| {budget // MIB} MiB | {clients} x {rounds} | {before['VmHWM'] / 1024:.0f} MiB "
            f"| {after['VmHWM'] / 1024:.0f} MiB | {after['VmRSS'] / 1024:.0f} MiB "
            f"| {accepted} | {busy} | {took:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
