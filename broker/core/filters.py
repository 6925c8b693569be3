"""Pure subscription filters: tags (RocketMQ's "a || b", "*") and header conditions.

See docs/semantics.md#filters. A filter is parsed once, when a member subscribes, and matched
in the broker against each message before delivery.
"""

from dataclasses import dataclass
from typing import Any

from broker.core import errors

MAX_TAGS = 100
MAX_CONDITIONS = 20


@dataclass(frozen=True)
class HeaderCondition:
    name: str
    # Exactly one of: equals a value, is one of values, or exists (present with any value).
    equals: str | None = None
    one_of: frozenset[str] | None = None
    exists: bool = False

    def matches(self, headers: dict[str, str]) -> bool:
        value = headers.get(self.name)
        if self.exists:
            return value is not None
        if self.one_of is not None:
            return value in self.one_of
        return value is not None and value == self.equals


@dataclass(frozen=True)
class Filter:
    # None: every tag, untagged messages included ("*").
    tags: frozenset[str] | None = None
    headers: tuple[HeaderCondition, ...] = ()

    @property
    def is_everything(self) -> bool:
        return self.tags is None and not self.headers

    def matches(self, tag: str | None, headers: dict[str, str]) -> bool:
        """Whether a message with this tag and these headers passes (all conditions hold)."""
        if self.tags is not None and tag not in self.tags:
            return False
        return all(condition.matches(headers) for condition in self.headers)


EVERYTHING = Filter()


def parse_tags(expression: str | None) -> frozenset[str] | None:
    """RocketMQ's tag expression: "a || b || c", or "*" (or nothing) for every message."""
    if expression is None or expression.strip() in ("", "*"):
        return None
    tags = frozenset(part.strip() for part in expression.split("||"))
    if "" in tags or "*" in tags:
        raise errors.InvalidFilter(
            "A tag expression is tags separated by '||', or '*'.", tags=expression
        )
    if len(tags) > MAX_TAGS:
        raise errors.InvalidFilter(f"A filter names at most {MAX_TAGS} tags.", tags=expression)
    return tags


def _parse_condition(spec: Any) -> HeaderCondition:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise errors.InvalidFilter("A header condition is an object with a 'name'.", condition=spec)
    operators = {"eq", "in", "exists"} & spec.keys()
    if len(operators) != 1 or set(spec) - {"name", "eq", "in", "exists"}:
        raise errors.InvalidFilter(
            "A header condition has a 'name' and exactly one of 'eq', 'in', 'exists'.",
            condition=spec,
        )
    name = spec["name"]
    if "eq" in spec:
        if not isinstance(spec["eq"], str):
            raise errors.InvalidFilter("'eq' takes a string.", condition=spec)
        return HeaderCondition(name, equals=spec["eq"])
    if "in" in spec:
        values = spec["in"]
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) for v in values)
        ):
            raise errors.InvalidFilter("'in' takes a non-empty list of strings.", condition=spec)
        return HeaderCondition(name, one_of=frozenset(values))
    if spec["exists"] is not True:
        raise errors.InvalidFilter("'exists' takes true.", condition=spec)
    return HeaderCondition(name, exists=True)


def parse_filter(spec: dict[str, Any] | None) -> Filter:
    """{"tags": "a || b", "headers": [{"name": "region", "eq": "eu"}, …]}; None: everything."""
    if spec is None:
        return EVERYTHING
    if not isinstance(spec, dict) or set(spec) - {"tags", "headers"}:
        raise errors.InvalidFilter(
            "A filter is an object with 'tags' and/or 'headers'.", filter=spec
        )
    tags = spec.get("tags")
    if tags is not None and not isinstance(tags, str):
        raise errors.InvalidFilter("'tags' is a string such as \"a || b\".", filter=spec)
    conditions = spec.get("headers") or []
    if not isinstance(conditions, list) or len(conditions) > MAX_CONDITIONS:
        raise errors.InvalidFilter(
            f"'headers' is a list of at most {MAX_CONDITIONS} conditions.", filter=spec
        )
    return Filter(parse_tags(tags), tuple(_parse_condition(c) for c in conditions))
