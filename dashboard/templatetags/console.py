"""Formatting for the console's templates: numbers, sizes, times and durations."""

import datetime as dt
import json
from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()


@register.filter
def number(value: Any) -> str:
    """1234567 → "1,234,567"; None → "—"."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


@register.filter
def size(value: Any) -> str:
    """Bytes in powers of 1000: 12_300_000 → "12.3 MB"."""
    if value is None:
        return "—"
    amount = float(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(amount) < 1000 or unit == "TB":
            return f"{int(amount)} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1000
    return f"{amount:.1f} TB"  # pragma: no cover


@register.filter
def rate(value: Any) -> str:
    """Messages per second, one decimal under 10."""
    if value is None:
        return "—"
    amount = float(value)
    if abs(amount) < 0.05:
        return "0.0/s"
    return f"{amount:.1f}/s" if abs(amount) < 10 else f"{amount:,.0f}/s"


@register.filter
def at(value_ms: Any) -> SafeString | str:
    """Epoch milliseconds as <time>: ISO UTC for machines, localized in the page by console.js."""
    if value_ms is None:
        return "—"
    moment = dt.datetime.fromtimestamp(int(value_ms) / 1000, tz=dt.UTC)
    iso = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return format_html(
        '<time datetime="{}">{}</time>', iso, moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    )


@register.filter
def duration(value_ms: Any) -> str:
    """Milliseconds as a short duration: 1500 → "1.5 s", 90_000 → "1 min 30 s"."""
    if value_ms is None:
        return "—"
    ms = int(value_ms)
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d {hours % 24} h"


@register.filter
def seconds(value_s: Any) -> str:
    """Seconds as a short duration ("—" when unknown)."""
    if value_s is None:
        return "—"
    return duration(float(value_s) * 1000)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.simple_tag(takes_context=True)
def query(context: Any, **changes: Any) -> str:
    """The current query string with some parameters replaced (None or "" removes one)."""
    params = context["request"].GET.copy()
    for name, value in changes.items():
        if value is None or value == "":
            params.pop(name, None)
        else:
            params[name] = value
    encoded = params.urlencode()
    return f"?{encoded}" if encoded else "?"


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    """mapping[key], or None: for dicts keyed by a variable (a topic's lag estimate)."""
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def decoded(value: Any) -> str:
    """Bytes as text for a preview; binary shows its size instead."""
    if not isinstance(value, bytes | bytearray | memoryview):
        return str(value)
    raw = bytes(value)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"({len(raw):,} bytes of binary)"


@register.filter
def dictquery(values: Any) -> str:
    """A dict of filters as a query string, leaving out the empty ones."""
    from urllib.parse import urlencode

    return urlencode({k: v for k, v in dict(values).items() if v not in (None, "")})
