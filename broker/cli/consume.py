"""Console noun `consume`: poll as a consumer group, one JSON line per message (docs/console.md)."""

import argparse
import contextlib
import signal
from typing import Any

import orjson
from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand

from broker import wire
from broker.cli import arguments
from broker.core import errors, groups, keys, membership, records

FOLLOW_WAIT_MS = 1000


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    parser = nouns.add_parser(
        "consume", help="Print the group's next messages as JSON lines (and commit them)."
    )
    parser.add_argument("topic")
    parser.add_argument("--group", required=True, metavar="G")
    parser.add_argument(
        "--max-messages",
        type=arguments.positive_int,
        default=100,
        metavar="N",
        help="Messages per poll (default 100).",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="Join the group as a member and keep polling its partitions until Ctrl-C "
        "(or --max-total); leave on exit.",
    )
    parser.add_argument(
        "--no-commit",
        action="store_true",
        help="Leave the committed offsets alone: the group sees these messages again.",
    )
    parser.add_argument(
        "--max-total", type=arguments.positive_int, metavar="N", help="Stop after N messages."
    )
    parser.set_defaults(handler=handle)


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    if not options["follow"]:
        consume(command, options, None)
        return
    # --follow is a group member: the group splits the topic's partitions among its members,
    # each poll is a heartbeat, and leaving hands this member's partitions to the others at once.
    member = membership.join_group(keys.CONSOLE, options["group"], options["topic"])
    command.stderr.write(
        f"joined group {member.group} as {member.member_id} "
        f"(generation {member.generation}, partitions {list(member.partitions)})"
    )
    # A plain kill (SIGTERM) ends --follow as Ctrl-C does, so the finally below leaves the group.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        consume(command, options, member.member_id)
    finally:
        signal.signal(signal.SIGTERM, previous)
        # Already gone if it expired while stopped; nothing left to hand over then.
        with contextlib.suppress(errors.MemberNotFound):
            membership.leave_group(keys.CONSOLE, member.group, member.member_id)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def consume(command: BaseCommand, options: dict[str, Any], member_id: str | None) -> None:
    printed = 0
    max_total = options["max_total"]
    # Ctrl-C is how --follow ends; what was printed is committed, what was not is not.
    with contextlib.suppress(KeyboardInterrupt):
        while max_total is None or printed < max_total:
            try:
                result = poll(options, printed, member_id)
            except errors.MemberNotFound:
                # Silent past the session timeout (a stopped process): expired, so join again.
                membership.join_group(keys.CONSOLE, options["group"], options["topic"], member_id)
                continue
            write(command, result)
            # Commit after printing: a consumer killed in between sees the messages again
            # (at least once) instead of losing them.
            if result.next_offsets and not options["no_commit"]:
                groups.commit_offsets(keys.CONSOLE, result.group, result.topic, result.next_offsets)
            printed += len(result.messages)
            if not options["follow"]:
                if not result.messages:
                    command.stderr.write(
                        f"no new messages for group {result.group} on {result.topic}"
                    )
                return


def poll(options: dict[str, Any], printed: int, member_id: str | None) -> records.PollResult:
    """One poll; with --follow a long poll as the member, run so the core stays on this thread."""
    args = (keys.CONSOLE, options["group"], options["topic"], poll_size(options, printed), False)
    if member_id is None:
        return groups.poll_messages(*args)
    return async_to_sync(groups.poll_messages_async)(
        *args, max_wait_ms=FOLLOW_WAIT_MS, member_id=member_id
    )


def poll_size(options: dict[str, Any], printed: int) -> int:
    """Messages to ask for: never more than --max-total leaves, so none is committed unprinted."""
    if options["max_total"] is None:
        return int(options["max_messages"])
    return min(options["max_messages"], options["max_total"] - printed)


def write(command: BaseCommand, result: records.PollResult) -> None:
    for message in result.messages:
        command.stdout.write(orjson.dumps(wire.message_out(message)).decode())
    command.stdout.flush()
