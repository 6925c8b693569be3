"""stats: per topic and minute, messages, bytes, distinct keys, top keys and each reading
group's consume delay (docs/pipeline.md).

Reads topics (an offset or time range; default: all they hold) through the `ferry` source,
adds per group the consume delay and lag from the broker's sampled history (GET
/groups/{g}/history), prints a line per topic and minute, and writes each line as a JSON
message to a stats topic
(default `ferry-stats`, which must exist), keyed by the topic's name, which the console's topic
page reads: the newest message of a minute is its newest figure. A message's id is the topic,
the minute and its count, so rerunning over unchanged data stores nothing twice.

    python -m pipeline.jobs.stats --topic orders --from-time 2026-11-23T00:00
"""

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pipeline import jobs

NAME = "stats"
TOP_KEYS = 3
MINUTE_MS = 60_000


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
        minute_text = F.date_format("minute", "yyyy-MM-dd'T'HH:mm'Z'").alias("minute_text")
        rows = figures.select("*", minute_text).collect()
        for r in rows:
            top = ", ".join(f"{t['key']}={t['count']}" for t in r.top_keys or [])
            jobs.say(
                f"stats: {r.topic} {r.minute:%Y-%m-%d %H:%M}: {r.messages} messages, "
                f"{r.bytes} bytes, {r.distinct_keys} keys; top: {top or '-'}"
            )
        if rows and not args.no_write:
            delays = group_delays(args, {r.topic for r in rows}, rows)
            out = spark.createDataFrame(
                [_record(r, delays.get((r.topic, r.minute_text), [])) for r in rows],
                "key string, id string, value_json string",
            )
            sink = jobs.broker_options(args, topic=args.to_topic)
            out.write.format("ferry").options(**sink).mode("append").save()
    finally:
        figures.unpersist()
    where = "printed" if args.no_write else f"written to {args.to_topic}"
    jobs.say(f"stats: done: {len(rows)} topic-minutes of {args.topic} {where}")
    return len(rows)


def group_delays(
    args: argparse.Namespace, topics: set[str], rows: Sequence[Any]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per topic and minute, each reading group's consume delay and lag, from the broker's
    sampled history (GET /groups/{g}/history): the oldest unconsumed message's age and the
    lag, at most, over the minute's samples. Groups without samples in a minute are left out.
    """
    from ferry_client import Admin

    minutes = [jobs.time_ms(r.minute_text.rstrip("Z")) for r in rows]
    since_ms, until_ms = min(minutes), max(minutes) + MINUTE_MS
    found: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    with Admin(args.url, args.api_key) as admin:
        for group in admin.list_groups():
            for topic in {t["topic"] for t in group["topics"]} & topics:
                history = admin.group_history(
                    group["name"], topic=topic, since_ms=since_ms, until_ms=until_ms
                )
                for point in history["points"]:
                    minute = time.strftime(
                        "%Y-%m-%dT%H:%MZ", time.gmtime(point["at_ms"] // MINUTE_MS * 60)
                    )
                    entry = found[(topic, minute)].setdefault(
                        group["name"],
                        {"group": group["name"], "consume_delay_ms": None, "lag": 0},
                    )
                    if point["oldest_age_ms"] is not None:
                        entry["consume_delay_ms"] = max(
                            entry["consume_delay_ms"] or 0, point["oldest_age_ms"]
                        )
                    entry["lag"] = max(entry["lag"], point["lag"])
    return {
        key: sorted(by_group.values(), key=lambda g: g["group"]) for key, by_group in found.items()
    }


def _record(row: Any, groups: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(key, id, value_json) of one topic-minute: keyed by topic, which the console's topic
    page looks up; the id makes a rerun over unchanged data store nothing."""
    value = {
        "topic": row.topic,
        "minute": row.minute_text,
        "messages": row.messages,
        "bytes": row.bytes,
        "distinct_keys": row.distinct_keys,
        "top_keys": [{"key": t["key"], "count": t["count"]} for t in row.top_keys or []],
        "groups": groups,
    }
    record_id = f"stats-{row.topic}-{row.minute_text}-{row.messages}"
    return row.topic, record_id, json.dumps(value, separators=(",", ":"))


def main(argv: Sequence[str] | None = None) -> int:
    return jobs.run_main(NAME, parse, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
