"""The console `manage.py ferry <noun> <verb>`, one broker/cli module per noun (docs/console.md)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from broker.cli import apikey, bootstrap, consume, dlq, groups, produce, scheduled, topics
from broker.core import errors

NOUNS = (topics, produce, consume, scheduled, groups, dlq, apikey, bootstrap)


class Command(BaseCommand):
    help = (
        "Ferry's console: topics, produce, consume, scheduled (delayed) messages, groups, "
        "dead letters (dlq), API keys and first-start bootstrap."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        nouns = parser.add_subparsers(dest="noun", required=True, metavar="<noun>")
        for noun in NOUNS:
            noun.add_parser(nouns)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            options["handler"](self, options)
        except errors.BrokerError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
