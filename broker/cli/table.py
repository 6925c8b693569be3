"""Plain-text tables and field lists for the console's list and describe verbs (docs/console.md)."""

import datetime
from collections.abc import Iterable, Sequence


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns left-aligned under upper-case headers, two spaces apart."""
    lines = [[h.upper() for h in headers], *([cell(v) for v in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def fields(pairs: Sequence[tuple[str, object]]) -> str:
    """One 'name  value' line per pair, values aligned."""
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name.ljust(width)}  {cell(value)}" for name, value in pairs)


def at(ms: int) -> str:
    """A time in ms since the epoch as ISO 8601 in UTC."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
