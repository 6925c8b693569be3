"""Console noun `apikey`: create, list and revoke API keys (docs/console.md)."""

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from broker.cli import audit, table
from broker.core import keys


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    noun = nouns.add_parser("apikey", help="Create, list and revoke API keys.")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="<verb>")

    create = verbs.add_parser(
        "create", help="Create a key; its secret is the last line of output, shown once."
    )
    create.add_argument("name")
    create.add_argument(
        "--allow",
        action="append",
        required=True,
        metavar="PERM",
        help="ACTION:PATTERN: produce, consume or admin on a topic glob, e.g. produce:orders.*",
    )
    create.set_defaults(handler=handle_create)

    verbs.add_parser("list", help="List keys, revoked ones included.").set_defaults(
        handler=handle_list
    )

    revoke = verbs.add_parser(
        "revoke", help="Revoke a key; it stops working within FERRY_AUTH_CACHE_SECONDS (1 s)."
    )
    revoke.add_argument("name")
    revoke.set_defaults(handler=handle_revoke)


def handle_create(command: BaseCommand, options: dict[str, Any]) -> None:
    permissions = [keys.parse_permission(text) for text in options["allow"]]
    info, secret = audit.audited(
        "key.create",
        options["name"],
        {"permissions": [str(p) for p in permissions]},
        lambda: keys.create_api_key(keys.CONSOLE, options["name"], permissions),
        lambda created: {"prefix": created[0].prefix},
    )
    command.stdout.write(f"created API key {info.name}")
    for permission in info.permissions:
        command.stdout.write(f"  allow {permission}")
    command.stdout.write("secret (shown once; send as 'Authorization: Bearer <secret>'):")
    # Alone on the last line, so scripts can take it with `tail -n1`.
    command.stdout.write(secret)


def handle_list(command: BaseCommand, options: dict[str, Any]) -> None:
    rows = [
        (
            k.name,
            k.prefix,
            " ".join(str(p) for p in k.permissions),
            k.revoked,
            k.created_by or None,
            None if k.last_used_ms is None else table.at(k.last_used_ms),
        )
        for k in keys.list_api_keys(keys.CONSOLE)
    ]
    command.stdout.write(
        table.render(("name", "prefix", "permissions", "revoked", "created by", "last used"), rows)
    )


def handle_revoke(command: BaseCommand, options: dict[str, Any]) -> None:
    name = options["name"]
    info = audit.audited("key.revoke", name, {}, lambda: keys.revoke_api_key(keys.CONSOLE, name))
    command.stdout.write(f"revoked API key {info.name}")
