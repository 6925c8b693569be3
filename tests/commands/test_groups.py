"""Console noun `groups`."""

import pytest
from django.core.management.base import CommandError

from broker.core import groups, keys, log, records


@pytest.fixture
def billing_on_orders(topic_factory):
    """Group billing has read 2 of partition 0's 3 messages; partition 1 holds 1 unread."""
    topic_factory("orders", partitions=2)
    log.append_messages(
        keys.CONSOLE,
        "orders",
        [records.NewMessage(b"1", partition=0)] * 3 + [records.NewMessage(b"1", partition=1)],
    )
    groups.commit_offsets(keys.CONSOLE, "billing", "orders", {0: 2})


def test_handle_list__lag(ferry, billing_on_orders):
    lines = ferry("groups", "list").splitlines()
    assert lines[0].split() == ["GROUP", "TOPIC", "COMMITTED", "END", "LAG"]
    assert [line.split() for line in lines[1:]] == [["billing", "orders", "2", "4", "2"]]


def test_handle_list__empty(ferry):
    assert ferry("groups", "list").split() == ["GROUP", "TOPIC", "COMMITTED", "END", "LAG"]


def test_handle_describe__partitions(ferry, billing_on_orders):
    lines = ferry("groups", "describe", "billing").splitlines()
    assert lines[0] == "group billing"
    assert lines[2].split() == ["TOPIC", "PARTITION", "COMMITTED", "START", "END", "LAG"]
    assert [line.split() for line in lines[3:]] == [
        ["orders", "0", "2", "0", "3", "1"],
        ["orders", "1", "0", "0", "1", "1"],
    ]


def test_handle_describe__unknown(ferry):
    with pytest.raises(CommandError, match=r"^group_not_found: "):
        ferry("groups", "describe", "missing")


def test_handle_describe__bad_name(ferry):
    with pytest.raises(CommandError, match=r"^invalid_request: Group names"):
        ferry("groups", "describe", "no spaces")
