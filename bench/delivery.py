"""Acknowledged delivery over REST (consume and ack) and the scheduler's release throughput.

Run by `make bench` (scripts/bench), once on SQLite and once on PostgreSQL; not part of the test
suite (STYLE.md §6). One process does everything, on one machine and in one run, against the
database the environment names (the embedded SQLite under a temporary FERRY_DATA_DIR, or
DATABASE_URL as is):

1. starts Daphne on 127.0.0.1 (a free port, background jobs off) and produces 100,000 256-byte
   messages to a 4-partition topic over REST, 1000 per request from 4 client threads;
2. consume and ack, for a group of 1 member and then a fresh group of 4: every member joins
   (POST /groups/{g}/members), then all start together, each on its own thread and keep-alive
   connection, and loop: POST /groups/{g}/poll with its member_id and max_messages=1000, then
   POST /groups/{g}/ack with the receipts, until a poll hands out nothing; checks every message
   was acked exactly once and that GET /groups/{g} shows lag 0 and nothing in flight;
3. stops Daphne (by its PID, always), then schedules 100,000 already-due messages and times one
   scheduling.release_due() call in this process (bench/scheduler.py's release phase).

    .venv/bin/python bench/delivery.py [--scale 0.2] [--batch 1000]
"""

import argparse
import functools
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from produce_fetch import (
    Phase,
    cleanup_fixtures,
    command_line,
    concurrent_produce_phase,
    database_description,
    free_port,
    progress,
    run_together,
    setup_django,
    start_daphne,
    stop_daphne,
    wait_healthy,
)
from scheduler import PARTITIONS, Release, nproc, release_phase

MESSAGES = 100_000
PRODUCE_BATCH = 1000
PRODUCE_CLIENTS = 4
POLL_BATCH = 1000
GROUP_SIZES = (1, 4)


@dataclass
class Member:
    """One consumer's run: what it acked, how long it took, and its request latencies."""

    member_id: str
    partitions: list[int] = field(default_factory=list)
    acked: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset)
    seconds: float = 0.0
    poll_s: list[float] = field(default_factory=list)
    ack_s: list[float] = field(default_factory=list)

    @property
    def msgs_per_s(self) -> float:
        return len(self.acked) / self.seconds


@dataclass
class Consume:
    group: str
    batch: int  # max_messages per poll
    members: list[Member]
    seconds: float  # from the common start until the last member is done

    @property
    def messages(self) -> int:
        return sum(len(m.acked) for m in self.members)

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    def p50_ms(self, attribute: str) -> float:
        return statistics.median(t for m in self.members for t in getattr(m, attribute)) * 1000


def checked(response: httpx.Response, what: str) -> Any:
    if response.status_code not in (200, 201):
        raise RuntimeError(f"{what} failed: {response.status_code} {response.text[:500]}")
    return orjson.loads(response.content)


def consume_and_ack(
    client: httpx.Client, group: str, topic: str, member: Member, batch: int
) -> None:
    """Poll and ack until a poll hands out nothing; every ack must settle all it names."""
    poll = orjson.dumps({"topic": topic, "member_id": member.member_id, "max_messages": batch})
    started = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        messages = checked(client.post(f"/api/v1/groups/{group}/poll", content=poll), "poll")[
            "messages"
        ]
        t1 = time.perf_counter()
        member.poll_s.append(t1 - t0)
        if not messages:
            break
        receipts = [m["receipt"] for m in messages]
        body = orjson.dumps({"receipts": receipts})
        settled = checked(client.post(f"/api/v1/groups/{group}/ack", content=body), "ack")
        member.ack_s.append(time.perf_counter() - t1)
        if settled["settled"] != len(receipts) or settled["stale"]:
            raise RuntimeError(f"ack settled {settled['settled']} of {len(receipts)}: {settled}")
        member.acked.extend((m["partition"], m["offset"]) for m in messages)
    member.seconds = time.perf_counter() - started


def consume_phase(
    url: str, headers: dict[str, str], topic: str, group: str, size: int, batch: int, total: int
) -> Consume:
    """size members join group, then consume the whole topic together; checked at the end."""
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        members = [
            Member(
                checked(
                    client.post(f"/api/v1/groups/{group}/members", json={"topic": topic}), "join"
                )["member_id"]
            )
            for _ in range(size)
        ]
        # Joins rebalance at once: read the final assignment once everyone is in.
        held = {
            m["member_id"]: m["partitions"]
            for m in checked(client.get(f"/api/v1/groups/{group}"), "describe")["members"]
        }
    for m in members:
        m.partitions = held[m.member_id]
    failures: list[str] = []

    def work(member: Member) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as member_client:
            barrier.wait()
            try:
                consume_and_ack(member_client, group, topic, member, batch)
            except Exception as exc:  # reported by the main thread
                failures.append(f"{member.member_id}: {exc}")

    barrier = threading.Barrier(size + 1)
    seconds = run_together([functools.partial(work, m) for m in members], barrier)
    if failures:
        raise RuntimeError(f"consume failed: {failures[0]}")
    result = Consume(group, batch, members, seconds)
    check_consumed(url, headers, result, total)
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        for m in members:
            client.delete(f"/api/v1/groups/{group}/members/{m.member_id}").raise_for_status()
    return result


def check_consumed(url: str, headers: dict[str, str], result: Consume, total: int) -> None:
    """Every message acked once, and the group's committed offsets at the end offsets."""
    distinct = len({pair for m in result.members for pair in m.acked})
    if result.messages != total or distinct != total:
        raise RuntimeError(f"acked {result.messages} ({distinct} distinct) of {total} messages")
    info = checked(httpx.get(f"{url}/api/v1/groups/{result.group}", headers=headers), "describe")
    (offsets,) = info["topics"]
    partitions = offsets["partitions"]
    behind = [p for p in partitions if p["committed_offset"] != p["end_offset"] or p["lag"]]
    in_flight = sum(p["in_flight"] for p in partitions)
    if behind or offsets["lag"] or offsets["committed_offset"] != total or in_flight:
        raise RuntimeError(f"after consuming, group {result.group} shows {offsets}")


# --- Report ----------------------------------------------------------------------------------


def report(
    header: list[tuple[str, str]], produce: Phase, consumes: list[Consume], release: Release
) -> str:
    lines = ["", "Ferry bench: acknowledged delivery and release (bench/delivery.py)"]
    width = max(len(k) for k, _ in header)
    lines += [f"  {k.ljust(width)} : {v}" for k, v in header]
    total = consumes[0].messages
    lines += [
        "",
        f"1. Produce: {produce.messages:,} messages, {PRODUCE_BATCH} per request from "
        f"{PRODUCE_CLIENTS} clients (after a batch each to warm up): {produce.seconds:.1f} s, "
        f"{produce.msgs_per_s:,.0f} msgs/s",
        "",
        f"2. Consume and ack over REST: {total:,} messages, poll "
        f"max_messages={consumes[0].batch}, then ack the receipts;",
        "   each member on its own thread and connection, all started together",
    ]
    columns = (
        f"  {'members':<10}{'seconds':>9}{'msgs/s':>10}{'poll p50 ms':>13}{'ack p50 ms':>12}"
        "   per member: msgs/s (partitions)"
    )
    lines += [columns, "  " + "-" * (len(columns) - 2)]
    for c in consumes:
        each = ", ".join(
            f"{m.msgs_per_s:,.0f} ({','.join(map(str, m.partitions))})" for m in c.members
        )
        lines.append(
            f"  {len(c.members):<10}{c.seconds:>9.2f}{c.msgs_per_s:>10,.0f}"
            f"{c.p50_ms('poll_s'):>13.1f}{c.p50_ms('ack_s'):>12.1f}   {each}"
        )
    lines += [
        "  check: every message acked exactly once; GET /groups/{g}: committed = end offsets, lag",
        "  0, nothing in flight: ok",
        "",
        f"3. Release: {release.released:,} scheduled messages, all due (due times 1 ms apart),",
        "   moved by one scheduling.release_due() call in the bench process (no server running):",
        f"   {release.release_s:.2f} s, {release.msgs_per_s:,.0f} msgs/s; topic holds "
        f"{release.stored:,}, {release.left} left scheduled: ok",
        f"   (scheduling them through log.append_messages took {release.schedule_s:.1f} s, "
        f"{release.released / release.schedule_s:,.0f} msgs/s)",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply the message counts (default 1.0)"
    )
    parser.add_argument(
        "--batch", type=int, default=POLL_BATCH, help=f"max_messages per poll ({POLL_BATCH})"
    )
    args = parser.parse_args()
    # Make `kill` run the finally blocks below (Daphne is stopped by its PID there).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    # Each producer thread also sends one untimed warm-up batch: they make up the total.
    total = max(2 * PRODUCE_CLIENTS, round(MESSAGES * args.scale / PRODUCE_BATCH)) * PRODUCE_BATCH
    requests = total // PRODUCE_BATCH - PRODUCE_CLIENTS
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    ok = False
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    names: list[str] = []
    # Other work on a shared machine moves these figures: say how busy it was.
    load_before = os.getloadavg()[0]
    try:
        progress(f"data dir {tmp}; migrating")
        setup_django(tmp)
        from django.db import connection, connections

        from broker.core import keys, log, topics

        vendor = connection.vendor
        database = database_description()
        _, secret = keys.create_api_key(
            keys.CONSOLE, f"bench-{stamp}", [keys.parse_permission("admin:*")]
        )
        topic, release_topic = f"bench-deliver-{stamp}", f"bench-release-{stamp}"
        for name in (topic, release_topic):
            topics.create_topic(keys.CONSOLE, name, PARTITIONS)
            names.append(name)
        connections.close_all()

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        log_path = tmp / "daphne.log"
        progress(f"starting daphne on 127.0.0.1:{port} (log {log_path})")
        proc = start_daphne(port, log_path)
        try:
            health = wait_healthy(url, proc, log_path)
            if health.get("database") != vendor:
                raise RuntimeError(f"server uses {health.get('database')}, bench uses {vendor}")
            progress(f"daphne is up (pid {proc.pid})")
            progress(f"produce: {requests} requests of {PRODUCE_BATCH} from {PRODUCE_CLIENTS}")
            produce = concurrent_produce_phase(
                url, headers, topic, PRODUCE_BATCH, requests, PRODUCE_CLIENTS
            )
            progress(f"  {produce.msgs_per_s:,.0f} msgs/s; {total:,} messages stored")
            consumes = []
            for size in GROUP_SIZES:
                progress(f"consume and ack: {size} member(s), max_messages={args.batch}")
                group = f"bench-{size}-{stamp}"
                consumes.append(consume_phase(url, headers, topic, group, size, args.batch, total))
                progress(f"  {consumes[-1].msgs_per_s:,.0f} msgs/s; checked")
        finally:
            stop_daphne(proc)

        connections.close_all()
        now = log.now_ms()
        dues = [now - total - 1000 + i for i in range(total)]
        release = release_phase(release_topic, "1 ms apart (a backlog)", dues, profile=False)

        header = [
            ("command", command_line()),
            ("database", f"{vendor}: {database}"),
            (
                "machine",
                f"nproc={nproc()}, {platform.system()} {platform.machine()}, "
                f"Python {platform.python_version()}; 1-minute load average "
                f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
            ),
            ("server", f"1 Daphne process on 127.0.0.1:{port}, FERRY_BACKGROUND_IN_PROCESS=0"),
            (
                "message",
                "256-byte JSON values, no key or headers; a topic of "
                f"{PARTITIONS} partitions (round robin); groups in clustering mode",
            ),
        ]
        print(report(header, produce, consumes, release), flush=True)
        ok = True
        return 0
    finally:
        if names and os.environ.get("DATABASE_URL"):
            # The database outlives this run: leave no bench topics or usable key behind.
            progress("removing the bench topics and revoking the bench key")
            connections.close_all()
            cleanup_fixtures(stamp, names)
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            progress(f"failed; kept {tmp} (daphne.log) for inspection")


if __name__ == "__main__":
    sys.exit(main())
