"""Delayed messages: release throughput, lateness under a real server, and the due scan's plan.

Run by `make bench` (scripts/bench), once on SQLite and once on PostgreSQL; not part of the test
suite (STYLE.md §6). One process does everything, on one machine and in one run, against the
database the environment names (the embedded SQLite under a temporary FERRY_DATA_DIR, or
DATABASE_URL as is):

1. release throughput: schedules 100,000 already-due messages (256-byte JSON values, a
   4-partition topic) through log.append_messages in batches of 1000, then times one
   scheduling.release_due() call in this process and checks the topic and the schedule; twice:
   with due times 1 ms apart (a backlog), then with one due time shared by all (a burst);
2. lateness: starts Daphne on 127.0.0.1 (a free port) with FERRY_BACKGROUND_IN_PROCESS=1, so its
   own scheduler thread releases, schedules 100,000 messages due evenly over the following
   ~20 s (after a margin that lets scheduling finish first), waits until all are released and
   reads them back: lateness = the stored timestamp_ms minus the due time carried in the value;
3. index check: the database's plan for the query release_due issues, with 100,000 rows
   scheduled (all due in 1, almost none due in 2), whether it uses scheduled_due_id_idx, and what
   the query alone costs (EXPLAIN ANALYZE on PostgreSQL, where nothing else runs then).

Daphne is stopped by its PID, always.

    .venv/bin/python bench/scheduler.py [--scale 0.1] [--profile]
"""

import argparse
import contextlib
import cProfile
import io
import math
import os
import platform
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

MESSAGES = 100_000
BATCH = 1000
PARTITIONS = 4
VALUE_BYTES = 256
# Phase 2: due times 200 µs apart (100,000 over 20 s), after a margin for scheduling them.
SPACING_US = 200
MIN_MARGIN_S = 15.0
# How long after the last due time the run waits for the server to release everything.
DRAIN_TIMEOUT_S = 90.0
TARGET_P99_MS = 1000
INDEX = "scheduled_due_id_idx"


def value_for(i: int, due: int) -> bytes:
    """A JSON object carrying the message's number and due time, padded to VALUE_BYTES."""
    bare = orjson.dumps({"i": i, "due": due, "pad": ""})
    value = orjson.dumps({"i": i, "due": due, "pad": "x" * (VALUE_BYTES - len(bare))})
    assert len(value) == VALUE_BYTES
    return value


def percentile(sorted_values: list[int], fraction: float) -> int:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def nproc() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# --- Scheduling through the core -------------------------------------------------------------


def schedule(topic: str, dues: list[int]) -> float:
    """Schedule one message per due time through log.append_messages; returns the seconds."""
    from broker.core import keys, log
    from broker.core.records import NewMessage

    started = time.perf_counter()
    for start in range(0, len(dues), BATCH):
        batch = [
            NewMessage(value_for(i, dues[i]), deliver_at_ms=dues[i])
            for i in range(start, min(start + BATCH, len(dues)))
        ]
        results = log.append_messages(keys.CONSOLE, topic, batch)
        if any(r.scheduled_id is None for r in results):
            raise RuntimeError("a delayed message was not scheduled")
        if start and start % (20 * BATCH) == 0:
            progress(f"  scheduled {start:,} of {len(dues):,}")
    return time.perf_counter() - started


def stored_count(topic: str) -> int:
    from django.db.models import F, Sum

    from broker import models

    total = models.Partition.objects.filter(topic__name=topic).aggregate(
        n=Sum(F("next_offset") - F("start_offset"))
    )["n"]
    return int(total or 0)


def scheduled_count(topic: str | None = None) -> int:
    from broker import models

    rows = models.ScheduledMessage.objects.all()
    if topic is not None:
        rows = rows.filter(topic__name=topic)
    return rows.count()


def read_back(topic: str) -> list[tuple[int, int, int]]:
    """(message number, due ms, stored timestamp_ms) of every message of the topic."""
    from broker.core import keys, log

    found = []
    for partition in range(PARTITIONS):
        offset: int | None = None
        while True:
            page = log.read_messages(keys.CONSOLE, topic, partition, offset, 10_000)
            for m in page.messages:
                body = orjson.loads(m.value)
                found.append((body["i"], body["due"], m.timestamp_ms))
            if page.next_offset >= page.end_offset:
                break
            offset = page.next_offset
    return found


# --- Phase 1: release throughput ------------------------------------------------------------


@dataclass
class Release:
    label: str
    schedule_s: float
    release_s: float
    released: int
    stored: int
    left: int
    plan: list[str]  # the claim query's SQL, then its plan, with everything due
    scan_ms: float  # the claim query alone, median of a few runs

    @property
    def msgs_per_s(self) -> float:
        return self.released / self.release_s


def release_phase(topic: str, label: str, dues: list[int], profile: bool) -> Release:
    from broker.core import log, scheduling

    count = len(dues)
    progress(f"release ({label}): scheduling {count:,} messages already due")
    schedule_s = schedule(topic, dues)
    progress(f"  {schedule_s:.1f} s ({count / schedule_s:,.0f} msgs/s)")
    plan = explain_due_scan(log.now_ms(), analyze=True)
    scan_ms = time_due_scan(log.now_ms())
    progress(f"release: scheduling.release_due() in this process (claim query {scan_ms:.1f} ms)")
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    released = scheduling.release_due()
    if profiler is not None:
        profiler.disable()
    release_s = time.perf_counter() - started
    progress(f"  {released:,} in {release_s:.1f} s ({released / release_s:,.0f} msgs/s)")
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue(), file=sys.stderr, flush=True)
    stored, left = stored_count(topic), scheduled_count()
    if stored != count or left != 0 or released != count:
        raise RuntimeError(
            f"after release_due: released {released}, topic holds {stored} of {count}, "
            f"{left} still scheduled"
        )
    return Release(label, schedule_s, release_s, released, stored, left, plan, scan_ms)


# --- Phase 3: the due scan's plan ------------------------------------------------------------


def due_scan_sql(now: int) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters of release_due's claim query. Caller holds a transaction."""
    from django.db import connection

    from broker import models

    queryset = (
        models.ScheduledMessage.objects.select_for_update(skip_locked=True)
        .filter(due_ms__lte=now)
        .order_by("due_ms", "id")[:BATCH]
    )
    sql, params = queryset.query.get_compiler(connection=connection).as_sql()
    return sql, tuple(params)


def explain_due_scan(now: int, analyze: bool = False) -> list[str]:
    """The claim query's SQL, then its plan lines.

    analyze (PostgreSQL only): run it too, in a transaction rolled back at once; only while no
    scheduler runs, since its row locks would make one skip the rows.
    """
    from django.db import connection, transaction

    with transaction.atomic(durable=True), connection.cursor() as cursor:
        sql, params = due_scan_sql(now)
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            lines = [str(row[-1]) for row in cursor.fetchall()]
        else:
            explain = "EXPLAIN (ANALYZE, BUFFERS) " if analyze else "EXPLAIN "
            cursor.execute(explain + sql, params)
            lines = [str(row[0]) for row in cursor.fetchall()]
            transaction.set_rollback(True)
    shown = re.sub(r"^SELECT .*? FROM", "SELECT <every column> FROM", sql)
    shown = shown.replace('"broker_scheduledmessage".', "")
    values = tuple(str(int(p)) if isinstance(p, int) else repr(p) for p in params)
    return [shown % values, *lines]


def time_due_scan(now: int, runs: int = 5) -> float:
    """Median ms of the claim query alone (rolled back, so nothing stays locked)."""
    from django.db import connection, transaction

    times = []
    for _ in range(runs):
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            sql, params = due_scan_sql(now)
            t0 = time.perf_counter()
            cursor.execute(sql, params)
            cursor.fetchall()
            times.append(time.perf_counter() - t0)
            transaction.set_rollback(True)
    return statistics.median(times) * 1000


# --- Phase 2: lateness under a real server ---------------------------------------------------


@dataclass
class Lateness:
    count: int
    margin_s: float
    schedule_s: float
    spread_s: float
    drain_s: float
    late_ms: list[int]  # ascending
    by_window: list[tuple[int, int, int]]  # (window start s, p99 ms, max ms)
    appends: int

    def p(self, fraction: float) -> int:
        return percentile(self.late_ms, fraction)

    @property
    def over_1s(self) -> int:
        return sum(1 for v in self.late_ms if v > 1000)


def due_by(first_due: int, count: int, now_ms: int) -> int:
    """How many of the phase's messages are due at now_ms."""
    if now_ms < first_due:
        return 0
    return min(count, (now_ms - first_due) * 1000 // SPACING_US + 1)


def wait_released(
    topic: str, count: int, first_due: int, proc: subprocess.Popen[bytes], log_path: Path
) -> None:
    """Poll the topic's end offsets until every message is stored (bounded)."""
    from broker.core import log

    last_due = first_due + (count - 1) * SPACING_US // 1000
    deadline = last_due + DRAIN_TIMEOUT_S * 1000
    next_report = 0
    while True:
        stored = stored_count(topic)
        if stored >= count:
            return
        now = log.now_ms()
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"daphne exited ({proc.returncode}):\n{tail}")
        if now > deadline:
            raise RuntimeError(
                f"only {stored:,} of {count:,} released {DRAIN_TIMEOUT_S:.0f} s after the last "
                "due time"
            )
        if now >= next_report:
            due = due_by(first_due, count, now)
            if due:
                progress(f"  released {stored:,} of {count:,}; {due:,} due by now")
            else:
                progress(f"  first due in {(first_due - now) / 1000:.1f} s")
            next_report = now + 2000
        time.sleep(0.2)


def lateness_phase(
    topic: str, count: int, margin_s: float, port: int, tmp: Path, vendor: str
) -> tuple[Lateness, list[str], int]:
    """Returns the figures, the due scan's plan with almost nothing due, and daphne's errors."""
    from django.db import connections

    from broker.core import log

    connections.close_all()
    log_path = tmp / "daphne.log"
    progress(f"lateness: starting daphne on 127.0.0.1:{port} (log {log_path})")
    proc = start_daphne(port, log_path, background=True)
    try:
        health = wait_healthy(f"http://127.0.0.1:{port}", proc, log_path)
        if health.get("database") != vendor:
            raise RuntimeError(f"server uses {health.get('database')}, bench uses {vendor}")
        progress(f"daphne is up (pid {proc.pid}); its scheduler thread is running")
        t0 = log.now_ms()
        first_due = t0 + round(margin_s * 1000)
        dues = [first_due + i * SPACING_US // 1000 for i in range(count)]
        spread_s = (dues[-1] - dues[0]) / 1000
        progress(
            f"lateness: scheduling {count:,} messages due from +{margin_s:.0f} s over "
            f"{spread_s:.0f} s"
        )
        schedule_s = schedule(topic, dues)
        progress(f"  {schedule_s:.1f} s ({count / schedule_s:,.0f} msgs/s)")
        if log.now_ms() >= first_due:
            progress("  WARNING: scheduling ran past the first due time; raise --margin")
        plan = explain_due_scan(log.now_ms())
        progress("lateness: waiting for the server to release them")
        wait_released(topic, count, first_due, proc, log_path)
        drain_s = (log.now_ms() - dues[-1]) / 1000
        progress(f"  all released {drain_s:.1f} s after the last due time")
    finally:
        stop_daphne(proc)
    errors = log_path.read_text(errors="replace").count("background job release_due failed")

    progress("lateness: reading the messages back")
    found = read_back(topic)
    numbers = {i for i, _, _ in found}
    if len(found) != count or len(numbers) != count:
        raise RuntimeError(f"read back {len(found)} messages ({len(numbers)} distinct) of {count}")
    if scheduled_count(topic):
        raise RuntimeError("messages are still scheduled after all were stored")
    late = sorted(ts - due for _, due, ts in found)
    windows: dict[int, list[int]] = {}
    for _, due, ts in found:
        windows.setdefault((due - first_due) // 5000 * 5, []).append(ts - due)
    by_window = []
    for start in sorted(windows):
        values = sorted(windows[start])
        by_window.append((start, percentile(values, 0.99), values[-1]))
    appends = len({ts for _, _, ts in found})
    result = Lateness(count, margin_s, schedule_s, spread_s, drain_s, late, by_window, appends)
    return result, plan, errors


# --- Report ----------------------------------------------------------------------------------


def plan_lines(title: str, plan: list[str]) -> list[str]:
    uses = any(INDEX in line for line in plan[1:])
    lines = [f"  {title}: uses {INDEX}: {'yes' if uses else 'NO'}"]
    lines += [f"      {line}" for line in plan[1:]]
    return lines


def report(
    header: list[tuple[str, str]],
    releases: list[Release],
    late: Lateness,
    plan_none_due: list[str],
    daphne_errors: int,
    interval_s: float,
) -> str:
    lines = ["", "Ferry bench: delayed messages (bench/scheduler.py)"]
    width = max(len(k) for k, _ in header)
    lines += [f"  {k.ljust(width)} : {v}" for k, v in header]
    n = releases[0].released
    columns = (
        f"  {'due times of the ' + format(n, ',') + ' messages':<36}{'scheduling':>11}"
        f"{'msgs/s':>9}{'release':>10}{'msgs/s':>9}{'claim query':>13}   check"
    )
    lines += [
        "",
        "1. Release throughput: one scheduling.release_due() call in the bench process (no server",
        f"   running), a transaction per batch of {BATCH}; scheduled before through",
        f"   log.append_messages, {BATCH} messages per call",
        columns,
        "  " + "-" * (len(columns) - 2),
    ]
    for r in releases:
        lines.append(
            f"  {r.label:<36}{r.schedule_s:>9.1f} s{n / r.schedule_s:>9,.0f}"
            f"{r.release_s:>8.2f} s{r.msgs_per_s:>9,.0f}{r.scan_ms:>10.1f} ms   "
            f"topic holds {r.stored:,}, {r.left} left scheduled: ok"
        )
    verdict = "ok" if late.p(0.99) <= TARGET_P99_MS else "MISSED"
    lines += [
        "  claim query: release_due's SELECT ... FOR UPDATE alone with every message due, median",
        "  of 5 runs, rolled back.",
        "",
        f"2. Lateness: Daphne's in-process scheduler (every {interval_s:g} s), "
        "lateness = stored timestamp_ms - due",
        f"  {late.count:,} messages due evenly over {late.spread_s:.1f} s "
        f"({late.count / max(late.spread_s, 0.001):,.0f}/s), the first {late.margin_s:.0f} s "
        f"after scheduling began; scheduling them took {late.schedule_s:.1f} s "
        f"({late.count / late.schedule_s:,.0f} msgs/s, beside the running server)",
        f"  lateness ms: p50 {late.p(0.50)}  p99 {late.p(0.99)}  max {late.late_ms[-1]}  "
        f"min {late.late_ms[0]};  late by > 1 s: {late.over_1s:,}   "
        f"target p99 <= {TARGET_P99_MS} ms: {verdict}",
        "  p99 / max ms by 5 s of due time: "
        + ", ".join(f"{s}-{s + 5} s: {p99}/{mx}" for s, p99, mx in late.by_window),
        f"  {late.appends:,} release appends ({late.count / late.appends:,.0f} messages each on "
        f"average); last message stored {late.drain_s:.1f} s after the last due time; "
        f"release_due errors in daphne's log: {daphne_errors}",
        "",
        "3. Due scan: the plan of release_due's claim query "
        + ("(EXPLAIN QUERY PLAN)" if "SEARCH" in " ".join(plan_none_due) else "(EXPLAIN)"),
        f"  {releases[0].plan[0]}",
    ]
    for r in releases:
        lines += plan_lines(f"{n:,} scheduled, all due, {r.label}", r.plan)
    lines += plan_lines(f"{late.count:,} scheduled, almost none due yet (phase 2)", plan_none_due)
    lines.append("")
    return "\n".join(lines)


def cleanup_topics(names: list[str]) -> None:
    from django.db import connections

    from broker.core import errors, keys, topics

    connections.close_all()
    for name in names:
        with contextlib.suppress(errors.TopicNotFound):
            topics.delete_topic(keys.CONSOLE, name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply the message counts (default 1.0)"
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        help="seconds from the start of scheduling to the first due time in phase 2 "
        f"(default: at least {MIN_MARGIN_S:.0f}, more if phase 1 scheduled slowly)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of phase 1's release on stderr"
    )
    args = parser.parse_args()
    # Make `kill` run the finally blocks below (Daphne is stopped by its PID there).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    count = max(BATCH, round(MESSAGES * args.scale))
    tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    ok = False
    names: list[str] = []
    try:
        progress(f"data dir {tmp}; migrating")
        setup_django(tmp)
        from django.db import connection

        from broker import settings as ferry_settings
        from broker.core import keys, topics

        vendor = connection.vendor
        database = database_description()
        if scheduled_count():
            raise RuntimeError("the database already holds scheduled messages; use an empty one")
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        release_topics = [f"bench-backlog-{stamp}", f"bench-burst-{stamp}"]
        late_topic = f"bench-late-{stamp}"
        for name in [*release_topics, late_topic]:
            topics.create_topic(keys.CONSOLE, name, PARTITIONS)
            names.append(name)

        from broker.core import log

        now = log.now_ms()
        cases = (
            # A backlog: one due time per message, the last a second ago.
            ("1 ms apart (a backlog)", [now - count - 1000 + i for i in range(count)]),
            # A burst: a batch sent with one delay shares its due time.
            ("all the same ms (a burst)", [now - 60_000] * count),
        )
        releases = [
            release_phase(topic, label, dues, args.profile)
            for topic, (label, dues) in zip(release_topics, cases, strict=True)
        ]
        margin = args.margin
        if margin is None:
            # Scheduling runs beside the server's scheduler in phase 2: leave it room.
            slowest = max(r.schedule_s for r in releases)
            margin = max(MIN_MARGIN_S, math.ceil(slowest * 1.5 + 3))
        late, plan_none_due, daphne_errors = lateness_phase(
            late_topic, count, margin, free_port(), tmp, vendor
        )

        interval_s = float(ferry_settings.get("SCHEDULER_INTERVAL_SECONDS"))
        header = [
            ("command", command_line()),
            ("database", f"{vendor}: {database}"),
            (
                "machine",
                f"nproc={nproc()}, {platform.system()} {platform.machine()}, "
                f"Python {platform.python_version()}",
            ),
            (
                "server",
                "phase 2: 1 Daphne process on 127.0.0.1, FERRY_BACKGROUND_IN_PROCESS=1, "
                f"FERRY_SCHEDULER_INTERVAL_SECONDS={interval_s:g}",
            ),
            (
                "message",
                f"value = JSON object {{i, due, pad}} of {VALUE_BYTES} bytes; no key or headers; "
                f"topics of {PARTITIONS} partitions (round robin)",
            ),
        ]
        print(report(header, releases, late, plan_none_due, daphne_errors, interval_s), flush=True)
        ok = True
        return 0
    finally:
        if names and os.environ.get("DATABASE_URL"):
            # The database outlives this run: leave no bench topics (or schedule) behind.
            progress("removing the bench topics")
            cleanup_topics(names)
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            progress(f"failed; kept {tmp} (daphne.log) for inspection")


if __name__ == "__main__":
    sys.exit(main())
