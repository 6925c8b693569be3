"""Console noun `topics`: create, list, describe, alter and delete topics (docs/console.md)."""

import argparse
import datetime
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from broker.cli import table
from broker.core import keys, records, topics

# The options create and alter share, by their keyword in topics.create_topic/alter_topic.
LIMITS = (
    "partitions",
    "retention_ms",
    "retention_bytes",
    "max_message_bytes",
    "capacity",
    "overflow_policy",
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


def given_limits(options: dict[str, Any]) -> dict[str, Any]:
    return {name: options[name] for name in LIMITS if name in options}


def handle_create(command: BaseCommand, options: dict[str, Any]) -> None:
    info = topics.create_topic(keys.CONSOLE, options["name"], **given_limits(options))
    command.stdout.write(f"created topic {info.name} with {info.partition_count} partition(s)")


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    rows = [
        (t.name, t.partition_count, sum(p.message_count for p in t.partitions), t.capacity)
        for t in topics.list_topics(keys.CONSOLE)
    ]
    command.stdout.write(table.render(("name", "partitions", "messages", "capacity"), rows))


def handle_describe(command: BaseCommand, options: dict[str, Any]) -> None:
    command.stdout.write(describe(topics.get_topic(keys.CONSOLE, options["name"])))


def handle_alter(command: BaseCommand, options: dict[str, Any]) -> None:
    changes = given_limits(options)
    if not changes:
        raise CommandError("Nothing to alter: give at least one of --partitions, --retention-ms, …")
    info = topics.alter_topic(keys.CONSOLE, options["name"], **changes)
    command.stdout.write(f"altered topic {info.name}\n\n{describe(info)}")


def handle_delete(command: BaseCommand, options: dict[str, Any]) -> None:
    topics.delete_topic(keys.CONSOLE, options["name"])
    command.stdout.write(f"deleted topic {options['name']}")


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
            ("created", created.isoformat(timespec="seconds")),
        ]
    )
    partitions = table.render(
        ("partition", "start", "end", "messages"),
        [(p.number, p.start_offset, p.end_offset, p.message_count) for p in info.partitions],
    )
    return f"{settings}\n\n{partitions}"
