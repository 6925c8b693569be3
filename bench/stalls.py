"""Stalls: health and single-message produce latency while a big listing or deletion runs.

Run by `make bench` (scripts/bench), on SQLite and on PostgreSQL; not part of the test suite
(STYLE.md §6). Issue 9, item 7: one slow request must not stall the broker. In one run:

1. builds, through the core in this process, on the database the environment names (the
   embedded SQLite under a temporary FERRY_DATA_DIR, or DATABASE_URL): a topic of 1024
   partitions on which 100 groups committed an offset per partition (102,400 group offset rows),
   a topic `big` of MESSAGES messages (8 partitions, 100-byte JSON values), and a topic `hot`;
2. starts Daphne (background jobs in-process, as `make run` does) and, from a probe thread,
   sends GET /api/v1/health and a one-message produce to `hot` in turn, PROBE_GAP_S apart;
3. measures the probe's latencies in three phases: idle; while another client lists every
   group without a limit (GET /api/v1/groups, the whole 100,000-row answer) in a loop; and
   from DELETE /api/v1/topics/big until the topic's last row is gone;
4. prints p50 / p99 / max per phase and the ratios to idle, the listing's own time and the
   deletion's, then stops Daphne by its PID (always).

    .venv/bin/python bench/stalls.py [--scale 0.1]
"""

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
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

GROUPS = 100
PARTITIONS = 1024
MESSAGES = 1_000_000
BIG_PARTITIONS = 8
PHASE_S = 15.0
PROBE_GAP_S = 0.02
DELETION_LIMIT_S = 900.0


def build(scale: float) -> dict[str, object]:
    from broker.core import groups, keys, log, topics
    from broker.core.records import NewMessage

    console = keys.CONSOLE
    started = time.perf_counter()
    topics.create_topic(console, "wide", PARTITIONS)
    for n in range(GROUPS):
        groups.commit_offsets(console, f"group-{n:03}", "wide", dict.fromkeys(range(PARTITIONS), 0))
    progress(f"{GROUPS} groups x {PARTITIONS} partitions of offsets")
    messages = int(MESSAGES * scale)
    topics.create_topic(console, "big", BIG_PARTITIONS)
    value = b'"' + b"v" * 98 + b'"'
    batch = 5000
    for first in range(0, messages, batch):
        n = min(batch, messages - first)
        log.append_messages(
            console,
            "big",
            [NewMessage(value=value, partition=i % BIG_PARTITIONS) for i in range(n)],
        )
        if first % 100_000 == 0:
            progress(f"big: {first + n:,} messages")
    topics.create_topic(console, "hot", 1)
    _, admin = keys.create_api_key(console, "bench-admin", [keys.parse_permission("admin:*")])
    return {
        "messages": messages,
        "secret": admin,
        "build_s": time.perf_counter() - started,
    }


class Probe:
    """Health then a one-message produce, in turn, PROBE_GAP_S apart, from one thread."""

    def __init__(self, url: str, secret: str) -> None:
        self.client = httpx.Client(
            base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=120
        )
        self.health: list[float] = []
        self.produce: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Probe":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            assert self.client.get("/health").status_code == 200
            t1 = time.perf_counter()
            sent = self.client.post("/topics/hot/messages", json={"messages": [{"value": 1}]})
            assert sent.status_code == 200, sent.text
            t2 = time.perf_counter()
            self.health.append(t1 - t0)
            self.produce.append(t2 - t1)
            self._stop.wait(PROBE_GAP_S)


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered), p99, ordered[-1]


def idle_phase(url: str, secret: str) -> Probe:
    progress("idle")
    with Probe(url, secret) as probe:
        time.sleep(PHASE_S)
    return probe


def listing_phase(url: str, secret: str) -> tuple[Probe, list[float]]:
    progress("listing GET /groups in a loop")
    took: list[float] = []
    stop = threading.Event()

    def lister() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=300) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                response = c.get(f"{url}/api/v1/groups")
                assert response.status_code == 200
                assert len(response.json()) == GROUPS
                took.append(time.perf_counter() - t0)

    thread = threading.Thread(target=lister, daemon=True)
    with Probe(url, secret) as probe:
        thread.start()
        time.sleep(PHASE_S)
        stop.set()
        thread.join()
    return probe, took


def deletion_phase(url: str, secret: str) -> tuple[Probe, float, float]:
    """From DELETE /topics/big until its last row is gone: (probe, answer time, total time)."""
    from broker import models

    progress("DELETE /topics/big, until its rows are gone")
    marked = hasattr(models.Topic, "deleting_since_ms")
    with Probe(url, secret) as probe:
        time.sleep(1.0)
        t0 = time.perf_counter()
        response = httpx.delete(
            f"{url}/api/v1/topics/big", headers={"Authorization": f"Bearer {secret}"}, timeout=900
        )
        answered = time.perf_counter() - t0
        assert response.status_code == 204, response.text
        while marked and models.Topic.objects.filter(deleting_since_ms__isnull=False).exists():
            if time.perf_counter() - t0 > DELETION_LIMIT_S:
                raise RuntimeError("the deletion did not finish")
            time.sleep(0.1)
        total = time.perf_counter() - t0
    return probe, answered, total


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def report(
    data: dict[str, object],
    phases: dict[str, Probe],
    listing: list[float],
    deletion: tuple[float, float],
) -> None:
    print()
    print(f"# bench/stalls.py: {database_description()}")
    print(f"command: {command_line()}")
    print(
        f"data: {GROUPS} groups x {PARTITIONS} partitions of offsets, big = "
        f"{data['messages']:,} messages in {BIG_PARTITIONS} partitions "
        f"(built in {data['build_s']:.0f} s)"
    )
    idle = phases["idle"]
    base = {"health": quantiles(idle.health), "produce": quantiles(idle.produce)}
    print()
    print(
        "| phase | probes | health p50 / p99 / max ms | x idle p50 / p99 "
        "| produce p50 / p99 / max ms | x idle p50 / p99 |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, probe in phases.items():
        h, p = quantiles(probe.health), quantiles(probe.produce)
        print(
            f"| {name} | {len(probe.health)} "
            f"| {ms(h[0])} / {ms(h[1])} / {ms(h[2])} "
            f"| {h[0] / base['health'][0]:.1f} / {h[1] / base['health'][1]:.1f} "
            f"| {ms(p[0])} / {ms(p[1])} / {ms(p[2])} "
            f"| {p[0] / base['produce'][0]:.1f} / {p[1] / base['produce'][1]:.1f} |"
        )
    print()
    if listing:
        print(
            f"GET /groups (all {GROUPS * PARTITIONS:,} partition rows, no limit): "
            f"{len(listing)} answers, median {statistics.median(listing):.2f} s"
        )
    print(
        f"DELETE /topics/big: answered in {ms(deletion[0])} ms, rows gone after {deletion[1]:.1f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply MESSAGES (default 1)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-stalls-"))
    proc = None
    try:
        setup_django(data_dir)
        data = build(args.scale)
        port = free_port()
        log_path = data_dir / "daphne.log"
        proc = start_daphne(port, log_path, background=True)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log_path)
        secret = str(data["secret"])
        phases = {"idle": idle_phase(url, secret)}
        phases["listing"], listing = listing_phase(url, secret)
        phases["deletion"], answered, total = deletion_phase(url, secret)
        report(data, phases, listing, (answered, total))
    finally:
        if proc is not None:
            stop_daphne(proc)
        if not os.environ.get("FERRY_BENCH_KEEP"):
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
