"""Console noun `messages`: look messages up by key or id, show one, export (docs/console.md)."""

import argparse
import base64
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from broker.cli import arguments, table
from broker.core import browse, keys, records

PREVIEW_CHARS = 60


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser(
        "messages", help="Look stored messages up by key or id, show one, export JSON lines."
    )
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")

    lookup = verbs.add_parser(
        "lookup", help="Messages with a key or a client message id, newest first (indexed)."
    )
    lookup.add_argument("topic")
    by = lookup.add_mutually_exclusive_group(required=True)
    by.add_argument("--key")
    by.add_argument("--id", dest="client_id", metavar="ID", help="The client message id.")
    by.add_argument("--tag", help="Scans newest first, at most --scan-limit messages.")
    lookup.add_argument("--partition", type=int, metavar="P")
    lookup.add_argument("--limit", type=arguments.positive_int, default=50, metavar="N")
    lookup.add_argument("--scan-limit", type=arguments.positive_int, default=10_000, metavar="N")
    lookup.set_defaults(handler=handle_lookup)

    show = verbs.add_parser("show", help="One message: its fields and its whole value.")
    show.add_argument("topic")
    show.add_argument("partition", type=int)
    show.add_argument("offset", type=int)
    show.set_defaults(handler=handle_show)

    export = verbs.add_parser("export", help="Write messages as JSON lines to stdout.")
    export.add_argument("topic")
    export.add_argument("--partition", type=int, metavar="P")
    export.add_argument("--from-offset", type=int, metavar="O")
    export.add_argument("--to-offset", type=int, metavar="O", help="Exclusive.")
    export.add_argument("--key")
    export.add_argument("--limit", type=arguments.positive_int, default=100_000, metavar="N")
    export.set_defaults(handler=handle_export)


def handle_lookup(command: BaseCommand, options: dict[str, Any]) -> None:
    result = browse.search_messages(
        keys.CONSOLE,
        options["topic"],
        key=options["key"],
        client_id=options["client_id"],
        tag=options["tag"],
        partition=options["partition"],
        limit=options["limit"],
        scan_limit=options["scan_limit"],
    )
    rows = [
        (m.partition, m.offset, table.at(m.timestamp_ms), m.key, m.client_id, m.tag, preview(m))
        for m in result.items
    ]
    command.stdout.write(
        table.render(("partition", "offset", "time", "key", "id", "tag", "value"), rows)
    )
    if not result.indexed:
        reach = "the start" if result.complete else "the scan limit"
        command.stdout.write(f"scanned {result.scanned} message(s), up to {reach}")


def handle_show(command: BaseCommand, options: dict[str, Any]) -> None:
    m = browse.get_message(keys.CONSOLE, options["topic"], options["partition"], options["offset"])
    command.stdout.write(
        table.fields(
            [
                ("partition", m.partition),
                ("offset", m.offset),
                ("time", table.at(m.timestamp_ms)),
                ("key", m.key),
                ("id", m.client_id),
                ("tag", m.tag),
                ("headers", " ".join(f"{k}={v}" for k, v in m.headers.items()) or None),
                ("bytes", m.size_bytes),
                ("value", value_text(m)),
            ]
        )
    )


def handle_export(command: BaseCommand, options: dict[str, Any]) -> None:
    if options["to_offset"] is not None and options["partition"] is None:
        raise CommandError("--to-offset needs --partition.")
    lines = browse.export_messages(
        keys.CONSOLE,
        options["topic"],
        partition=options["partition"],
        from_offset=options["from_offset"],
        to_offset=options["to_offset"],
        key=options["key"],
        limit=options["limit"],
    )
    for line in lines:
        command.stdout.write(line.decode(), ending="")


def value_text(m: records.BrowsedMessage) -> str:
    """JSON as stored, else UTF-8 text, else base64 (marked b64:)."""
    if m.is_json:
        return m.value.decode()
    try:
        return m.value.decode()
    except UnicodeDecodeError:
        return "b64:" + base64.b64encode(m.value).decode()


def preview(m: records.BrowsedMessage) -> str:
    text = value_text(m)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
