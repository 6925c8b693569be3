"""Console noun `consume`: poll as a consumer group, one JSON line per message (docs/console.md)."""

import argparse
import contextlib
import signal
from typing import Any

import orjson
from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand, CommandError

from broker import wire
from broker.cli import arguments
from broker.core import delivery, errors, groups, keys, membership, records

FOLLOW_WAIT_MS = 1000


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    parser = nouns.add_parser(
        "consume", help="Print the group's next messages as JSON lines (and commit or ack them)."
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
        help="Join the group as a member and keep receiving its messages until Ctrl-C "
        "(or --max-total), acking each after it is printed; leave on exit.",
    )
    parser.add_argument(
        "--no-commit",
        action="store_true",
        help="Leave the committed offsets alone: the group sees these messages again. "
        "With --follow nothing is acked: the group redelivers the messages after its ack "
        "deadline (each time an attempt; past its max attempts they are dead-lettered), "
        "or at once when this consumer leaves.",
    )
    parser.add_argument(
        "--filter-tags",
        metavar="TAGS",
        help="With --follow: receive only messages with one of these tags, e.g. 'a || b' "
        "('*' for all); the others are skipped for this member.",
    )
    parser.add_argument(
        "--max-total", type=arguments.positive_int, metavar="N", help="Stop after N messages."
    )
    parser.set_defaults(handler=handle)


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    if not options["follow"]:
        if options["filter_tags"] is not None:
            raise CommandError("--filter-tags needs --follow: only a member has a filter.")
        poll(command, options)
        return
    # --follow is a group member: the group splits the topic's partitions among its members (or,
    # in broadcast mode, gives each all of them), each poll is a heartbeat, and leaving hands what
    # this member holds (partitions, unacked messages) to the others at once.
    tags = options["filter_tags"]
    subscription = None if tags is None else {"tags": tags}
    member = membership.join_group(
        keys.CONSOLE, options["group"], options["topic"], filter=subscription
    )
    command.stderr.write(
        f"joined group {member.group} as {member.member_id} "
        f"(generation {member.generation}, {member.mode}, partitions {list(member.partitions)})"
    )
    # A plain kill (SIGTERM) ends --follow as Ctrl-C does, so the finally below leaves the group.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        follow(command, options, member.member_id, subscription)
    finally:
        signal.signal(signal.SIGTERM, previous)
        # Already gone if it expired while stopped; nothing left to hand over then.
        with contextlib.suppress(errors.MemberNotFound):
            membership.leave_group(keys.CONSOLE, member.group, member.member_id)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def poll(command: BaseCommand, options: dict[str, Any]) -> None:
    """One plain group poll over every partition, no membership; commit what was printed."""
    result = groups.poll_messages(
        keys.CONSOLE, options["group"], options["topic"], poll_size(options, 0), False
    )
    write(command, [wire.message_out(m) for m in result.messages])
    # Commit after printing: a consumer killed in between sees the messages again
    # (at least once) instead of losing them.
    if result.next_offsets and not options["no_commit"]:
        groups.commit_offsets(keys.CONSOLE, result.group, result.topic, result.next_offsets)
    if result.expired:
        command.stderr.write(f"{result.expired} expired message(s) dead-lettered (message_ttl_ms)")
    if not result.messages:
        command.stderr.write(f"no new messages for group {result.group} on {result.topic}")


def follow(
    command: BaseCommand,
    options: dict[str, Any],
    member_id: str,
    subscription: dict[str, Any] | None,
) -> None:
    printed = 0
    max_total = options["max_total"]
    # Ctrl-C is how --follow ends; what was printed is acked, what was not goes back to the group.
    with contextlib.suppress(KeyboardInterrupt):
        while max_total is None or printed < max_total:
            try:
                result = deliver(options, member_id, printed)
            except errors.MemberNotFound:
                # Silent past the session timeout (a stopped process): expired, so join again.
                membership.join_group(
                    keys.CONSOLE, options["group"], options["topic"], member_id, filter=subscription
                )
                continue
            write(command, [line(d) for d in result.deliveries])
            # Ack after printing: a consumer killed in between gets the messages again
            # (at least once) instead of losing them.
            if result.deliveries and not options["no_commit"]:
                receipts = [d.receipt for d in result.deliveries]
                settled = delivery.ack_messages(keys.CONSOLE, result.group, receipts)
                if settled.stale:
                    command.stderr.write(
                        f"{len(settled.stale)} message(s) were past the ack deadline when acked: "
                        "the group delivers them again"
                    )
            printed += len(result.deliveries)


def deliver(options: dict[str, Any], member_id: str, printed: int) -> records.DeliveryResult:
    """One long poll as the member, run so the core stays on this thread."""
    return async_to_sync(delivery.deliver_messages_async)(
        keys.CONSOLE,
        options["group"],
        options["topic"],
        member_id,
        poll_size(options, printed),
        max_wait_ms=FOLLOW_WAIT_MS,
    )


def poll_size(options: dict[str, Any], printed: int) -> int:
    """Messages to ask for: never more than --max-total leaves, so none is taken unprinted."""
    if options["max_total"] is None:
        return int(options["max_messages"])
    return min(options["max_messages"], options["max_total"] - printed)


def line(d: records.Delivery) -> dict[str, Any]:
    """A delivered message as printed: the REST shape and which attempt this is (1 = first)."""
    return {**wire.message_out(d.message), "attempt": d.attempt}


def write(command: BaseCommand, messages: list[dict[str, Any]]) -> None:
    for message in messages:
        command.stdout.write(orjson.dumps(message).decode())
    command.stdout.flush()
