"""archive: copy a topic's messages to Parquet, partitioned by topic and date (docs/pipeline.md).

Three modes. `incremental` (the default) reads what arrived since the last run, from the
checkpoint kept under the output, into Spark's Parquet file sink: exactly once, and each run
resumes where the last stopped (Trigger.AvailableNow). `continuous` does the same without end.
`once` copies an offset or time range as a batch job.

    python -m pipeline.jobs.archive --topic orders --output /data/ferry-archive
"""

import argparse
import json
from collections.abc import Sequence
from typing import Any

from pipeline import jobs

NAME = "archive"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="archive", description=__doc__.split("\n")[0])
    jobs.add_broker_args(p)
    p.add_argument("--topic", required=True, help="a topic, or several comma-separated")
    p.add_argument("--output", required=True, help="Parquet directory (any Spark path)")
    p.add_argument("--mode", choices=["incremental", "continuous", "once"], default="incremental")
    p.add_argument("--checkpoint", help="default: <output>/_checkpoints/<topic>")
    p.add_argument("--interval-seconds", type=float, default=10.0, help="continuous: trigger")
    p.add_argument("--max-per-batch", type=int, help="maxOffsetsPerTrigger (streaming modes)")
    p.add_argument("--from-time", type=jobs.time_ms, help="first message time (ISO or ms)")
    p.add_argument("--until-time", type=jobs.time_ms, help="once: end time, excluded")
    p.add_argument("--starting-offsets", help="startingOffsets: earliest, latest or JSON")
    p.add_argument("--ending-offsets", help="once: endingOffsets: latest or JSON")
    return p


def with_date(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.withColumn("date", F.date_format("timestamp", "yyyy-MM-dd"))


def archive_once(spark: Any, args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    options = jobs.broker_options(
        args,
        topic=args.topic,
        startingOffsets=args.starting_offsets,
        endingOffsets=args.ending_offsets,
        startingTimestamp=args.from_time,
        endingTimestamp=args.until_time,
    )
    df = spark.read.format("ferry").options(**options).load().cache()
    try:
        ranges = (
            df.groupBy("topic", "partition")
            .agg(F.count("*").alias("n"), F.min("offset").alias("lo"), F.max("offset").alias("hi"))
            .orderBy("topic", "partition")
            .collect()
        )
        for r in ranges:
            jobs.say(f"archive: {r.topic}/{r.partition}: offsets {r.lo}..{r.hi}, {r.n} messages")
        with_date(df).write.partitionBy("topic", "date").mode("append").parquet(args.output)
    finally:
        df.unpersist()
    return sum(r.n for r in ranges)


def archive_stream(spark: Any, args: argparse.Namespace) -> int:
    checkpoint = args.checkpoint or f"{args.output.rstrip('/')}/_checkpoints/{args.topic}"
    options = jobs.broker_options(
        args,
        topic=args.topic,
        startingOffsets=args.starting_offsets or "earliest",
        startingTimestamp=args.from_time,
        maxOffsetsPerTrigger=args.max_per_batch,
    )
    trigger: dict[str, Any] = (
        {"availableNow": True}
        if args.mode == "incremental"
        else {"processingTime": f"{args.interval_seconds} seconds"}
    )
    query = (
        with_date(spark.readStream.format("ferry").options(**options).load())
        .writeStream.format("parquet")
        .option("path", args.output)
        .option("checkpointLocation", checkpoint)
        .partitionBy("topic", "date")
        .trigger(**trigger)
        .queryName(f"ferry-archive-{args.topic}")
        .start()
    )
    reports = jobs.follow(query, "archive")
    done = [r for r in reports if r["numInputRows"]]
    if done:
        jobs.say(
            f"archive: offsets now {json.dumps(json.loads(done[-1]['sources'][0]['endOffset']))}"
        )
    return sum(r["numInputRows"] for r in reports)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    jobs.check_broker_args(p, args)
    if args.mode != "once" and (args.until_time is not None or args.ending_offsets):
        p.error("--until-time and --ending-offsets need --mode once")
    return args


def run(spark: Any, argv: Sequence[str] | None = None) -> int:
    """Run the job in a session (the caller's, e.g. a notebook's); messages archived."""
    args = parse(argv)
    total = archive_once(spark, args) if args.mode == "once" else archive_stream(spark, args)
    jobs.say(f"archive: done: {total} messages of {args.topic} archived to {args.output}")
    return total


def main(argv: Sequence[str] | None = None) -> int:
    return jobs.run_main(NAME, parse, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
