"""Console noun `groups`: list groups, describe one's offsets, lag and members (docs/console.md)."""

import argparse
from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError

from broker.cli import audit, table
from broker.core import groups, keys, records

# The options of `configure`, by their keyword in groups.configure_group.
SETTINGS = (
    "strategy",
    "session_timeout_ms",
    "mode",
    "ordered",
    "ack_deadline_ms",
    "max_attempts",
    "retry_delays_ms",
)


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser("groups", help="List consumer groups, describe one's offsets and lag.")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")
    verbs.add_parser("list", help="Per group and topic: committed, end, lag.").set_defaults(
        handler=handle_list
    )
    describe = verbs.add_parser(
        "describe",
        help="The group's settings; per topic and partition: offsets, lag, in flight; "
        "then its members.",
    )
    describe.add_argument("group")
    describe.set_defaults(handler=handle_describe)
    configure = verbs.add_parser(
        "configure",
        help="Set how a group assigns and delivers; options not given keep their value.",
    )
    configure.add_argument("group")
    configure.add_argument("--strategy", choices=("range", "round_robin", "sticky"))
    configure.add_argument("--session-timeout-ms", type=int, metavar="MS")
    configure.add_argument(
        "--mode",
        choices=("clustering", "broadcast"),
        help="clustering: each message to one member; broadcast: to every member. "
        "Changes only while the group has no members.",
    )
    order = configure.add_mutually_exclusive_group()
    order.add_argument(
        "--ordered",
        dest="ordered",
        action="store_true",
        default=None,
        help="At most one message per partition in flight; a failure retries it in place.",
    )
    order.add_argument("--unordered", dest="ordered", action="store_false")
    configure.add_argument(
        "--ack-deadline-ms",
        type=int,
        metavar="MS",
        help="How long a member has to ack a delivery before it is redelivered.",
    )
    configure.add_argument(
        "--max-attempts",
        type=int,
        metavar="N",
        help="Deliveries of a message before it is dead-lettered.",
    )
    configure.add_argument(
        "--retry-delays-ms",
        type=delays,
        metavar="MS,MS,...",
        help="Backoff before retry n (the last repeats), e.g. 10000,30000,60000; "
        "'' for RocketMQ's levels (10s 30s 1m 2m ... 2h).",
    )
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
    target.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="Move every committed offset by N (negative replays), within start and end.",
    )
    reset.add_argument(
        "--force", action="store_true", help="Reset even while the group has live members."
    )
    reset.add_argument(
        "--dry-run", action="store_true", help="Show what would move, and move nothing."
    )
    reset.set_defaults(handler=handle_reset)
    delete = verbs.add_parser(
        "delete",
        help="Delete a group: its offsets, in-flight messages, dead letters and members.",
    )
    delete.add_argument("group")
    delete.add_argument(
        "--force", action="store_true", help="Delete even while the group has live members."
    )
    delete.set_defaults(handler=handle_delete)


def partition_offset(text: str) -> tuple[int, int]:
    partition, sep, offset = text.partition("=")
    try:
        if not sep:
            raise ValueError(text)
        return int(partition), int(offset)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PARTITION=OFFSET, got {text!r}") from None


def delays(text: str) -> list[int]:
    """A comma list of milliseconds; empty for the default levels."""
    try:
        return [int(part) for part in text.split(",")] if text.strip() else []
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MS,MS,..., got {text!r}") from None


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    # Every figure is a total over the topic's partitions.
    rows = [
        (t.group, t.topic, t.committed_total, t.end_total, t.lag, t.in_flight, t.retry_waiting)
        for group in groups.list_groups(keys.CONSOLE)
        for t in group.topics
    ]
    command.stdout.write(
        table.render(
            ("group", "topic", "committed", "end", "lag", "in flight", "retry waiting"), rows
        )
    )


def handle_describe(command: BaseCommand, options: dict[str, Any]) -> None:
    info = groups.describe_group(keys.CONSOLE, options["group"])
    # Broadcast members read with their own offsets: a member column then says whose row it is.
    by_member = any(t.subscriber for t in info.topics)
    offsets = table.render(
        (
            "topic",
            *(("member",) if by_member else ()),
            "partition",
            "committed",
            "start",
            "end",
            "lag",
            "in flight",
            "retry waiting",
            "filtered",
        ),
        [
            (
                t.topic,
                *((t.subscriber or None,) if by_member else ()),
                p.partition,
                p.committed_offset,
                p.start_offset,
                p.end_offset,
                p.lag,
                p.in_flight,
                p.retry_waiting,
                p.filtered,
            )
            for t in info.topics
            for p in t.partitions
        ],
    )
    members = table.render(
        ("member", "client", "topic", "partitions", "last heartbeat", "filter"),
        [
            (
                m.member_id,
                " ".join(part for part in (m.client, m.host) if part) or None,
                m.topic,
                ",".join(map(str, m.partitions)) or None,
                at(m.heartbeat_ms),
                None if m.filter is None else orjson.dumps(m.filter).decode(),
            )
            for m in info.members
        ],
    )
    command.stdout.write(f"{settings(info)}\n\n{offsets}\n\n{members}")


def handle_configure(command: BaseCommand, options: dict[str, Any]) -> None:
    given = {name: options[name] for name in SETTINGS if options[name] is not None}
    if not given:
        raise CommandError(
            "Nothing to configure: give at least one of --strategy, --session-timeout-ms, "
            "--mode, --ordered/--unordered, --ack-deadline-ms, --max-attempts, --retry-delays-ms."
        )
    info = audit.audited(
        "group.configure",
        options["group"],
        given,
        lambda: groups.configure_group(keys.CONSOLE, options["group"], **given),
    )
    command.stdout.write(settings(info))


def settings(info: records.GroupInfo) -> str:
    s = info.settings
    return table.fields(
        [
            ("group", info.name),
            ("generation", info.generation),
            ("strategy", info.strategy),
            ("mode", s.mode),
            ("ordered", s.ordered),
            ("ack_deadline_ms", s.ack_deadline_ms),
            ("max_attempts", s.max_attempts),
            # Empty: RocketMQ's levels, the default.
            ("retry_delays_ms", ",".join(map(str, s.retry_delays_ms)) or "default"),
            ("session_timeout_ms", s.session_timeout_ms),
            ("dead_letters", info.dead_letters),
        ]
    )


def reset_target(options: dict[str, Any]) -> str:
    """Which reset the flags ask for (the local and the remote command share it)."""
    if options["to_earliest"]:
        return "earliest"
    if options["to_latest"]:
        return "latest"
    if options["to_timestamp"] is not None:
        return "timestamp"
    if options["shift_by"] is not None:
        return "shift"
    return "offsets"


def handle_reset(command: BaseCommand, options: dict[str, Any]) -> None:
    to = reset_target(options)
    group, topic = options["group"], options["topic"]
    target: dict[str, Any] = {
        "timestamp_ms": options["to_timestamp"],
        "offsets": dict(options["to_offset"] or []),
        "shift_by": options["shift_by"],
    }
    if options["dry_run"]:
        preview = groups.preview_reset(keys.CONSOLE, group, topic, to, **target)
        command.stdout.write(
            table.render(
                ("topic", "partition", "committed", "target", "delta"),
                [(topic, r.partition, r.current, r.target, f"{r.delta:+d}") for r in preview],
            )
        )
        command.stdout.write("dry run: nothing moved")
        return
    params = {"to": to, **target, "force": options["force"]}
    params["offsets"] = {str(p): o for p, o in target["offsets"].items()}
    result = audit.audited(
        "group.reset",
        f"{group}/{topic}",
        params,
        lambda: groups.reset_offsets(
            keys.CONSOLE, group, topic, to, force=options["force"], **target
        ),
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


at = table.at


def handle_delete(command: BaseCommand, options: dict[str, Any]) -> None:
    group = options["group"]
    audit.audited(
        "group.delete",
        group,
        {"force": options["force"]},
        lambda: groups.delete_group(keys.CONSOLE, group, force=options["force"]),
    )
    command.stdout.write(f"deleted group {group}")
