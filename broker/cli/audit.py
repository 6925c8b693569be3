"""Console noun `audit`: list the audit log; and the console's side of writing it (console.md)."""

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from django.core.management.base import BaseCommand

from broker.cli import arguments, table
from broker.core import audit, keys
from broker.core.records import Actor

T = TypeVar("T")

CONSOLE_ACTOR = Actor(name="console", source="console")


def audited(
    action: str,
    target: str,
    params: dict[str, Any],
    call: Callable[[], T],
    summarize: Callable[[T], dict[str, Any]] | None = None,
) -> T:
    """Run a console command's core call and write it to the audit log as the console."""
    return audit.audited(CONSOLE_ACTOR, action, target, params, call, summarize)


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser(
        "audit", help="The audit log: who changed what, when, with what result."
    )
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")
    list_ = verbs.add_parser("list", help="Entries, newest first.")
    list_.add_argument("--action", help="e.g. topic.purge, group.reset")
    list_.add_argument("--actor", help='"console", "key:<name>" or "user:<username>"')
    list_.add_argument("--source", choices=audit.SOURCES)
    list_.add_argument("--target", metavar="TEXT", help="Targets containing TEXT.")
    list_.add_argument(
        "--before-id", type=arguments.positive_int, metavar="ID", help="Older than ID (next page)."
    )
    list_.add_argument(
        "--limit", type=arguments.positive_int, default=50, metavar="N", help="Default 50."
    )
    list_.set_defaults(handler=handle_list)


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    page = audit.list_audit(
        keys.CONSOLE,
        actor=options["actor"],
        action=options["action"],
        source=options["source"],
        target_contains=options["target"],
        before_id=options["before_id"],
        limit=options["limit"],
    )
    rows = [
        (
            e.id,
            table.at(e.at_ms),
            e.actor,
            e.source,
            e.action,
            e.target,
            e.outcome,
            orjson.dumps(e.params).decode() if e.params else None,
        )
        for e in page.items
    ]
    command.stdout.write(
        table.render(("id", "at", "actor", "source", "action", "target", "outcome", "params"), rows)
    )
    if page.next_before_id is not None:
        command.stdout.write(f"more: --before-id {page.next_before_id}")
