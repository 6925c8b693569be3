"""Console noun `scheduled`: list a topic's delayed messages, cancel one (docs/console.md)."""

import argparse
import base64
import datetime
from typing import Any

from django.core.management.base import BaseCommand

from broker.cli import arguments, audit, table
from broker.core import keys, log, records, scheduling

PREVIEW_CHARS = 40
INT64_MAX = 2**63 - 1


def scheduled_id(text: str) -> int:
    """A scheduled message's id: a positive 64-bit integer."""
    value = arguments.positive_int(text)
    if value > INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT64_MAX}, got {value}")
    return value


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser("scheduled", help="List a topic's delayed messages, cancel one.")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")

    list_ = verbs.add_parser("list", help="Delayed messages not released yet, soonest first.")
    list_.add_argument("topic")
    list_.add_argument(
        "--limit",
        type=arguments.positive_int,
        default=100,
        metavar="N",
        help="At most N messages (default 100).",
    )
    list_.add_argument(
        "--after", type=scheduled_id, metavar="ID", help="Start after this ID (the next page)."
    )
    list_.set_defaults(handler=handle_list)

    cancel = verbs.add_parser("cancel", help="Cancel a delayed message before it is released.")
    cancel.add_argument("id", type=scheduled_id)
    cancel.set_defaults(handler=handle_cancel)

    now = verbs.add_parser(
        "deliver-now", help="Make a delayed message due now: it is released within a moment."
    )
    now.add_argument("id", type=scheduled_id)
    now.set_defaults(handler=handle_deliver_now)

    reschedule = verbs.add_parser("reschedule", help="Move a delayed message's due time.")
    reschedule.add_argument("id", type=scheduled_id)
    when = reschedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--at-ms", type=int, metavar="MS", help="Due at MS since 1970 (UTC).")
    when.add_argument("--delay-ms", type=int, metavar="MS", help="Due MS from now.")
    reschedule.set_defaults(handler=handle_reschedule)


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    found = scheduling.list_scheduled(
        keys.CONSOLE, options["topic"], options["limit"], options["after"]
    )
    rows = [(s.id, due(s.deliver_at_ms), s.partition, s.key, s.tag, preview(s)) for s in found]
    command.stdout.write(table.render(("id", "due", "partition", "key", "tag", "value"), rows))


def handle_cancel(command: BaseCommand, options: dict[str, Any]) -> None:
    sid = options["id"]
    info = audit.audited(
        "scheduled.cancel",
        str(sid),
        {},
        lambda: scheduling.cancel_scheduled(keys.CONSOLE, sid),
        lambda i: {"topic": i.topic},
    )
    command.stdout.write(
        f"cancelled scheduled message {info.id} on {info.topic} (was due {due(info.deliver_at_ms)})"
    )


def handle_deliver_now(command: BaseCommand, options: dict[str, Any]) -> None:
    sid = options["id"]
    info = audit.audited(
        "scheduled.deliver_now",
        str(sid),
        {},
        lambda: scheduling.deliver_now(keys.CONSOLE, sid),
        lambda i: {"topic": i.topic},
    )
    command.stdout.write(f"scheduled message {info.id} on {info.topic} is due now")


def handle_reschedule(command: BaseCommand, options: dict[str, Any]) -> None:
    sid = options["id"]
    due_ms = options["at_ms"]
    if due_ms is None:
        due_ms = log.now_ms() + options["delay_ms"]
    info = audit.audited(
        "scheduled.reschedule",
        str(sid),
        {"deliver_at_ms": due_ms},
        lambda: scheduling.reschedule_scheduled(keys.CONSOLE, sid, due_ms),
        lambda i: {"topic": i.topic},
    )
    command.stdout.write(
        f"scheduled message {info.id} on {info.topic} is due {due(info.deliver_at_ms)}"
    )


def due(deliver_at_ms: int) -> str:
    """ISO 8601 in UTC; the raw milliseconds for a time no calendar date can show."""
    try:
        moment = datetime.datetime.fromtimestamp(deliver_at_ms / 1000, tz=datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{deliver_at_ms} ms"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def preview(info: records.ScheduledInfo) -> str:
    """The value as compact JSON (or base64 for bytes), cut to PREVIEW_CHARS."""
    text = info.value.decode() if info.is_json else "b64:" + base64.b64encode(info.value).decode()
    if len(text) > PREVIEW_CHARS:
        return text[: PREVIEW_CHARS - 1] + "…"
    return text
