import pytest

from broker.core import errors, filters


@pytest.mark.parametrize("expression", [None, "", "*", "  *  "])
def test_parse_tags__everything(expression):
    assert filters.parse_tags(expression) is None


def test_parse_tags__alternatives():
    assert filters.parse_tags("a || b ||c") == frozenset({"a", "b", "c"})


@pytest.mark.parametrize("expression", ["a ||", "|| b", "a || * "])
def test_parse_tags__malformed(expression):
    with pytest.raises(errors.InvalidFilter):
        filters.parse_tags(expression)


def test_filter_matches__tags():
    f = filters.parse_filter({"tags": "created || paid"})
    assert f.matches("paid", {})
    assert not f.matches("shipped", {})
    assert not f.matches(None, {})  # untagged messages pass only "*"
    assert filters.EVERYTHING.matches(None, {})


def test_filter_matches__header_conditions():
    f = filters.parse_filter(
        {
            "headers": [
                {"name": "region", "eq": "eu"},
                {"name": "kind", "in": ["a", "b"]},
                {"name": "trace", "exists": True},
            ]
        }
    )
    assert f.matches(None, {"region": "eu", "kind": "b", "trace": ""})
    assert not f.matches(None, {"region": "us", "kind": "b", "trace": "1"})
    assert not f.matches(None, {"region": "eu", "kind": "c", "trace": "1"})
    assert not f.matches(None, {"region": "eu", "kind": "a"})


def test_filter__everything_flag():
    assert filters.parse_filter(None).is_everything
    assert not filters.parse_filter({"tags": "a"}).is_everything


@pytest.mark.parametrize(
    "spec",
    [
        "tags",
        {"tag": "a"},
        {"tags": 5},
        {"headers": {"name": "x"}},
        {"headers": [{"eq": "x"}]},
        {"headers": [{"name": "x"}]},
        {"headers": [{"name": "x", "eq": "1", "in": ["1"]}]},
        {"headers": [{"name": "x", "eq": 1}]},
        {"headers": [{"name": "x", "in": []}]},
        {"headers": [{"name": "x", "exists": False}]},
        {"headers": [{"name": "x", "gt": "1"}]},
    ],
)
def test_parse_filter__invalid(spec):
    with pytest.raises(errors.InvalidFilter):
        filters.parse_filter(spec)
