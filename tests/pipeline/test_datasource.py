"""The `ferry` data source in a real SparkSession against a real broker (Daphne on the test DB).

Few tests, each proving several things: every Spark query costs a fraction of a second and
the session seconds (docs/pipeline.md#how-it-runs-for-maintainers).
"""

import base64
import json
import re
import time

import pytest

from broker.core import keys, topics
from ferry_client import Admin, Message, Producer, Reader

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def make_topic(name, partitions=1):
    topics.create_topic(keys.CONSOLE, name, partitions)


def produce(url, key, topic, messages):
    with Producer(url, key) as producer:
        for start in range(0, len(messages), 1000):
            producer.send_batch(topic, messages[start : start + 1000])


def options(url, key, topic, **more):
    return {"url": url, "apiKey": key, "topic": topic, **{k: str(v) for k, v in more.items()}}


def rest_rows(url, key, topic, partition, start, end):
    """The messages start..end of a partition as the JSON fetch has them, in the data
    source's columns."""
    with Reader(url, key) as reader:
        page = reader.fetch(topic, partition, start, end - start)
    out = []
    for m in page.messages:
        is_json = "value" in m
        value = json.dumps(m["value"]) if is_json else None
        raw = base64.b64decode(m["value_b64"]) if not is_json else None
        out.append(
            (topic, m["partition"], m["offset"], m["key"], m["tag"], m["headers"], raw, value)
        )
    return out


def spark_rows(df):
    out = []
    for r in df.orderBy("partition", "offset").collect():
        value_json = json.dumps(json.loads(r.value_json)) if r.value_json is not None else None
        raw = bytes(r.value) if r.value_json is None else None
        out.append((r.topic, r.partition, r.offset, r.key, r.tag, dict(r.headers), raw, value_json))
    return out


def test_batch_read__range_equals_rest_fetch(spark, broker_url, ferry_key):
    make_topic("events", 2)
    produce(
        broker_url,
        ferry_key,
        "events",
        [
            Message(
                {"n": i, "s": "é"},
                key=f"k{i % 3}",
                tag="t" if i % 2 else None,
                headers={"h": str(i)} if i % 4 == 0 else {},
                partition=i % 2,
            )
            for i in range(40)
        ]
        + [Message(b"\x00\xff raw", partition=1)],
    )
    reader = spark.read.format("ferry").options(
        **options(
            broker_url,
            ferry_key,
            "events",
            startingOffsets=json.dumps({"events": {"0": 3, "1": 5}}),
            endingOffsets=json.dumps({"events": {"0": 15, "1": -1}}),
            maxRowsPerPartition=4,  # several Spark partitions per topic partition
            fetchSize=3,  # several fetches per Spark partition
        )
    )
    df = reader.load()

    got = spark_rows(df)

    assert got == rest_rows(broker_url, ferry_key, "events", 0, 3, 15) + rest_rows(
        broker_url, ferry_key, "events", 1, 5, 21
    )
    assert df.rdd.getNumPartitions() == 3 + 4  # 12 rows / 4, then 16 rows / 4
    assert df.schema.simpleString() == (
        "struct<topic:string,partition:int,offset:bigint,timestamp:timestamp,key:string,"
        "tag:string,headers:map<string,string>,value:binary,value_json:string>"
    )
    # The default range is the whole topic; timestamps are those the broker stored.
    everything = spark.read.format("ferry").options(**options(broker_url, ferry_key, "events"))
    assert everything.load().count() == 41


def test_batch_read__starting_and_ending_timestamp(
    spark, broker_url, ferry_key, stamped_message_factory
):
    """Per partition, the first offset whose timestamp is at or after the time: the start's
    is read, the end's is not (Spark's Kafka source); past a partition's end, its end offset."""
    make_topic("stamped", 2)
    stamped_message_factory("stamped", {0: [1000, 2000, 3000, 4000], 1: [1500, 2500, 2500, 5000]})

    def read(**more):
        given = options(broker_url, ferry_key, "stamped", **more)
        df = spark.read.format("ferry").options(**given).load()
        rows = df.selectExpr("partition", "offset", "unix_millis(timestamp) AS ms").collect()
        return sorted((r.partition, r.offset, r.ms) for r in rows)

    # The time wins over startingOffsets; partition 1 has nothing at 2000, so its 2500.
    assert read(startingTimestamp=2000, startingOffsets=json.dumps({"stamped": {"0": 3}})) == [
        (0, 1, 2000),
        (0, 2, 3000),
        (0, 3, 4000),
        (1, 1, 2500),
        (1, 2, 2500),
        (1, 3, 5000),
    ]
    # The end is excluded: of partition 1's two messages at 2500, neither is read.
    assert read(endingTimestamp=2500) == [(0, 0, 1000), (0, 1, 2000), (1, 0, 1500)]
    # Equal timestamps start at the lowest offset; partition 0 has nothing at 5000 (its end
    # offset ends it), partition 1's message at 5000 is excluded.
    assert read(startingTimestamp=2500, endingTimestamp=5000) == [
        (0, 2, 3000),
        (0, 3, 4000),
        (1, 1, 2500),
        (1, 2, 2500),
    ]
    # Past partition 0's last message: nothing from it (not an error, not its start).
    assert read(startingTimestamp=4500) == [(1, 3, 5000)]
    assert read(startingTimestamp=6000, endingTimestamp=7000) == []


def stream_to_parquet(spark, url, key, topic, tmp_path, trigger, **more):
    reader = spark.readStream.format("ferry").options(**options(url, key, topic, **more))
    return (
        reader.load()
        .select("partition", "offset", "value_json")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(**trigger)
        .start()
    )


def test_stream_read__restart_from_checkpoint_exactly_once(spark, broker_url, ferry_key, tmp_path):
    make_topic("clicks", 2)
    produce(broker_url, ferry_key, "clicks", [Message({"i": i}) for i in range(100)])

    # 1. From the start, at most 30 offsets per micro-batch, until what exists now.
    first = stream_to_parquet(
        spark,
        broker_url,
        ferry_key,
        "clicks",
        tmp_path,
        {"availableNow": True},
        startingOffsets="earliest",
        maxOffsetsPerTrigger=30,
    )
    first.awaitTermination(60)
    sizes = [p["numInputRows"] for p in first.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 100
    assert max(sizes) <= 30
    assert len(sizes) == 4

    # 2. New messages, and a new partition, while the query is down; then a run stopped
    # after its first micro-batch.
    produce(broker_url, ferry_key, "clicks", [Message({"i": i}) for i in range(100, 150)])
    with Admin(broker_url, ferry_key) as admin:
        admin.alter_topic("clicks", partitions=3)
    produce(
        broker_url, ferry_key, "clicks", [Message({"i": 150 + i}, partition=2) for i in range(10)]
    )
    second = stream_to_parquet(
        spark,
        broker_url,
        ferry_key,
        "clicks",
        tmp_path,
        {"processingTime": "100 milliseconds"},
        maxOffsetsPerTrigger=25,
    )
    try:
        deadline = time.monotonic() + 60
        while not [p for p in second.recentProgress if p["numInputRows"]]:
            assert time.monotonic() < deadline, "no micro-batch ran"
            time.sleep(0.05)
    finally:
        second.stop()

    # 3. Restarted: it resumes from the checkpoint and reads the rest, once.
    third = stream_to_parquet(
        spark, broker_url, ferry_key, "clicks", tmp_path, {"availableNow": True}
    )
    third.awaitTermination(60)

    stored = spark.read.parquet(str(tmp_path / "sink")).collect()
    assert len(stored) == 160
    assert len({(r.partition, r.offset) for r in stored}) == 160
    assert sorted(json.loads(r.value_json)["i"] for r in stored) == list(range(160))


def test_write__retried_batch_stores_once_then_reads_back(spark, broker_url, ferry_key):
    make_topic("orders", 2)
    df = spark.createDataFrame(
        [(f'{{"order": {i}}}', f"c{i % 5}", "created", {"src": "spark"}) for i in range(50)],
        "value_json STRING, key STRING, tag STRING, headers MAP<STRING, STRING>",
    ).repartition(2)
    write = df.write.format("ferry").options(**options(broker_url, ferry_key, "orders"))

    write.option("writeId", "orders-load-1").mode("append").save()
    # The same write again, as a retried task would send it: same ids, nothing new stored.
    write.option("writeId", "orders-load-1").mode("append").save()
    # Raw bytes from a binary column, to the topic a column names.
    spark.createDataFrame([(b"\x01\x02", "orders")], "value BINARY, topic STRING").write.format(
        "ferry"
    ).options(url=broker_url, apiKey=ferry_key).mode("append").save()

    back = spark.read.format("ferry").options(**options(broker_url, ferry_key, "orders")).load()
    rows = back.collect()
    assert len(rows) == 51
    orders = sorted(json.loads(r.value_json)["order"] for r in rows if r.value_json)
    assert orders == list(range(50))
    assert {(r.tag, r.headers["src"]) for r in rows if r.value_json} == {("created", "spark")}
    assert [bytes(r.value) for r in rows if r.value_json is None] == [b"\x01\x02"]
    # The key decides the partition, as for any producer.
    by_key: dict[str, set[int]] = {}
    for r in rows:
        if r.key is not None:
            by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(partitions) == 1 for partitions in by_key.values())


def test_write__task_retried_after_a_partial_write_stores_once(
    spark, broker_url, ferry_key, tmp_path
):
    from tests.pipeline import flaky

    make_topic("payments")
    spark.dataSource.register(flaky.FlakySource)
    df = spark.range(0, 2000, numPartitions=1).selectExpr(
        "to_json(named_struct('payment', id)) AS value_json"
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        # Attempt 0 stores the first 500 rows, then fails; attempt 1 sends all 2000.
        df.write.format("ferry_flaky").options(
            **options(broker_url, ferry_key, "payments", batchSize=250),
            marker=str(tmp_path / "attempt-0"),
        ).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    with Reader(broker_url, ferry_key) as reader:
        stored = []
        offset = 0
        while page := reader.fetch("payments", 0, offset, 10_000).messages:
            stored += page
            offset = page[-1]["offset"] + 1
    assert (tmp_path / "attempt-0").read_text() == "500"  # stored before the failure
    assert sorted(m["value"]["payment"] for m in stored) == list(range(2000))
    assert len({m["id"] for m in stored}) == 2000


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"url": "http://127.0.0.1:9"}, "Could not reach Ferry at http://127.0.0.1:9"),
        ({"topic": "nope"}, "topic_not_found"),
        ({"apiKey": "fry_wrong"}, "check the 'apiKey' option"),
        ({"startingOffsets": "{bad"}, "Option 'startingOffsets' must be"),
        ({"url": "localhost:8000"}, "Option 'url' must start with http://"),
    ],
)
def test_read__bad_options_say_what_is_wrong(spark, broker_url, ferry_key, change, error):
    make_topic("known")
    given = {**options(broker_url, ferry_key, "known"), **change}

    with pytest.raises(Exception, match=re.escape(error)):
        spark.read.format("ferry").options(**given).load().collect()


def test_over_https__caFile_trusts_the_brokers_certificate(spark, tls_broker, ferry_key):
    """A broker behind TLS with a self-signed certificate (the README's HAProxy): written and
    read with `caFile`; without it, the error names the option to set."""
    make_topic("secure")
    given = options(tls_broker.url, ferry_key, "secure", caFile=tls_broker.ca_file)
    spark.createDataFrame([('"a"',), ('"b"',)], "value_json STRING").write.format("ferry").options(
        **given
    ).mode("append").save()
    rows = spark.read.format("ferry").options(**given).load().collect()
    assert sorted(json.loads(r.value_json) for r in rows) == ["a", "b"]

    untrusted = options(tls_broker.url, ferry_key, "secure")
    with pytest.raises(Exception, match=re.escape("(check the 'caFile' option)")):
        spark.read.format("ferry").options(**untrusted).load().collect()
    missing = {**given, "caFile": "/nonexistent/ca.crt"}
    with pytest.raises(Exception, match=re.escape("Option 'caFile' names no file")):
        spark.read.format("ferry").options(**missing).load().collect()


def test_write__without_value_column(spark, broker_url, ferry_key):
    df = spark.createDataFrame([("x",)], "name STRING")

    with pytest.raises(Exception, match="needs a 'value' column"):
        df.write.format("ferry").options(**options(broker_url, ferry_key, "t")).mode(
            "append"
        ).save()
