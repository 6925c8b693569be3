"""Ferry's data pipeline on Spark: the `ferry` data source and jobs (docs/pipeline.md).

`register(spark)` makes `spark.read.format("ferry")` (and readStream, write, writeStream) work
in a session. Importing this package does not import Spark; `pipeline.datasource` does.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: "SparkSession") -> None:
    """Register the `ferry` data source in this Spark session."""
    from pipeline import datasource  # Spark is imported only when a session asks for it.

    spark.dataSource.register(datasource.FerryDataSource)
