"""The `ferry` Spark data source against the broker's own REST paths, in one process and run.

Run by `make bench` (scripts/bench); not part of the test suite (STYLE.md §6). One process:

1. starts Daphne on 127.0.0.1 (a free port) against the database the environment names: the
   embedded SQLite under a temporary FERRY_DATA_DIR, or DATABASE_URL as is;
2. produces ROWS small JSON messages to a 2-partition topic with the Python client, batches of
   1000, one sequential producer: the broker's own produce rate; then tops the topic up to
   READ_ROWS messages in-process (core appends, untimed), so that Spark's fixed cost per query
   (planning in a Python process, about 0.5 s) does not hide its rate;
3. fetches them all back with the client, limit 10000: as JSON (`Reader.fetch`) and as Arrow
   (`Reader.fetch_arrow`), one sequential reader: the broker's own fetch rates;
4. starts a local[2] SparkSession and reads the topic through `format("ferry")` into Spark's
   `noop` sink (every row materialised, nothing written), best of 3, then writes ROWS
   generated rows to another 2-partition topic through the `ferry` sink (batchSize 1000);
5. prints the figures and the targets, then stops Spark and Daphne (always).

    .venv/bin/python bench/spark.py [--rows 200000] [--read-rows 1000000]
"""

import argparse
import json
import logging
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ferry_client import Message, Producer, Reader  # noqa: E402 -- after the path fix above

TARGET_READ_ROWS_S = 300_000
TARGET_WRITE_VS_PRODUCE = 0.8
PRODUCE_BATCH = 1000
FETCH_LIMIT = 10_000


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def value(i: int) -> dict[str, Any]:
    """A small order-like JSON value, about 60 bytes stored."""
    return {"order": i, "customer": f"c{i % 1000}", "total": 12.5, "ok": True}


def setup_django(data_dir: Path) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "mqsite.settings"
    os.environ["FERRY_DATA_DIR"] = str(data_dir)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    for name in ("httpx", "httpcore", "py4j"):
        logging.getLogger(name).setLevel(logging.WARNING)


def fixtures(stamp: str) -> str:
    from broker.core import keys, topics

    _, secret = keys.create_api_key(
        keys.CONSOLE, f"bench-spark-{stamp}", [keys.parse_permission("admin:*")]
    )
    for name in ("read", "write"):
        topics.create_topic(keys.CONSOLE, f"bench-spark-{name}-{stamp}", 2)
    return secret


def cleanup(stamp: str) -> None:
    from broker.core import keys, topics

    for name in ("read", "write"):
        topics.delete_topic(keys.CONSOLE, f"bench-spark-{name}-{stamp}")
    keys.revoke_api_key(keys.CONSOLE, f"bench-spark-{stamp}")


def start_daphne(port: int, log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, FERRY_BACKGROUND_IN_PROCESS="0")
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            [*command, "mqsite.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )


def wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 30
    while True:
        try:
            response = httpx.get(f"{url}/api/v1/health", timeout=1)
            if response.status_code == 200:
                return str(response.json()["database"])
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("daphne did not become healthy")
        time.sleep(0.1)


def rate(rows: int, seconds: float) -> float:
    return rows / seconds if seconds else 0.0


def timed(step: Callable[[], int]) -> tuple[int, float]:
    started = time.perf_counter()
    rows = step()
    return rows, time.perf_counter() - started


def client_produce(url: str, key: str, topic: str, rows: int) -> tuple[int, float]:
    with Producer(url, key) as producer:
        producer.send_batch(topic, [Message(value(-1))])  # warm-up: connection, first queries

        def step() -> int:
            for start in range(0, rows, PRODUCE_BATCH):
                count = min(PRODUCE_BATCH, rows - start)
                producer.send_batch(topic, [Message(value(start + n)) for n in range(count)])
            return rows

        return timed(step)


def top_up(topic: str, rows: int) -> None:
    """Append messages in-process until the topic holds rows (untimed set-up)."""
    import orjson

    from broker.core import keys, log, topics
    from broker.core.records import NewMessage

    info = topics.get_topic(keys.CONSOLE, topic)
    have = sum(p.end_offset for p in info.partitions)
    for start in range(have, rows, 5000):
        batch = [NewMessage(orjson.dumps(value(i))) for i in range(start, min(rows, start + 5000))]
        log.append_messages(keys.CONSOLE, topic, batch)


def client_fetch(url: str, key: str, topic: str, arrow: bool) -> tuple[int, float]:
    with Reader(url, key) as reader:

        def step() -> int:
            total = 0
            for p in reader.offsets(topic):
                offset = p.start_offset
                while offset < p.end_offset:
                    if arrow:
                        page = reader.fetch_arrow(topic, p.partition, offset, FETCH_LIMIT)
                        total += page.table.num_rows
                        offset = page.next_offset
                    else:
                        json_page = reader.fetch(topic, p.partition, offset, FETCH_LIMIT)
                        total += len(json_page.messages)
                        offset = json_page.next_offset
            return total

        reader.fetch(topic, 0, 0, 10)  # warm-up
        return timed(step)


def spark_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    from pyspark.sql import SparkSession

    import pipeline

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("ferry-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    pipeline.register(spark)
    return spark


def spark_read(spark: Any, options: dict[str, str], topic: str, rows: int) -> tuple[int, float]:
    """Best of 3 full reads into the noop sink."""
    df = spark.read.format("ferry").options(**options, topic=topic).load()
    # Warm-up: Python workers, imports, the first plan.
    few = json.dumps({topic: {"0": 10, "1": 10}})
    spark.read.format("ferry").options(**options, topic=topic, endingOffsets=few).load().collect()

    def step() -> int:
        df.write.format("noop").mode("overwrite").save()
        return rows

    return min((timed(step) for _ in range(3)), key=lambda run: run[1])


def spark_write(spark: Any, options: dict[str, str], topic: str, rows: int) -> tuple[int, float]:
    def frame(count: int, start: int) -> Any:
        return spark.range(start, start + count, numPartitions=2).selectExpr(
            "to_json(named_struct('order', id, 'customer', concat('c', id % 1000), "
            "'total', 12.5, 'ok', true)) AS value_json"
        )

    sink = {**options, "topic": topic, "batchSize": str(PRODUCE_BATCH)}
    frame(2000, -2000).write.format("ferry").options(**sink).mode("append").save()  # warm-up
    df = frame(rows, 0).cache()
    df.count()  # the rows exist before the clock starts: the sink is measured, not range()

    def step() -> int:
        df.write.format("ferry").options(**sink).mode("append").save()
        return rows

    try:
        return timed(step)
    finally:
        df.unpersist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="produced and written")
    parser.add_argument("--read-rows", type=int, default=1_000_000, help="fetched and read")
    args = parser.parse_args()
    rows, read_rows = args.rows, max(args.rows, args.read_rows)

    with tempfile.TemporaryDirectory(prefix="ferry-bench-spark-") as tmp:
        setup_django(Path(tmp))
        stamp = str(int(time.time()))
        key = fixtures(stamp)
        read_topic, write_topic = f"bench-spark-read-{stamp}", f"bench-spark-write-{stamp}"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_daphne(port, Path(tmp) / "daphne.log")
        spark = None
        try:
            database = wait_healthy(url, proc)
            progress(f"daphne pid {proc.pid} on {url} ({database}); producing {rows} rows")
            produced = client_produce(url, key, read_topic, rows)
            top_up(read_topic, read_rows + 1)
            progress("fetching over REST: JSON, then Arrow")
            fetched_json = client_fetch(url, key, read_topic, arrow=False)
            fetched_arrow = client_fetch(url, key, read_topic, arrow=True)
            progress("starting Spark")
            spark = spark_session()
            options = {"url": url, "apiKey": key}
            read = spark_read(spark, options, read_topic, read_rows + 1)
            progress("writing through the ferry sink")
            written = spark_write(spark, options, write_topic, rows)
        finally:
            if spark is not None:
                spark.stop()
            progress(f"stopping daphne (pid {proc.pid})")
            proc.terminate()
            proc.wait(timeout=10)
        cleanup(stamp)

    produce_rate = rate(*produced)
    read_rate, write_rate = rate(*read), rate(*written)
    print(
        f"bench/spark.py: {rows} rows produced and written, {read_rows + 1} fetched and read; "
        f"~60-byte JSON values, 2 partitions, {database}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(f"{'path':<56} {'rows':>8} {'s':>7} {'rows/s':>10}")
    for name, (count, seconds) in (
        ("client produce, batch 1000 (sequential)", produced),
        ("client fetch JSON, limit 10000 (sequential)", fetched_json),
        ("client fetch Arrow, limit 10000 (sequential)", fetched_arrow),
        ("Spark batch read (ferry -> noop, local[2]), best of 3", read),
        ("Spark batch write (ferry sink, batchSize 1000)", written),
    ):
        print(f"{name:<56} {count:>8} {seconds:>7.2f} {rate(count, seconds):>10,.0f}")
    read_ok = "met" if read_rate >= TARGET_READ_ROWS_S else "MISSED"
    ratio = write_rate / produce_rate if produce_rate else 0.0
    write_ok = "met" if ratio >= TARGET_WRITE_VS_PRODUCE else "MISSED"
    print(f"target: Spark read >= {TARGET_READ_ROWS_S:,} rows/s: {read_rate:,.0f} ({read_ok})")
    print(
        f"target: Spark write >= {TARGET_WRITE_VS_PRODUCE}x client produce: "
        f"{ratio:.2f}x ({write_ok})"
    )


if __name__ == "__main__":
    main()
