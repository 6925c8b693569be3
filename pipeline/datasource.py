"""The `ferry` PySpark data source: topics as batch and streaming sources and sinks.

docs/pipeline.md. A client of Ferry (STYLE.md §1): it reaches the broker only through
`ferry_client` over REST, never through Django, so Spark's executors import it without the
broker. Spark runs each piece in another process (the traps: docs/pipeline.md, "How it
runs"): read and write tasks get a pickled copy, so everything they need travels in the
input partition or on the writer, and connections are made inside the task.
"""

import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from queue import Full, Queue
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ferry_client import FerryError, PartitionOffsets, Reader
from pipeline import offsets, options, sink
from pipeline.errors import FerrySourceError, explain
from pipeline.options import Connection, Offsets, ReadOptions

NAME = "ferry"

# Like Spark's Kafka source, plus the tag and the JSON text of JSON values.
SCHEMA = (
    "topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, key STRING, tag STRING, "
    "headers MAP<STRING, STRING>, value BINARY, value_json STRING"
)
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("key", pa.string()),
        ("tag", pa.string()),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("value", pa.binary()),
        ("value_json", pa.string()),
    ]
)


# Pages a read task fetches ahead of Spark (each up to fetchSize messages, ~100 bytes each).
PREFETCH_PAGES = 2


def reader_for(conn: Connection) -> Reader:
    return Reader(conn.url, conn.api_key, timeout=conn.timeout_s, verify=conn.verify)


def topic_bounds(
    conn: Connection, topics: Sequence[str], timestamp_ms: int | None = None
) -> dict[str, list[PartitionOffsets]]:
    """Every partition's start and end offsets, one request per topic."""
    with reader_for(conn) as reader:
        out = {}
        for topic in topics:
            try:
                out[topic] = reader.offsets(topic, timestamp_ms)
            except (FerryError, OSError) as exc:
                raise explain(conn, exc, f"the offsets of topic {topic!r}") from exc
        return out


def ends(bounds: Mapping[str, Sequence[PartitionOffsets]]) -> Offsets:
    return {t: {str(p.partition): p.end_offset for p in parts} for t, parts in bounds.items()}


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One read task: an offset range and how to fetch it (pickled to the executor)."""

    range: offsets.OffsetRange
    conn: Connection
    fetch_size: int
    fail_on_data_loss: bool


def spark_batch(topic: str, table: pa.Table) -> pa.RecordBatch:
    """A fetched Arrow table (docs/api.md's columns) in the data source's schema."""
    n = table.num_rows
    value = table.column("value")
    json_bytes = pc.if_else(table.column("is_json"), value, pa.scalar(None, pa.binary()))
    timestamp = table.column("timestamp_ms").cast(pa.timestamp("ms", tz="UTC"))
    columns = [
        pa.array([topic] * n, pa.string()),
        table.column("partition"),
        table.column("offset"),
        timestamp.cast(pa.timestamp("us", tz="UTC")),
        table.column("key"),
        table.column("tag"),
        table.column("headers"),
        value,
        json_bytes.cast(pa.string()),
    ]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA).combine_chunks().to_batches()[0]


def fetch_pages(part: RangePartition) -> Iterator[pa.Table]:
    """Fetch one range as Arrow pages; a gap in the offsets is data loss."""
    r, conn = part.range, part.conn
    offset = r.start
    with reader_for(conn) as reader:
        while offset < r.end:
            try:
                page = reader.fetch_arrow(
                    r.topic, r.partition, offset, min(part.fetch_size, r.end - offset)
                )
            except FerryError as exc:
                moved = (
                    exc.detail.get("start_offset") if exc.code == "offset_out_of_range" else None
                )
                if moved is None or part.fail_on_data_loss or moved <= offset:
                    raise explain(
                        conn, exc, f"{r.topic} partition {r.partition} at {offset}"
                    ) from exc
                offset = min(int(moved), r.end)  # retention removed them: skip, as asked
                continue
            except OSError as exc:
                raise explain(conn, exc, f"a fetch of {r.topic}") from exc
            if page.table.num_rows == 0:
                raise FerrySourceError(
                    f"{r.topic} partition {r.partition} has no message at offset {offset}, "
                    f"though its end offset was {r.end} when the read was planned."
                )
            first = page.table.column("offset")[0].as_py()
            if first != offset and part.fail_on_data_loss:
                raise FerrySourceError(
                    f"Data loss in {r.topic} partition {r.partition}: offsets {offset}..{first} "
                    "are gone (retention?). Set failOnDataLoss=false to skip them."
                )
            yield page.table
            offset = page.next_offset


def ahead(pages: Iterator[Any], depth: int = PREFETCH_PAGES) -> Generator[Any, None, None]:
    """pages, fetched by a thread up to depth pages ahead of the consumer.

    Spark converts one page while the next is on the wire: the broker and the task work at
    once. An exception in the thread is raised here; closing this generator stops the thread.
    """
    queue: Queue[tuple[str, Any]] = Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                queue.put(item, timeout=0.1)
                return True
            except Full:
                continue
        return False

    def produce() -> None:
        try:
            for page in pages:
                if not put(("page", page)):
                    return
            put(("end", None))
        except BaseException as exc:
            put(("error", exc))

    thread = threading.Thread(target=produce, name="ferry-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()


def read_range(part: RangePartition) -> Iterator[pa.RecordBatch]:
    """One range in the data source's schema, fetched a page ahead."""
    for table in ahead(fetch_pages(part)):
        yield spark_batch(part.range.topic, table)


def as_range(partition: InputPartition) -> RangePartition:
    if not isinstance(partition, RangePartition):
        raise TypeError(f"Not a Ferry read partition: {partition!r}")
    return partition


def plan(read: ReadOptions, start: Offsets, end: Offsets) -> list[RangePartition]:
    return [
        RangePartition(r, read.connection, read.fetch_size, read.fail_on_data_loss)
        for r in offsets.ranges(start, end, read.max_rows_per_partition)
    ]


class FerryBatchReader(DataSourceReader):
    def __init__(self, read: ReadOptions) -> None:
        self.read_options = read

    def partitions(self) -> list[InputPartition]:
        read = self.read_options
        bounds = topic_bounds(read.connection, read.topics, read.starting_timestamp_ms)
        start = offsets.resolve(
            read.starting, bounds, fallback="earliest", timestamp_ms=read.starting_timestamp_ms
        )
        if read.ending_timestamp_ms is not None:
            bounds = topic_bounds(read.connection, read.topics, read.ending_timestamp_ms)
        end = offsets.resolve(
            read.ending, bounds, fallback="latest", timestamp_ms=read.ending_timestamp_ms
        )
        return list(plan(read, start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition) and partition.value is None:
            # Nothing in range: for a batch read planned with no partitions, Spark still runs
            # one task, with InputPartition(None).
            return iter(())
        return read_range(as_range(partition))


class FerryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are `{"topic": {"partition": next offset}}`, checkpointed by Spark.

    The checkpoint is the source of truth (no consumer group is used): a restarted query
    resumes at the offsets its checkpoint holds. New partitions are read from offset 0 (their
    start offset), like Kafka's source.
    """

    def __init__(self, read: ReadOptions) -> None:
        self.read_options = read
        # Trigger.AvailableNow: the end offsets when the run began; never read past them.
        self.target: Offsets | None = None
        self.reported: Offsets | None = None

    def _latest(self) -> Offsets:
        read = self.read_options
        return ends(topic_bounds(read.connection, read.topics))

    def initialOffset(self) -> Offsets:
        read = self.read_options
        bounds = topic_bounds(read.connection, read.topics, read.starting_timestamp_ms)
        return offsets.resolve(
            read.starting, bounds, fallback="latest", timestamp_ms=read.starting_timestamp_ms
        )

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.read_options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        latest = self.reported = self._latest()
        for topic, parts in start.items():
            for key, offset in parts.items():
                if key not in latest.get(topic, {}):
                    raise FerrySourceError(
                        f"Partition {key} of {topic} is gone (was the topic deleted and "
                        "created again?); start a new checkpoint."
                    )
                if offset > latest[topic][key]:
                    raise FerrySourceError(
                        f"The checkpoint is at offset {offset} of {topic} partition {key}, "
                        f"past its end offset {latest[topic][key]}: start a new checkpoint."
                    )
        if self.target is not None:
            latest = offsets.cap(latest, self.target)
            # Partitions that appeared since the run began wait for the next run.
            latest = {t: {**start.get(t, {}), **parts} for t, parts in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = offsets.limit(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> Offsets | None:
        """For query progress: the end offsets latestOffset saw (no second request)."""
        return self.reported

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        return list(plan(self.read_options, start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(as_range(partition))

    def commit(self, end: Offsets) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets (this call lags a batch)."""


class FerryDataSource(DataSource):
    """`format("ferry")`: read and write Ferry topics (docs/pipeline.md)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> FerryBatchReader:
        return FerryBatchReader(options.read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> FerryStreamReader:
        return FerryStreamReader(options.read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> sink.FerryWriter:
        return sink.FerryWriter(sink.write_options_for(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> sink.FerryStreamWriter:
        return sink.FerryStreamWriter(sink.write_options_for(self.options, schema))
