"""What every pipeline job shares: its Spark session, the broker arguments, times on the CLI.

Each job is a module with `main(argv)`, run as `python -m pipeline.jobs.<name>`, as
`python manage.py pipeline <name>` or with `spark-submit` (docs/pipeline.md#jobs).
"""

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]

# Spark's masters that run every task on this machine: local, local[*], local[N], and the
# same with a task retry count (local[N,F]).
LOCAL_MASTER = re.compile(r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?")


def add_broker_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=os.environ.get("FERRY_URL"), help="broker base URL (env FERRY_URL)"
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("FERRY_KEY"), help="Ferry API key (env FERRY_KEY)"
    )


def check_broker_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.url:
        parser.error("give the broker URL: --url or FERRY_URL")
    if not args.api_key:
        parser.error("give an API key: --api-key or FERRY_KEY")


def broker_options(args: argparse.Namespace, **more: Any) -> dict[str, str]:
    """The `ferry` data source options for these arguments."""
    given = {"url": args.url, "apiKey": args.api_key, **more}
    return {name: str(value) for name, value in given.items() if value is not None}


def time_ms(text: str) -> int:
    """Milliseconds since the epoch from digits, or from an ISO 8601 time (UTC if no zone)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601, e.g. 2026-11-23T14:00, or epoch milliseconds)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def worker_python(environ: Mapping[str, str], master: str) -> str | None:
    """The PYSPARK_PYTHON to set for a job's Python workers, or None to leave it alone.

    This interpreter only when none is set and the master is local: a cluster's executors
    may not have this path, and take the user's PYSPARK_PYTHON (or Spark's `python3`).
    """
    if "PYSPARK_PYTHON" in environ or not LOCAL_MASTER.fullmatch(master.strip()):
        return None
    return sys.executable


def session(app_name: str) -> "SparkSession":
    """The job's SparkSession, with `ferry` registered.

    Under spark-submit the master and confs are spark-submit's; run directly, it is
    `local[*]`, with this interpreter and this checkout for the Python workers.
    """
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    import pipeline

    # The JVM first (spark-submit's, or one started here), so that its master is known;
    # SparkContext reads PYSPARK_PYTHON after that, when it starts.
    SparkContext._ensure_initialized()
    python = worker_python(os.environ, SparkConf().get("spark.master", "local[*]"))
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python

    spark = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    pipeline.register(spark)
    return spark


def run_main(
    name: str,
    parse: Callable[[Sequence[str] | None], argparse.Namespace],
    run: Callable[[Any, Sequence[str] | None], int],
    argv: Sequence[str] | None,
) -> int:
    """A job's main(): its arguments checked before a JVM starts, then run in its own session."""
    parse(argv)
    spark = session(f"ferry-{name}")
    try:
        run(spark, argv)
    finally:
        spark.stop()
    return 0


def say(text: str) -> None:
    """A progress or summary line, at once (Spark's own output is on stderr)."""
    print(text, flush=True)


def follow(query: Any, what: str, poll_s: float = 0.2) -> list[dict[str, Any]]:
    """Print a line per micro-batch of a streaming query until it ends; its progress reports."""
    import time

    seen: set[int] = set()
    reports: list[dict[str, Any]] = []

    def report_new() -> None:
        for progress in query.recentProgress:
            if progress["batchId"] in seen:
                continue
            seen.add(progress["batchId"])
            reports.append(progress)
            rows = progress["numInputRows"]
            if rows:
                rate = progress.get("processedRowsPerSecond") or 0.0
                say(f"{what}: batch {progress['batchId']}: {rows} messages ({rate:,.0f}/s)")

    while query.isActive:
        report_new()
        time.sleep(poll_s)
    report_new()
    query.awaitTermination()  # raises the query's failure, if it failed
    return reports
