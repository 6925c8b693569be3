"""Read tasks without Spark: pages a fetch ahead, in the Spark schema, and data loss."""

import pyarrow as pa
import pytest
from pyspark.sql.datasource import InputPartition

from ferry_client import ArrowPage, FerryError
from pipeline import datasource, errors, options
from pipeline.datasource import ahead
from pipeline.offsets import OffsetRange
from pipeline.options import Connection


def test_ahead__order_errors_and_early_close():
    assert list(ahead(iter(range(5)), depth=1)) == [0, 1, 2, 3, 4]

    def failing():
        yield 1
        raise RuntimeError("broker went away")

    pages = ahead(failing())
    assert next(pages) == 1
    with pytest.raises(RuntimeError, match="broker went away"):
        next(pages)
    endless = ahead(iter(range(10**9)), depth=2)
    assert next(endless) == 0
    endless.close()  # stops the thread


class FakeReader:
    """Stands in for ferry_client.Reader in a read task: pages from a dict, errors on cue."""

    def __init__(self, start_offset, end_offset):
        self.start_offset, self.end_offset = start_offset, end_offset

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def fetch_arrow(self, topic, partition, offset, limit):
        if offset < self.start_offset:
            raise FerryError(
                "offset_out_of_range",
                "gone",
                {"start_offset": self.start_offset, "end_offset": self.end_offset},
                409,
            )
        stop = min(offset + limit, self.end_offset)
        n = stop - offset
        table = pa.table(
            {
                "partition": pa.array([partition] * n, pa.int32()),
                "offset": pa.array(range(offset, stop), pa.int64()),
                "timestamp_ms": pa.array([0] * n, pa.int64()),
                "key": pa.array([None] * n, pa.string()),
                "tag": pa.array([None] * n, pa.string()),
                "headers": pa.array([[]] * n, pa.map_(pa.string(), pa.string())),
                "id": pa.array([None] * n, pa.string()),
                "value": pa.array([b"1"] * n, pa.binary()),
                "is_json": pa.array([True] * n),
            }
        )
        return ArrowPage(table, stop, self.start_offset, self.end_offset)


def read_offsets(monkeypatch, fail_on_data_loss, start=0, end=10):
    monkeypatch.setattr(datasource, "reader_for", lambda conn: FakeReader(4, 10))
    part = datasource.RangePartition(
        OffsetRange("t", 0, start, end), Connection("http://b:1", "k", 1.0), 3, fail_on_data_loss
    )
    return [o for batch in datasource.read_range(part) for o in batch.column("offset").to_pylist()]


def test_read_range__pages_in_the_spark_schema(monkeypatch):
    got = read_offsets(monkeypatch, True, start=4)

    assert got == list(range(4, 10))


def test_read_range__retention_passed_us(monkeypatch):
    with pytest.raises(errors.FerrySourceError, match="offset_out_of_range"):
        read_offsets(monkeypatch, True)

    # failOnDataLoss=false: skip to the start offset and go on.
    assert read_offsets(monkeypatch, False) == list(range(4, 10))


def test_batch_reader__nothing_in_range():
    """partitions() found no range: Spark runs one task with InputPartition(None) anyway."""
    read = options.read_options({"url": "http://b:1", "apiKey": "k", "topic": "t"}, streaming=False)
    reader = datasource.FerryBatchReader(read)

    assert list(reader.read(InputPartition(None))) == []
    with pytest.raises(TypeError, match="Not a Ferry read partition"):
        list(reader.read(InputPartition(3)))
