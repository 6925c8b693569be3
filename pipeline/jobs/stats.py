"""stats: per topic and minute, messages, bytes, distinct keys and top keys (docs/pipeline.md).

Reads topics (an offset or time range; default: all they hold) through the `ferry` source,
prints a line per topic and minute, and writes each line as a JSON message to a stats topic
(default `ferry-stats`, which must exist), keyed `<topic>@<minute>`: the latest message of a
key is the newest figure. A message's id is the topic, the minute and its count, so
rerunning over unchanged data stores nothing twice.

    python -m pipeline.jobs.stats --topic orders --from-time 2026-11-23T00:00
"""

import argparse
from collections.abc import Sequence
from typing import Any

from pipeline import jobs

NAME = "stats"
TOP_KEYS = 3


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stats", description=__doc__.split("\n")[0])
    jobs.add_broker_args(p)
    p.add_argument("--topic", required=True, help="a topic, or several comma-separated")
    p.add_argument("--to-topic", default="ferry-stats", help="where the figures go")
    p.add_argument("--from-time", type=jobs.time_ms, help="first message time (ISO or ms)")
    p.add_argument("--until-time", type=jobs.time_ms, help="end time, excluded")
    p.add_argument("--no-write", action="store_true", help="print only")
    return p


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    jobs.check_broker_args(p, args)
    return args


def per_minute(df: Any) -> Any:
    """One row per topic and minute: messages, bytes, distinct keys, top keys as JSON."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = df.withColumn("minute", F.date_trunc("minute", "timestamp"))
    totals = df.groupBy("topic", "minute").agg(
        F.count("*").alias("messages"),
        F.sum(F.length("value")).alias("bytes"),
        F.countDistinct("key").alias("distinct_keys"),
    )
    by_key = df.where(F.col("key").isNotNull()).groupBy("topic", "minute", "key").count()
    rank = F.row_number().over(
        Window.partitionBy("topic", "minute").orderBy(F.desc("count"), "key")
    )
    ranked = F.sort_array(F.collect_list(F.struct(F.col("rank"), "key", "count")))
    top = (
        by_key.withColumn("rank", rank)
        .where(F.col("rank") <= TOP_KEYS)
        .groupBy("topic", "minute")
        .agg(
            F.transform(
                ranked, lambda t: F.struct(t["key"].alias("key"), t["count"].alias("count"))
            ).alias("top_keys")
        )
    )
    return totals.join(top, ["topic", "minute"], "left").orderBy("topic", "minute")


def run(spark: Any, argv: Sequence[str] | None = None) -> int:
    """Run the job in a session (the caller's, e.g. a notebook's); topic-minutes computed."""
    from pyspark.sql import functions as F

    args = parse(argv)
    options = jobs.broker_options(
        args, topic=args.topic, startingTimestamp=args.from_time, endingTimestamp=args.until_time
    )
    figures = per_minute(spark.read.format("ferry").options(**options).load()).cache()
    try:
        rows = figures.collect()
        for r in rows:
            top = ", ".join(f"{t['key']}={t['count']}" for t in r.top_keys or [])
            jobs.say(
                f"stats: {r.topic} {r.minute:%Y-%m-%d %H:%M}: {r.messages} messages, "
                f"{r.bytes} bytes, {r.distinct_keys} keys; top: {top or '-'}"
            )
        if rows and not args.no_write:
            minute = F.date_format("minute", "yyyy-MM-dd'T'HH:mm'Z'")
            out = figures.select(
                F.concat_ws("@", "topic", minute).alias("key"),
                F.concat_ws("-", F.lit("stats"), "topic", minute, "messages").alias("id"),
                F.to_json(
                    F.struct(
                        "topic",
                        minute.alias("minute"),
                        "messages",
                        "bytes",
                        "distinct_keys",
                        "top_keys",
                    )
                ).alias("value_json"),
            )
            sink = jobs.broker_options(args, topic=args.to_topic)
            out.write.format("ferry").options(**sink).mode("append").save()
    finally:
        figures.unpersist()
    where = "printed" if args.no_write else f"written to {args.to_topic}"
    jobs.say(f"stats: done: {len(rows)} topic-minutes of {args.topic} {where}")
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parse(argv)  # argument errors before a JVM starts
    spark = jobs.session(f"ferry-{NAME}")
    try:
        run(spark, argv)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
