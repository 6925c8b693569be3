"""The pipeline jobs in the shared SparkSession against a real broker: archive, replay, stats."""

import json
import time

import pytest

from broker.core import groups, history, keys, topics
from ferry_client import Message, Producer
from pipeline.jobs import archive, replay, stats

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


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
