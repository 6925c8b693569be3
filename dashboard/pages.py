"""What every console page shares: rendering with the roles, pages of lists, form parsing."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render as django_render

from broker.core import errors
from dashboard import access

T = TypeVar("T")
PAGE_SIZE = 25
MAX_PAGE_SIZE = 200


def render(
    request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    context.setdefault("can_operate", access.can_operate(request.user))
    return django_render(request, template, context, status=status)


@dataclass(frozen=True)
class Page:
    """One page of an in-memory list (short lists the core returns whole: topics, groups)."""

    items: Sequence[Any]
    number: int
    count: int
    size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.count // self.size))

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages

    @property
    def first_index(self) -> int:
        return (self.number - 1) * self.size + 1 if self.count else 0

    @property
    def last_index(self) -> int:
        return min(self.count, self.number * self.size)


def paginate(request: HttpRequest, rows: Sequence[T], size: int = PAGE_SIZE) -> Page:
    number = min(int_param(request, "page", 1, minimum=1), max(1, -(-len(rows) // size)))
    start = (number - 1) * size
    return Page(items=rows[start : start + size], number=number, count=len(rows), size=size)


def int_param(
    request: HttpRequest,
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """An integer query parameter, clamped; garbage falls back to the default."""
    try:
        value = int(request.GET.get(name, default))
    except (TypeError, ValueError):
        value = default
    if minimum is not None:
        value = max(minimum, value)
    if maximum is not None:
        value = min(maximum, value)
    return value


def optional_int(value: str | None, field: str) -> int | None:
    """A form field that may be empty; anything else must be an integer."""
    if value is None or value.strip() == "":
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise errors.InvalidRequest(f"{field} must be a whole number.", field=field) from None


def text_param(request: HttpRequest, name: str) -> str | None:
    value = request.GET.get(name, "").strip()
    return value or None


def text_list(request: HttpRequest, name: str) -> list[str]:
    return [v.strip() for v in request.GET.getlist(name) if v.strip()]


def partition_offsets(text: str) -> dict[int, int]:
    """ "0=120, 1=98" → {0: 120, 1: 98}; empty text → {}."""
    found: dict[int, int] = {}
    for item in text.replace("\n", ",").split(","):
        if item.strip():
            number, sep, offset = item.partition("=")
            partition = optional_int(number, "partition") if sep else None
            target = optional_int(offset, "offset") if sep else None
            if partition is None or target is None:
                raise errors.InvalidRequest(
                    f"{item.strip()!r} is not partition=offset (e.g. 0=120, 1=98)."
                )
            found[partition] = target
    return found
