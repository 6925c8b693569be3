"""Console noun `dlq`: browse, redrive and purge a group's dead letters (docs/console.md)."""

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from broker.cli import arguments, audit, table
from broker.cli import groups as group_noun
from broker.core import keys, retries

ERROR_CHARS = 40
INT64_MAX = 2**63 - 1


def dead_letter_id(text: str) -> int:
    """A dead letter's id: a positive 64-bit integer."""
    value = arguments.positive_int(text)
    if value > INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT64_MAX}, got {value}")
    return value


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser(
        "dlq", help="A group's dead letters: list them, redrive them to the group, purge them."
    )
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")

    list_ = verbs.add_parser("list", help="The group's dead letters, oldest first, a page at once.")
    list_.add_argument("group")
    add_selection(list_)
    list_.add_argument(
        "--limit",
        type=arguments.positive_int,
        default=100,
        metavar="N",
        help="At most N dead letters (default 100).",
    )
    list_.add_argument(
        "--after-id",
        type=dead_letter_id,
        metavar="ID",
        help="Start after this ID (the next page).",
    )
    list_.set_defaults(handler=handle_list)

    redrive = verbs.add_parser(
        "redrive",
        help="Send dead letters back to the group: delivered again at once, attempts from 1.",
    )
    add_targets(redrive)
    redrive.set_defaults(handler=handle_redrive)

    purge = verbs.add_parser("purge", help="Delete dead letters for good.")
    add_targets(purge)
    purge.set_defaults(handler=handle_purge)


def add_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", metavar="T", help="Only this topic's dead letters.")
    parser.add_argument(
        "--reason",
        choices=retries.REASONS,
        help="Only those dead-lettered for this reason.",
    )


def add_targets(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("group")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--id",
        dest="ids",
        action="append",
        type=dead_letter_id,
        metavar="ID",
        help="This dead letter (repeat for more); an unknown one changes nothing.",
    )
    which.add_argument(
        "--all",
        action="store_true",
        help="Every dead letter of the group (or of --topic/--reason).",
    )
    add_selection(parser)


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    page = retries.list_dead_letters(
        keys.CONSOLE,
        options["group"],
        topic_name=options["topic"],
        reason=options["reason"],
        after_id=options["after_id"],
        limit=options["limit"],
    )
    # Broadcast members have their own dead letters: a member column then says whose.
    by_member = any(d.subscriber for d in page.items)
    rows = [
        (
            d.id,
            d.topic,
            *((d.subscriber or None,) if by_member else ()),
            d.partition,
            d.offset,
            d.reason,
            d.attempts,
            group_noun.at(d.dead_ms),
            preview(d.last_error),
        )
        for d in page.items
    ]
    headers = (
        "id",
        "topic",
        *(("member",) if by_member else ()),
        "partition",
        "offset",
        "reason",
        "attempts",
        "dead at",
        "last error",
    )
    command.stdout.write(table.render(headers, rows))
    if page.next_after_id is not None:
        command.stdout.write(
            f"\n{len(page.items)} of {page.total}; next page: --after-id {page.next_after_id}"
        )


def handle_redrive(command: BaseCommand, options: dict[str, Any]) -> None:
    result = audit.audited(
        "dlq.redrive",
        options["group"],
        selection(options),
        lambda: retries.redrive_dead_letters(
            keys.CONSOLE,
            options["group"],
            options["ids"],
            topic_name=options["topic"],
            reason=options["reason"],
        ),
        lambda r: {"redriven": r.redriven, "missing": len(r.missing)},
    )
    # Missing: retention removed the original message; the dead letter stays in the queue.
    missing = ", ".join(map(str, result.missing)) or "none"
    command.stdout.write(f"redriven {result.redriven}; missing: {missing}")


def handle_purge(command: BaseCommand, options: dict[str, Any]) -> None:
    purged = audit.audited(
        "dlq.purge",
        options["group"],
        selection(options),
        lambda: retries.purge_dead_letters(
            keys.CONSOLE,
            options["group"],
            options["ids"],
            topic_name=options["topic"],
            reason=options["reason"],
        ),
        lambda n: {"purged": n},
    )
    command.stdout.write(f"purged {purged}")


def selection(options: dict[str, Any]) -> dict[str, Any]:
    """The audit log's parameters of a redrive or purge: which letters."""
    return {"ids": options["ids"], "topic": options["topic"], "reason": options["reason"]}


def preview(error: str) -> str | None:
    """The error on one line, cut to ERROR_CHARS; None (shown as '-') when there is none."""
    text = " ".join(error.split())
    if len(text) > ERROR_CHARS:
        return text[: ERROR_CHARS - 1] + "…"
    return text or None
