"""The pipeline jobs in the shared SparkSession against a real broker: archive, replay, stats."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from broker.core import groups, history, keys, topics
from ferry_client import Message, Producer
from pipeline.jobs import archive, replay, stats

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def at_ms(text):
    """Milliseconds since the epoch of an ISO time in UTC."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def archived(spark, output):
    """The archive's (partition, offset, date) rows, sorted."""
    rows = spark.read.parquet(output).selectExpr("partition", "offset", "CAST(date AS STRING) d")
    return sorted((r.partition, r.offset, r.d) for r in rows.collect())


def contents(spark, url, key, topic):
    """The messages of a topic as comparable tuples, without their coordinates."""
    df = spark.read.format("ferry").options(url=url, apiKey=key, topic=topic).load()
    return sorted(
        (r.key, r.tag, tuple(sorted(r.headers.items())), bytes(r.value), r.value_json)
        for r in df.collect()
    )


def test_archive_then_replay__reproduces_the_messages(
    spark, broker_url, ferry_key, tmp_path, capsys
):
    topics.create_topic(keys.CONSOLE, "src", 2)
    topics.create_topic(keys.CONSOLE, "dst", 2)
    broker = ["--url", broker_url, "--api-key", ferry_key]
    output = str(tmp_path / "archive")
    with Producer(broker_url, ferry_key) as producer:
        producer.send_batch(
            "src",
            [Message({"n": i}, key=f"k{i % 4}", tag="t", headers={"i": str(i)}) for i in range(30)]
            + [Message(b"\xff\x00", key="raw")],
        )

    assert archive.run(spark, [*broker, "--topic", "src", "--output", output]) == 31
    with Producer(broker_url, ferry_key) as producer:
        producer.send_batch("src", [Message({"n": i}, key="late") for i in range(30, 40)])
    # Incremental: the second run archives only what came since.
    assert archive.run(spark, [*broker, "--topic", "src", "--output", output]) == 10
    archived = spark.read.parquet(output)
    assert archived.count() == 41
    assert {r.date for r in archived.select("date").distinct().collect()} != set()

    replayed = [*broker, "--input", output, "--topic", "src", "--to-topic", "dst"]
    assert replay.run(spark, replayed) == 41
    assert replay.run(spark, replayed) == 41  # again: same ids, nothing stored twice

    assert contents(spark, broker_url, ferry_key, "dst") == contents(
        spark, broker_url, ferry_key, "src"
    )
    out = capsys.readouterr().out
    assert "archive: batch 0: 31 messages" in out
    assert "replay: done: 41 messages produced to dst" in out


def test_stats__per_minute_written_back(spark, broker_url, ferry_key, capsys):
    topics.create_topic(keys.CONSOLE, "clicks", 2)
    topics.create_topic(keys.CONSOLE, "ferry-stats", 1)
    keys_sent = ["a"] * 5 + ["b"] * 3 + ["c"] * 2 + ["d"]
    with Producer(broker_url, ferry_key) as producer:
        producer.send_batch("clicks", [Message("x" * 10, key=k) for k in keys_sent])
    # A group that has read nothing yet: its consume delay is the oldest message's wait.
    groups.commit_offsets(keys.CONSOLE, "clicks-readers", "clicks", {0: 0, 1: 0})
    history.sample_metrics()
    sampled_minute = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    broker = ["--url", broker_url, "--api-key", ferry_key, "--topic", "clicks"]

    assert stats.run(spark, broker) >= 1
    assert stats.run(spark, broker) >= 1  # unchanged data: the same ids, nothing new

    out = capsys.readouterr().out
    written = (
        spark.read.format("ferry")
        .options(url=broker_url, apiKey=ferry_key, topic="ferry-stats")
        .load()
    )
    figures = [json.loads(r.value_json) for r in written.collect()]
    assert sum(f["messages"] for f in figures) == 11
    if len(figures) == 1:  # all in one minute (the usual case)
        [f] = figures
        assert (f["bytes"], f["distinct_keys"]) == (11 * 12, 4)
        assert f["top_keys"] == [
            {"key": "a", "count": 5},
            {"key": "b", "count": 3},
            {"key": "c", "count": 2},
        ]
        assert "top: a=5, b=3, c=2" in out
        if f["minute"] == sampled_minute:  # the sample fell in the messages' minute
            [readers] = f["groups"]
            assert (readers["group"], readers["lag"]) == ("clicks-readers", 11)
            assert readers["consume_delay_ms"] >= 0
    assert "stats: done:" in out


def test_archive__once_copies_a_time_range(
    spark, broker_url, ferry_key, stamped_message_factory, tmp_path, capsys
):
    topics.create_topic(keys.CONSOLE, "ledger", 2)
    midnight = at_ms("2026-11-23T00:00")
    stamped_message_factory(
        "ledger",
        {
            0: [midnight - 2000, midnight - 1, midnight, midnight + 1000],
            1: [midnight - 1500, midnight + 500, midnight + 2000],
        },
    )
    output = str(tmp_path / "archive")
    once = ["--url", broker_url, "--api-key", ferry_key, "--topic", "ledger", "--output", output]
    # From an ISO time (included) until epoch milliseconds (excluded).
    window = ["--from-time", "2026-11-22T23:59:59", "--until-time", str(midnight + 1000)]

    assert archive.run(spark, [*once, "--mode", "once", *window]) == 3

    # Dated by each message's UTC day; a batch copy keeps no checkpoint.
    assert archived(spark, output) == [
        (0, 1, "2026-11-22"),
        (0, 2, "2026-11-23"),
        (1, 1, "2026-11-23"),
    ]
    assert not (tmp_path / "archive" / "_checkpoints").exists()
    out = capsys.readouterr().out
    assert "archive: ledger/0: offsets 1..2, 2 messages" in out
    assert "archive: ledger/1: offsets 1..1, 1 messages" in out


def test_archive__continuous_keeps_archiving_until_stopped(
    spark, broker_url, ferry_key, stamped_message_factory, tmp_path, capsys
):
    """No option ends a continuous run: it is stopped as a streaming query is."""
    topics.create_topic(keys.CONSOLE, "feed", 1)
    stamped_message_factory("feed", {0: [1000, 2000]})
    output = str(tmp_path / "archive")
    args = ["--url", broker_url, "--api-key", ferry_key, "--topic", "feed", "--output", output]
    # --from-time is the stream's startingTimestamp: offset 0 (at 1000) is left out.
    args += ["--mode", "continuous", "--interval-seconds", "0.2", "--from-time", "1500"]

    def archived_rows(query):
        return sum(p["numInputRows"] for p in query.recentProgress)

    def wait_for(run, what, ready):
        deadline = time.monotonic() + 60
        while not (found := ready()):
            if run.done():
                run.result()  # the job's failure, if it failed
                pytest.fail(f"archive ended before {what}")
            assert time.monotonic() < deadline, f"no {what} within 60 s"
            time.sleep(0.1)
        return found

    query = None
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(archive.run, spark, args)
        try:
            query = wait_for(
                run,
                "query",
                lambda: next(
                    (q for q in spark.streams.active if q.name == "ferry-archive-feed"), None
                ),
            )
            wait_for(run, "first batch", lambda: archived_rows(query) >= 1)
            # Still running: what arrives later is archived by a later micro-batch.
            with Producer(broker_url, ferry_key) as producer:
                producer.send_batch("feed", [Message({"late": i}) for i in range(3)])
            wait_for(run, "later batch", lambda: archived_rows(query) >= 4)
            assert not run.done()
        finally:
            if query is not None:
                query.stop()
            else:
                for active in spark.streams.active:
                    active.stop()
        assert run.result(timeout=60) == 4

    assert [(p, o) for p, o, _ in archived(spark, output)] == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert (tmp_path / "archive" / "_checkpoints" / "feed").is_dir()
    out = capsys.readouterr().out
    assert 'archive: offsets now {"feed": {"0": 5}}' in out
    assert "archive: done: 4 messages of feed archived to" in out


def test_stats__from_and_until_time_select_the_minutes(
    spark, broker_url, ferry_key, stamped_message_factory, capsys
):
    topics.create_topic(keys.CONSOLE, "taps", 2)
    ten = at_ms("2026-11-23T10:00")
    minute = 60_000
    stamped_message_factory(
        "taps",
        {
            0: [ten + minute - 1, ten + minute, ten + minute + 30_000, ten + 2 * minute],
            1: [ten + 30_000, ten + 2 * minute - 1, ten + 2 * minute + 1],
        },
    )
    broker = ["--url", broker_url, "--api-key", ferry_key, "--topic", "taps", "--no-write"]
    # 10:01:00.000 is included, 10:02:00.000 is not.
    window = ["--from-time", "2026-11-23T10:01", "--until-time", str(ten + 2 * minute)]

    assert stats.run(spark, [*broker, *window]) == 1

    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.startswith("stats: taps ")]
    assert line.startswith("stats: taps 2026-11-23 10:01: 3 messages,")
    assert "stats: done: 1 topic-minutes of taps printed" in out
