"""Console noun `bootstrap`: a new broker's first API key and superuser (docs/console.md)."""

import argparse
import secrets
from typing import Any

from django.contrib import auth
from django.core.management.base import BaseCommand, CommandError

from broker.core import keys

ADMIN_NAME = "admin"


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    parser = nouns.add_parser(
        "bootstrap",
        help="First start: create an 'admin' API key and an 'admin' superuser if there are none.",
    )
    parser.set_defaults(handler=handle)


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    lines = []
    if not keys.list_api_keys(keys.CONSOLE):
        admin_all = keys.parse_permission("admin:*")
        _, secret = keys.create_api_key(keys.CONSOLE, ADMIN_NAME, [admin_all])
        lines += [
            f"API key (shown once): {secret}",
            f"  name {ADMIN_NAME}, allow {admin_all}; send as 'Authorization: Bearer <key>'",
        ]
    password = create_superuser()
    if password is not None:
        lines += [f"Dashboard login: {ADMIN_NAME} / {password}"]
    if not lines:
        command.stdout.write("Ferry is already set up: an API key and a superuser exist.")
        return
    command.stdout.write(
        frame(["Ferry is set up. Save these now: they are not shown again.", "", *lines])
    )


def create_superuser() -> str | None:
    """Create the 'admin' superuser with a random password, unless any superuser exists."""
    # Django's own auth tables, not the broker's: the dashboard login is outside the core.
    users = auth.get_user_model()._default_manager
    if users.filter(is_superuser=True).exists():
        return None
    if users.filter(**{auth.get_user_model().USERNAME_FIELD: ADMIN_NAME}).exists():
        raise CommandError(
            f"A user named {ADMIN_NAME!r} exists but is not a superuser; "
            "run `manage.py createsuperuser` to make one."
        )
    password = secrets.token_urlsafe(12)
    users.create_superuser(ADMIN_NAME, email="", password=password)
    return password


def frame(lines: list[str]) -> str:
    width = max(len(line) for line in lines)
    rule = "+" + "-" * (width + 2) + "+"
    return "\n".join([rule, *(f"| {line.ljust(width)} |" for line in lines), rule])
