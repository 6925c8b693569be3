"""The pipeline jobs in the shared SparkSession against a real broker: archive, then replay."""

import pytest

from broker.core import keys, topics
from ferry_client import Message, Producer
from pipeline.jobs import archive, replay

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
