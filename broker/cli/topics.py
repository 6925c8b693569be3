"""Console noun `topics`: create, list, describe, alter and delete topics (docs/console.md)."""

import argparse
import datetime
from collections.abc import Callable
from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError

from broker.cli import audit, table
from broker.cli import groups as group_noun
from broker.core import keys, log, membership, records, topics, trace

# The options create and alter share, by their keyword in topics.create_topic/alter_topic.
LIMITS = (
    "partitions",
    "retention_ms",
    "retention_bytes",
    "max_message_bytes",
    "capacity",
    "overflow_policy",
    "message_ttl_ms",
    "trace",
)


def int_or_none(text: str) -> int | None:
    """An integer, or 'none' to remove the limit."""
    return None if text.strip().lower() == "none" else int(text)


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser("topics", help="Create, list, describe, alter and delete topics.")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")

    create = verbs.add_parser("create", help="Create a topic.")
    create.add_argument("name")
    add_limits(create, int)
    create.set_defaults(handler=handle_create)

    verbs.add_parser("list", help="List topics.").set_defaults(handler=handle_list)

    describe = verbs.add_parser("describe", help="Show a topic's settings and partitions.")
    describe.add_argument("name")
    describe.set_defaults(handler=handle_describe)

    alter = verbs.add_parser(
        "alter", help="Grow partitions or change limits; 'none' removes a limit."
    )
    alter.add_argument("name")
    add_limits(alter, int_or_none)
    alter.set_defaults(handler=handle_alter)

    delete = verbs.add_parser("delete", help="Delete a topic, its messages and group offsets.")
    delete.add_argument("name")
    delete.set_defaults(handler=handle_delete)

    purge = verbs.add_parser(
        "purge",
        help="Remove a topic's messages (all, or below offsets); offsets are never reused.",
    )
    purge.add_argument("name")
    purge.add_argument(
        "--up-to",
        action="append",
        type=partition_colon_offset,
        metavar="PARTITION:OFFSET",
        help="Remove only the partition's messages below OFFSET (repeat for more partitions).",
    )
    purge.set_defaults(handler=handle_purge)

    trace_ = verbs.add_parser(
        "trace", help="A message's recorded events (produced, delivered, acked, retried, ...)."
    )
    trace_.add_argument("name", metavar="topic")
    trace_.add_argument("partition", type=int)
    trace_.add_argument("offset", type=int)
    trace_.set_defaults(handler=handle_trace)


def partition_colon_offset(text: str) -> tuple[int, int]:
    partition, sep, offset = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        return int(partition), int(offset)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PARTITION:OFFSET, got {text!r}") from None


def add_limits(parser: argparse.ArgumentParser, nullable: Callable[[str], int | None]) -> None:
    # SUPPRESS leaves an option that was not given out of the options, so only given ones reach
    # the core (alter keeps the rest; 'none' is a value, not an absence).
    given_only: Any = argparse.SUPPRESS
    parser.add_argument("--partitions", type=int, default=given_only, metavar="N")
    parser.add_argument("--retention-ms", type=nullable, default=given_only, metavar="MS")
    parser.add_argument("--retention-bytes", type=nullable, default=given_only, metavar="B")
    parser.add_argument("--max-message-bytes", type=int, default=given_only, metavar="B")
    parser.add_argument("--capacity", type=nullable, default=given_only, metavar="N")
    parser.add_argument(
        "--overflow",
        dest="overflow_policy",
        choices=topics.OVERFLOW_POLICIES,
        default=given_only,
        help="What a full partition does with a new message.",
    )
    parser.add_argument(
        "--message-ttl-ms",
        type=nullable,
        default=given_only,
        metavar="MS",
        help="Messages older than this are dead-lettered instead of delivered to a group.",
    )
    parser.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=given_only,
        help="Record every message's produce, delivery and ack events (ferry topics trace); "
        "retries and dead letters are recorded on every topic.",
    )


def given_limits(options: dict[str, Any]) -> dict[str, Any]:
    return {name: options[name] for name in LIMITS if name in options}


def handle_create(command: BaseCommand, options: dict[str, Any]) -> None:
    limits = given_limits(options)
    info = audit.audited(
        "topic.create",
        options["name"],
        limits,
        lambda: topics.create_topic(keys.CONSOLE, options["name"], **limits),
    )
    command.stdout.write(f"created topic {info.name} with {info.partition_count} partition(s)")


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    rows = [
        (
            t.name,
            t.partition_count,
            t.message_count,
            t.bytes_stored,
            t.capacity,
            t.message_ttl_ms,
            t.trace,
        )
        for t in topics.list_topics(keys.CONSOLE)
    ]
    command.stdout.write(
        table.render(
            ("name", "partitions", "messages", "bytes", "capacity", "message_ttl_ms", "trace"),
            rows,
        )
    )
    deletions = topics.list_topic_deletions(keys.CONSOLE)
    if deletions:
        # Gone for clients already; their rows go in the background (run_topic_deletions).
        command.stdout.write(
            "being deleted: " + ", ".join(f"{d.name} ({d.messages} messages)" for d in deletions)
        )


def handle_describe(command: BaseCommand, options: dict[str, Any]) -> None:
    command.stdout.write(describe(topics.get_topic(keys.CONSOLE, options["name"])))


def handle_alter(command: BaseCommand, options: dict[str, Any]) -> None:
    changes = given_limits(options)
    if not changes:
        raise CommandError(
            "Nothing to alter: give at least one of --partitions, --retention-ms, "
            "--message-ttl-ms, --trace, …"
        )
    info = audit.audited(
        "topic.alter",
        options["name"],
        changes,
        lambda: membership.alter_topic(keys.CONSOLE, options["name"], **changes),
    )
    command.stdout.write(f"altered topic {info.name}\n\n{describe(info)}")


def handle_delete(command: BaseCommand, options: dict[str, Any]) -> None:
    name = options["name"]
    audit.audited("topic.delete", name, {}, lambda: topics.delete_topic(keys.CONSOLE, name))
    command.stdout.write(f"deleted topic {name}")


def handle_purge(command: BaseCommand, options: dict[str, Any]) -> None:
    name = options["name"]
    up_to = dict(options["up_to"]) if options["up_to"] else None
    result = audit.audited(
        "topic.purge",
        name,
        {"up_to": {str(p): o for p, o in up_to.items()} if up_to else None},
        lambda: log.purge_topic(keys.CONSOLE, name, up_to),
        lambda r: {"removed": r.removed},
    )
    command.stdout.write(f"purged {result.removed} message(s) from {name}")
    command.stdout.write(partition_table(result.partitions))


def handle_trace(command: BaseCommand, options: dict[str, Any]) -> None:
    name, partition, offset = options["name"], options["partition"], options["offset"]
    events = trace.get_trace(keys.CONSOLE, name, partition, offset)
    for event in events:
        command.stdout.write(trace_line(event))
    if not events:
        command.stderr.write(
            f"no events recorded for {name} partition {partition} offset {offset} "
            "(is --trace on? old events are removed after FERRY_TRACE_RETENTION_SECONDS)"
        )


def trace_line(event: records.TraceInfo) -> str:
    """TIME EVENT, then who and which attempt when known, then the details as NAME=JSON."""
    parts = [group_noun.at(event.at_ms), event.event]
    if event.group:
        parts.append(f"group={event.group}")
    if event.member_id:
        parts.append(f"member={event.member_id}")
    if event.attempt is not None:
        parts.append(f"attempt={event.attempt}")
    parts += [f"{name}={orjson.dumps(value).decode()}" for name, value in event.detail.items()]
    return " ".join(parts)


def describe(info: records.TopicInfo) -> str:
    created = datetime.datetime.fromtimestamp(info.created_at_ms / 1000, tz=datetime.UTC)
    settings = table.fields(
        [
            ("topic", info.name),
            ("partitions", info.partition_count),
            ("retention_ms", info.retention_ms),
            ("retention_bytes", info.retention_bytes),
            ("max_message_bytes", info.max_message_bytes),
            ("capacity", info.capacity),
            ("overflow", info.overflow_policy),
            ("message_ttl_ms", info.message_ttl_ms),
            ("trace", info.trace),
            ("created", created.isoformat(timespec="seconds")),
        ]
    )
    return f"{settings}\n\n{partition_table(info.partitions)}"


def partition_table(partitions: tuple[records.PartitionInfo, ...]) -> str:
    return table.render(
        ("partition", "start", "end", "messages", "bytes"),
        [
            (p.number, p.start_offset, p.end_offset, p.message_count, p.bytes_stored)
            for p in partitions
        ],
    )
