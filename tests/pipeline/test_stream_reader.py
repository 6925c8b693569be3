"""The stream reader's driver side with a fake broker: what each micro-batch may read."""

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ferry_client import PartitionOffsets
from pipeline import datasource, errors, options


class FakeBroker:
    """Stands in for GET /topics/{t}/offsets: end offsets the test moves on."""

    def __init__(self, **ends):
        self.ends = ends  # partition -> end offset of topic "t"

    def bounds(self, conn, topics, timestamp_ms=None):
        return {"t": [PartitionOffsets(int(p[1:]), 0, e) for p, e in sorted(self.ends.items())]}


@pytest.fixture
def broker(monkeypatch):
    fake = FakeBroker(p0=10, p1=0)
    monkeypatch.setattr(datasource, "topic_bounds", fake.bounds)
    return fake


def stream_reader(**more):
    given = {"url": "http://b:1", "apiKey": "k", "topic": "t", **more}
    return datasource.FerryStreamReader(options.read_options(given, streaming=True))


def test_stream_reader__available_now_stops_at_the_target(broker):
    reader = stream_reader(startingOffsets="earliest", maxOffsetsPerTrigger="4")
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    broker.ends.update(p0=20, p2=5)  # produced and grown after the run began

    assert reader.getDefaultReadLimit() == ReadMaxRows(4)
    first = reader.latestOffset(start, ReadMaxRows(4))
    assert first == {"t": {"0": 4, "1": 0}}
    assert reader.latestOffset({"t": {"0": 8, "1": 0}}, ReadMaxRows(4)) == {"t": {"0": 10, "1": 0}}
    ranges = [p.range for p in reader.partitions(start, first)]
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 0, 4)]


def test_stream_reader__new_partitions_and_no_limit(broker):
    reader = stream_reader()  # latest by default
    start = reader.initialOffset()
    assert start == {"t": {"0": 10, "1": 0}}
    broker.ends.update(p1=3, p2=2)

    assert reader.getDefaultReadLimit() == ReadAllAvailable()
    latest = reader.latestOffset(start, ReadAllAvailable())
    assert latest == {"t": {"0": 10, "1": 3, "2": 2}}
    assert [(p.range.partition, p.range.start) for p in reader.partitions(start, latest)] == [
        (1, 0),
        (2, 0),
    ]


def test_stream_reader__checkpoint_past_the_end(broker):
    reader = stream_reader()

    with pytest.raises(errors.FerrySourceError, match="start a new checkpoint"):
        reader.latestOffset({"t": {"0": 11, "1": 0}}, ReadAllAvailable())
