"""replay: produce archived messages back into a topic, for reprocessing (docs/pipeline.md).

Reads the Parquet that `archive` wrote, keeps one topic's messages in a time range, and
produces them (value, key, tag, headers) to a topic, each source partition in offset order.
The message ids derive from the arguments, so running the same replay again within the
broker's dedup window (24 h) stores nothing twice.

    python -m pipeline.jobs.replay --input /data/ferry-archive --topic orders \
        --to-topic orders-replay --from-time 2026-11-23T00:00 --until-time 2026-11-23T12:00
"""

import argparse
import hashlib
from collections.abc import Sequence
from typing import Any

from pipeline import jobs

NAME = "replay"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replay", description=__doc__.split("\n")[0])
    jobs.add_broker_args(p)
    p.add_argument("--input", required=True, help="the archive's Parquet directory")
    p.add_argument("--topic", required=True, help="the archived topic to replay")
    p.add_argument("--to-topic", help="where to produce (default: --topic itself)")
    p.add_argument("--from-time", type=jobs.time_ms, help="first message time (ISO or ms)")
    p.add_argument("--until-time", type=jobs.time_ms, help="end time, excluded")
    p.add_argument(
        "--keep-partitions",
        action="store_true",
        help="produce to the same partition numbers (default: by key, like any producer)",
    )
    p.add_argument("--write-id", help="message id prefix (default: derived from the arguments)")
    return p


def write_id(args: argparse.Namespace) -> str:
    """The same replay, the same ids: a rerun after a failure duplicates nothing."""
    what = f"{args.input}|{args.topic}|{args.to_topic}|{args.from_time}|{args.until_time}"
    return "replay-" + hashlib.sha256(what.encode()).hexdigest()[:16]


def select(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    df = spark.read.option("basePath", args.input).parquet(args.input)
    df = df.where(F.col("topic") == args.topic)
    if args.from_time is not None:
        df = df.where(F.col("timestamp") >= F.timestamp_millis(F.lit(args.from_time)))
    if args.until_time is not None:
        df = df.where(F.col("timestamp") < F.timestamp_millis(F.lit(args.until_time)))
    # One task per source partition, in offset order: keys keep their order.
    return df.repartition("partition").sortWithinPartitions("partition", "offset")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    jobs.check_broker_args(p, args)
    return args


def run(spark: Any, argv: Sequence[str] | None = None) -> int:
    """Run the job in a session (the caller's, e.g. a notebook's); messages replayed."""
    args = parse(argv)
    target = args.to_topic or args.topic
    df = select(spark, args)
    from pyspark.sql import functions as F

    prefix = args.write_id or write_id(args)
    # Ids from the archived coordinates: the same message, the same id, whatever the tasks.
    message_id = F.concat_ws("-", F.lit(prefix), F.col("partition"), F.col("offset"))
    columns: list[Any] = ["value", "value_json", "key", "tag", "headers", message_id.alias("id")]
    if args.keep_partitions:
        columns.append("partition")
    count = df.count()
    jobs.say(f"replay: {count} messages of {args.topic} from {args.input} to {target}")
    options = jobs.broker_options(args, topic=target)
    df.select(*columns).write.format("ferry").options(**options).mode("append").save()
    jobs.say(f"replay: done: {count} messages produced to {target}")
    return int(count)


def main(argv: Sequence[str] | None = None) -> int:
    return jobs.run_main(NAME, parse, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
