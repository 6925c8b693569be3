"""The console `manage.py ferry <noun> <verb>`, one broker/cli module per noun (docs/console.md)."""

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections

from broker.cli import (
    apikey,
    audit,
    bootstrap,
    consume,
    dlq,
    groups,
    messages,
    produce,
    remote,
    scheduled,
    topics,
    transactions,
)
from broker.core import errors

NOUNS = (
    topics,
    produce,
    consume,
    messages,
    scheduled,
    groups,
    dlq,
    transactions,
    apikey,
    audit,
    bootstrap,
)


class Command(BaseCommand):
    help = (
        "Ferry's console: topics, produce, consume, scheduled (delayed) messages, groups, "
        "dead letters (dlq), transactions, API keys and first-start bootstrap."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--url",
            default=os.environ.get("FERRY_URL") or None,
            metavar="URL",
            help="Talk to the broker at URL over REST (key in FERRY_KEY), not to the database. "
            "Default: FERRY_URL.",
        )
        nouns = parser.add_subparsers(dest="noun", required=True, metavar="<noun>")
        for noun in NOUNS:
            noun.add_parser(nouns)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options.get("url"):
                remote.run(self, options, options["url"])
            else:
                options["handler"](self, options)
        except errors.BrokerError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        except OperationalError as exc:
            if connections[DEFAULT_DB_ALIAS].connection is not None:
                raise  # the database opened: this is another failure, keep its traceback
            raise CommandError(database_unreachable(exc)) from None


def database_unreachable(exc: Exception) -> str:
    """One line saying which database could not be opened, and why."""
    settings = connections[DEFAULT_DB_ALIAS].settings_dict
    if connections[DEFAULT_DB_ALIAS].vendor == "sqlite":
        where = f"{settings['NAME']} (FERRY_DATA_DIR={os.environ.get('FERRY_DATA_DIR', 'unset')})"
    else:
        where = f"{settings.get('HOST') or 'localhost'}:{settings.get('PORT') or 'default'}"
        where += f"/{settings.get('NAME')}"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot open the database at {where}: {reason}"
