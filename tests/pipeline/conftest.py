"""Fixtures for the pipeline tests: one SparkSession for the run, a real broker and its key.

The Spark tests (marked `spark`) share ONE local SparkSession: a JVM costs seconds to start
(docs/pipeline.md, "How it runs"). Its Python workers are separate processes: they run this
venv's interpreter (PYSPARK_PYTHON) with the checkout on PYTHONPATH, and reach Ferry over HTTP.
"""

import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from broker.core import keys, log, records
from tests.integration.conftest import broker_url, tls_broker

__all__ = ["broker_url", "tls_broker"]

ROOT = Path(__file__).resolve().parents[2]


def spark_env() -> None:
    """What Spark's worker processes inherit (set before the JVM starts)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)


@pytest.fixture(scope="session")
def spark() -> Iterator["object"]:
    """A local[2,2] SparkSession tuned for tests on a 2-core machine, with `ferry` registered."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17: run scripts/java ensure (make test does)")
    spark_env()
    # py4j logs at INFO from __del__ at exit, after pytest has closed the captured streams.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.sql import SparkSession

    import pipeline

    session = (
        # 2 threads; a failed task is tried again once (local[N] alone never retries), so a
        # test can force a task retry.
        SparkSession.builder.master("local[2,2]")
        .appName("ferry-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        # Short-lived test JVM: the C1 compiler and serial GC start faster (not for benchmarks).
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pipeline.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def ferry_key(db) -> str:
    """An admin:* key's secret (the tests create, read and write topics)."""
    _, secret = keys.create_api_key(
        keys.CONSOLE, "pipeline-tests", [keys.parse_permission("admin:*")]
    )
    return secret


@pytest.fixture
def stamped_message_factory(db) -> Callable[[str, Mapping[int, Sequence[int]]], None]:
    """Stores JSON messages with the producer timestamps given (REST's `timestamp_ms`), per
    partition in offset order: `{partition: [timestamp_ms, ...]}`."""

    def store(topic: str, stamps: Mapping[int, Sequence[int]]) -> None:
        messages = [
            records.NewMessage(
                json.dumps({"at_ms": at_ms}).encode(), partition=p, timestamp_ms=at_ms
            )
            for p, times in stamps.items()
            for at_ms in times
        ]
        log.append_messages(keys.CONSOLE, topic, messages)

    return store
