"""Errors of the `ferry` data source that a Spark user can act on (docs/pipeline.md)."""

import ssl

from ferry_client import BrokerUnavailable, FerryError
from pipeline.options import Connection


class FerrySourceError(RuntimeError):
    """The broker refused or could not be reached; the message says which and what to check."""


def explain(conn: Connection, exc: Exception, what: str) -> FerrySourceError:
    """A broker failure as an error a Spark user can act on."""
    if isinstance(exc, FerryError) and not (
        isinstance(exc, BrokerUnavailable) and exc.code == "unavailable"
    ):
        hint = {
            "unauthenticated": "check the 'apiKey' option",
            "permission_denied": "the API key lacks the permission on this topic",
            "topic_not_found": "check the 'topic' option, or create the topic",
        }.get(exc.code, "")
        suffix = f" ({hint})" if hint else ""
        return FerrySourceError(
            f"Ferry at {conn.url} refused {what}: {exc.code}: {exc.message}{suffix}"
        )
    check = "the 'caFile' option" if untrusted(exc) else "the 'url' option"
    return FerrySourceError(
        f"Could not reach Ferry at {conn.url} for {what} (check {check}): {exc}"
    )


def untrusted(exc: BaseException | None) -> bool:
    """Whether a failure, or one of its causes, is the broker's certificate not trusted."""
    seen: set[int] = set()  # a chain can loop back on itself
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
