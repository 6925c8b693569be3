"""Console noun `transactions`: list, show, commit or roll back a transaction (docs/console.md)."""

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from broker.cli import arguments, audit, scheduled, table
from broker.core import keys, log, transactions
from broker.core.records import TransactionInfo


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser(
        "transactions", help="Transactions: list, show, commit or roll back one."
    )
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")

    list_ = verbs.add_parser("list", help="Transactions, newest first.")
    list_.add_argument("--state", choices=transactions.STATES)
    list_.add_argument("--producer", metavar="ID", help="Only this producer id's.")
    list_.add_argument(
        "--limit",
        type=arguments.positive_int,
        default=100,
        metavar="N",
        help="At most N transactions (default 100).",
    )
    list_.set_defaults(handler=handle_list)

    for verb, helped, handler in (
        ("show", "One transaction: state, reason, what it carries, its check-backs.", handle_show),
        ("commit", "Commit an open transaction: its messages become visible.", handle_commit),
        ("rollback", "Roll back an open transaction: nothing it carries happens.", handle_rollback),
    ):
        parser = verbs.add_parser(verb, help=helped)
        parser.add_argument("id", type=scheduled.scheduled_id)
        parser.set_defaults(handler=handler)


def age(info: TransactionInfo) -> str:
    """How long ago it began, in whole seconds (or minutes, hours)."""
    seconds = max(0, (log.now_ms() - info.created_ms) // 1000)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    found = transactions.list_transactions(
        keys.CONSOLE, options["state"], options["producer"], min(options["limit"], 1000)
    )
    rows = [
        (
            t.id,
            t.kind,
            t.producer_id or None,
            t.epoch,
            t.state,
            t.reason or None,
            age(t),
            t.messages,
            ",".join(t.topics) or None,
        )
        for t in found
    ]
    command.stdout.write(
        table.render(
            ("id", "kind", "producer", "epoch", "state", "reason", "age", "messages", "topics"),
            rows,
        )
    )


def describe(info: TransactionInfo) -> str:
    return table.fields(
        [
            ("id", info.id),
            ("kind", info.kind),
            ("state", info.state),
            ("reason", info.reason or None),
            ("producer", info.producer_id or None),
            ("epoch", info.epoch),
            ("owner", info.owner),
            ("began", f"{scheduled.due(info.created_ms)} ({age(info)} ago)"),
            ("times out", scheduled.due(info.deadline_ms)),
            ("ended", scheduled.due(info.ended_ms) if info.ended_ms is not None else None),
            ("messages", info.messages),
            ("topics", ", ".join(info.topics) or None),
            ("offsets", info.offsets),
            ("acks", info.acks),
            ("check url", info.check_url or None),
            ("checks", info.checks),
            ("last check", info.last_check or None),
        ]
    )


def handle_show(command: BaseCommand, options: dict[str, Any]) -> None:
    command.stdout.write(describe(transactions.get_transaction(keys.CONSOLE, options["id"])))


def handle_commit(command: BaseCommand, options: dict[str, Any]) -> None:
    tid = options["id"]
    result = audit.audited(
        "transaction.commit",
        str(tid),
        {},
        lambda: transactions.commit_transaction(keys.CONSOLE, tid),
        lambda r: {"messages": r.transaction.messages},
    )
    command.stdout.write(
        f"committed transaction {tid}: {result.transaction.messages} messages visible"
    )


def handle_rollback(command: BaseCommand, options: dict[str, Any]) -> None:
    tid = options["id"]
    info = audit.audited(
        "transaction.rollback",
        str(tid),
        {},
        lambda: transactions.rollback_transaction(keys.CONSOLE, tid),
        lambda i: {"messages": i.messages},
    )
    command.stdout.write(f"rolled back transaction {tid}: {info.messages} messages discarded")
