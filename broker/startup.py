"""Start-up checks: a server or worker starts only on a reachable, migrated database (and Redis).

See docs/operations.md#start-up-checks. Every entry point runs the same rules: the server
(mqsite/asgi.py, under Daphne), the Celery worker (mqsite/celery.py) and scripts/run (which runs
`python -m broker.startup --before-migrate` before it migrates). A failed check prints one line
that says what is wrong and what to do, on stderr, and exits with status 1: no traceback.
"""

import argparse
import os
import re
import sys
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

from broker import settings as ferry_settings

REDIS_TIMEOUT_S = 2.0
EXIT_STATUS = 1


class StartupError(Exception):
    """A check failed; str() is the one line to print."""


def _reason(exc: BaseException) -> str:
    """The first line of an error, whitespace collapsed: what the driver said, briefly."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"\s+", " ", text)[:300].rstrip(".")


def database_location(alias: str = DEFAULT_DB_ALIAS) -> str:
    """Where the database is, without its password: host:port/name, or the SQLite file."""
    config: dict[str, Any] = connections[alias].settings_dict
    if config["ENGINE"].endswith("sqlite3"):
        return str(config["NAME"])
    host = config.get("HOST") or "localhost"
    port = f":{config['PORT']}" if config.get("PORT") else ""
    return f"{host}{port}/{config.get('NAME') or ''}"


def check_database(alias: str = DEFAULT_DB_ALIAS) -> None:
    connection = connections[alias]
    try:
        if getattr(connection, "pool", None) is not None:
            # A connection of its own, not the pool's: the driver's own error at once, not a
            # pool's timeout after FERRY_DB_POOL_TIMEOUT_SECONDS.
            params = connection.get_connection_params()
            with connection.Database.connect(**params) as direct:  # type: ignore[attr-defined]
                direct.execute("SELECT 1")
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        raise StartupError(
            f"the database at {database_location(alias)} cannot be reached: {_reason(exc)}; "
            "check DATABASE_URL (or FERRY_DATA_DIR) and that the database is running"
        ) from exc
    finally:
        connection.close()


def unapplied_migrations(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    connection = connections[alias]
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    finally:
        connection.close()
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]


def check_migrations(alias: str = DEFAULT_DB_ALIAS) -> None:
    try:
        missing = unapplied_migrations(alias)
    except Exception as exc:
        raise StartupError(
            f"the migrations of the database at {database_location(alias)} cannot be read: "
            f"{_reason(exc)}"
        ) from exc
    if missing:
        count = f"{len(missing)} migration{'s are' if len(missing) > 1 else ' is'}"
        raise StartupError(
            f"{count} not applied to the database at {database_location(alias)} "
            f"(first: {missing[0]}); run `python manage.py migrate`"
        )


def redis_location(url: str) -> str:
    """The Redis URL without its password."""
    return re.sub(r"//[^@/]*@", "//", url)


def check_redis() -> None:
    url = str(getattr(settings, "REDIS_URL", "") or "")
    if not url:
        return
    import redis

    client = redis.Redis.from_url(
        url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
    )
    try:
        client.ping()
    except Exception as exc:
        raise StartupError(
            f"Redis at {redis_location(url)} cannot be reached: {_reason(exc)}; "
            "check REDIS_URL and that Redis is running (unset REDIS_URL for one process)"
        ) from exc
    finally:
        client.close()


def check_environment() -> None:
    """Every FERRY_* variable set is of its setting's kind (a number, an integer, 1 or 0)."""
    wrong = ferry_settings.invalid_environment()
    if wrong is not None:
        raise StartupError(f"{wrong}; correct it or unset it")


def check(*, migrations: bool = True) -> None:
    """Raise StartupError for the first failed check: settings, database, migrations, Redis."""
    check_environment()
    check_database()
    if migrations:
        check_migrations()
    check_redis()
    for connection in connections.all(initialized_only=True):
        # A pool opened for the checks has threads of its own: a Celery worker forks its
        # children next, and they must open their own.
        close_pool = getattr(connection, "close_pool", None)
        if close_pool is not None:
            close_pool()


def check_or_exit(*, migrations: bool = True) -> None:
    """check(), and on failure one line on stderr and exit status 1."""
    try:
        check(migrations=migrations)
    except StartupError as exc:
        sys.stderr.write(f"Ferry: {exc}\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_STATUS) from None


def main(argv: list[str] | None = None) -> None:
    """`python -m broker.startup [--before-migrate]`: the checks, from a script."""
    parser = argparse.ArgumentParser(prog="python -m broker.startup", description=__doc__)
    parser.add_argument(
        "--before-migrate",
        action="store_true",
        help="skip the migrations check (the caller migrates next)",
    )
    args = parser.parse_args(argv)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mqsite.settings")
    django.setup()
    check_or_exit(migrations=not args.before_migrate)


if __name__ == "__main__":
    main()
