"""Ferry's data pipeline on Spark: the `ferry` data source and jobs (docs/pipeline.md)."""
