"""Console noun `groups`: list groups, describe one's offsets, lag and members (docs/console.md)."""

import argparse
import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from broker.cli import table
from broker.core import groups, keys, membership


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser("groups", help="List consumer groups, describe one's offsets and lag.")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")
    verbs.add_parser("list", help="Per group and topic: committed, end, lag.").set_defaults(
        handler=handle_list
    )
    describe = verbs.add_parser(
        "describe", help="Per topic and partition: offsets and lag; then the group's members."
    )
    describe.add_argument("group")
    describe.set_defaults(handler=handle_describe)
    configure = verbs.add_parser(
        "configure", help="Set a group's assignment strategy or session timeout."
    )
    configure.add_argument("group")
    configure.add_argument("--strategy", choices=("range", "round_robin", "sticky"))
    configure.add_argument("--session-timeout-ms", type=int, metavar="MS")
    configure.set_defaults(handler=handle_configure)
    reset = verbs.add_parser(
        "reset", help="Move the group's committed offsets on a topic (replay or skip)."
    )
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="Every partition's start.")
    target.add_argument("--to-latest", action="store_true", help="Every partition's end.")
    target.add_argument(
        "--to-timestamp", type=int, metavar="MS", help="The first offset at or after MS."
    )
    target.add_argument(
        "--to-offset",
        action="append",
        metavar="PARTITION=OFFSET",
        type=partition_offset,
        help="An explicit offset for one partition (repeat for more).",
    )
    reset.add_argument(
        "--force", action="store_true", help="Reset even while the group has live members."
    )
    reset.set_defaults(handler=handle_reset)


def partition_offset(text: str) -> tuple[int, int]:
    partition, sep, offset = text.partition("=")
    try:
        if not sep:
            raise ValueError(text)
        return int(partition), int(offset)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PARTITION=OFFSET, got {text!r}") from None


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    rows = [
        (t.group, t.topic, t.committed_total, t.end_total, t.lag)
        for group in groups.list_groups(keys.CONSOLE)
        for t in group.topics
    ]
    command.stdout.write(table.render(("group", "topic", "committed", "end", "lag"), rows))


def handle_describe(command: BaseCommand, options: dict[str, Any]) -> None:
    info = groups.describe_group(keys.CONSOLE, options["group"])
    settings = table.fields(
        [("group", info.name), ("generation", info.generation), ("strategy", info.strategy)]
    )
    offsets = table.render(
        ("topic", "partition", "committed", "start", "end", "lag"),
        [
            (t.topic, p.partition, p.committed_offset, p.start_offset, p.end_offset, p.lag)
            for t in info.topics
            for p in t.partitions
        ],
    )
    members = table.render(
        ("member", "topic", "partitions", "last heartbeat"),
        [
            (m.member_id, m.topic, ",".join(map(str, m.partitions)) or None, at(m.heartbeat_ms))
            for m in info.members
        ],
    )
    command.stdout.write(f"{settings}\n\n{offsets}\n\n{members}")


def handle_configure(command: BaseCommand, options: dict[str, Any]) -> None:
    if options["strategy"] is None and options["session_timeout_ms"] is None:
        raise CommandError("Give --strategy and/or --session-timeout-ms.")
    info = membership.configure_group(
        keys.CONSOLE,
        options["group"],
        strategy=options["strategy"],
        session_timeout_ms=options["session_timeout_ms"],
    )
    command.stdout.write(
        table.fields(
            [("group", info.name), ("generation", info.generation), ("strategy", info.strategy)]
        )
    )


def handle_reset(command: BaseCommand, options: dict[str, Any]) -> None:
    if options["to_earliest"]:
        to = "earliest"
    elif options["to_latest"]:
        to = "latest"
    elif options["to_timestamp"] is not None:
        to = "timestamp"
    else:
        to = "offsets"
    result = groups.reset_offsets(
        keys.CONSOLE,
        options["group"],
        options["topic"],
        to,
        timestamp_ms=options["to_timestamp"],
        offsets=dict(options["to_offset"] or []),
        force=options["force"],
    )
    command.stdout.write(
        table.render(
            ("topic", "partition", "committed", "start", "end", "lag"),
            [
                (result.topic, p.partition, p.committed_offset, p.start_offset, p.end_offset, p.lag)
                for p in result.partitions
            ],
        )
    )


def at(ms: int) -> str:
    """A time in ms since the epoch as ISO 8601 in UTC."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
