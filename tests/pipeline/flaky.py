"""A `ferry` sink whose tasks fail once after a partial write, to force Spark to retry them.

Importable by Spark's workers (the checkout is on their PYTHONPATH); no Django here.
"""

import itertools
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.types import StructType

from pipeline import datasource, sink


class FlakyWriter(sink.FerryWriter):
    marker: str

    def write(self, iterator: Iterator[pa.RecordBatch]) -> sink.Produced:
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0:
            # What the real write() sends first, under the same ids; then the task dies.
            first = itertools.islice(iterator, 1)
            prefix = f"{self.write_id}-{context.partitionId()}"
            sent = sink.send_batches(self.write_options, first, prefix)
            Path(self.marker).write_text(str(sent.stored))
            raise RuntimeError("forced task failure after a partial write")
        return super().write(iterator)


class FlakySource(datasource.FerryDataSource):
    @classmethod
    def name(cls) -> str:
        return "ferry_flaky"

    def writer(self, schema: StructType, overwrite: bool) -> FlakyWriter:
        writer = FlakyWriter(sink.write_options_for(self.options, schema))
        # Where attempt 0 notes how many rows it stored before failing.
        writer.marker = self.options["marker"]
        return writer
