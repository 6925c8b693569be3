"""The `ferry` data source in a real SparkSession against a real broker (Daphne on the test DB).

Few tests, each proving several things: every Spark query costs a fraction of a second and
the session seconds (docs/pipeline.md#testing).
"""

import base64
import json

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
