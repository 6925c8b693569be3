"""The `ferry` sink: DataFrame rows produced as messages, batch and streaming (docs/pipeline.md).

Every row gets a deterministic message id, so a retried task or a replayed micro-batch sends
the same ids and the broker stores each message once (docs/pipeline.md#delivery-guarantees).
"""

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ferry_client import FerryError, Producer
from pipeline import options, rows
from pipeline.errors import explain
from pipeline.options import WriteOptions


@dataclass(frozen=True)
class Produced(WriterCommitMessage):
    """What one write task stored: new messages and retries the broker recognised."""

    stored: int
    duplicates: int


def send_batches(
    write: WriteOptions, batches: Iterator[pa.RecordBatch], id_prefix: str
) -> Produced:
    """Produce every row, in requests of batch_size, each row under id `<prefix>-<row index>`."""
    stored = duplicates = 0
    conn = write.connection
    with Producer(conn.url, conn.api_key, timeout=conn.timeout_s, verify=conn.verify) as producer:
        for topic, messages in rows.messages(batches, write.topic, write.batch_size, id_prefix):
            try:
                results = producer.send_batch(topic, messages)
            except (FerryError, OSError) as exc:
                raise explain(conn, exc, f"a produce to {topic!r}") from exc
            dup = sum(r.duplicate for r in results)
            duplicates += dup
            stored += len(results) - dup
    return Produced(stored, duplicates)


def task_id() -> str:
    """`<task partition>`: the same for every attempt of a task."""
    context = TaskContext.get()
    return str(context.partitionId()) if context is not None else "0"


class FerryWriter(DataSourceArrowWriter):
    """Batch write. Row ids: `<writeId>-<task partition>-<row index>`, so a retried task
    (same input, same order) sends the same ids and the broker stores each message once."""

    def __init__(self, write: WriteOptions) -> None:
        self.write_options = write
        # Made once on the driver and pickled into every task attempt.
        self.write_id = write.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Produced:
        return send_batches(self.write_options, iterator, f"{self.write_id}-{task_id()}")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: each produce was durable when it returned."""


class FerryStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write. Row ids: `<query id>-<batch id>-<task partition>-<row index>`: a
    micro-batch replayed after a failure (same batch id) does not duplicate."""

    def __init__(self, write: WriteOptions) -> None:
        self.write_options = write
        # Only if Spark ever stops telling tasks their query id: unique, if not stable.
        self.fallback_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Produced:
        context = TaskContext.get()
        query, batch = self.fallback_id, "0"
        if context is not None:
            query = context.getLocalProperty("sql.streaming.queryId") or self.fallback_id
            batch = context.getLocalProperty("streaming.sql.batchId") or "0"
        prefix = f"{self.write_options.write_id or query}-{batch}-{task_id()}"
        return send_batches(self.write_options, iterator, prefix)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each produce was durable when it returned."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what was stored stays; a replay of the batch reuses its ids."""


def write_options_for(given: Mapping[str, str], schema: StructType) -> WriteOptions:
    write = options.write_options(given)
    rows.check_columns(schema.fieldNames(), has_topic_option=write.topic is not None)
    return write
