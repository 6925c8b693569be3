"""Reader against a real Daphne: offsets in one request, JSON and Arrow fetches agree."""

import time

import pytest

from ferry_client import FerryError, Message, PartitionOffsets, Producer, Reader

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def reader(broker_url, secret):
    with Reader(broker_url, secret) as client:
        yield client


def test_reader__offsets_and_timestamp(broker_url, secret, reader, topic_factory):
    topic = topic_factory(partitions=2).name
    with Producer(broker_url, secret) as producer:
        producer.send_batch(topic, [Message(i, partition=1) for i in range(3)])
        later_ms = int(time.time() * 1000) + 1
        time.sleep(0.01)
        producer.send(topic, "late", partition=1)

    assert reader.offsets(topic) == [PartitionOffsets(0, 0, 0), PartitionOffsets(1, 0, 4)]
    by_time = reader.offsets(topic, timestamp_ms=later_ms)
    assert [p.offset_for_timestamp for p in by_time] == [0, 3]


def test_reader__fetch_arrow_matches_json(broker_url, secret, reader, topic_factory):
    topic = topic_factory().name
    with Producer(broker_url, secret) as producer:
        producer.send_batch(
            topic, [Message({"n": 1}, key="a", headers={"h": "v"}), Message(b"\x01"), Message(2)]
        )

    page = reader.fetch(topic, 0, offset=1, limit=5)
    arrow_page = reader.fetch_arrow(topic, 0, offset=1, limit=5)

    assert (arrow_page.next_offset, arrow_page.start_offset, arrow_page.end_offset) == (3, 0, 3)
    assert (page.next_offset, page.end_offset) == (3, 3)
    assert arrow_page.table.column("offset").to_pylist() == [m["offset"] for m in page.messages]
    assert arrow_page.table.column("value").to_pylist() == [b"\x01", b"2"]
    assert arrow_page.table.column("is_json").to_pylist() == [False, True]


def test_reader__unknown_topic(reader):
    with pytest.raises(FerryError) as missing:
        reader.fetch_arrow("nope", 0)
    assert (missing.value.code, missing.value.status) == ("topic_not_found", 404)
    with pytest.raises(FerryError) as missing:
        reader.offsets("nope")
    assert missing.value.code == "topic_not_found"
