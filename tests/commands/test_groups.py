"""Console noun `groups`."""

import pytest
from django.core.management.base import CommandError

from broker.core import groups, keys, log, membership, records


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
    settings, offsets, members = ferry("groups", "describe", "billing").split("\n\n")
    assert [line.split() for line in settings.splitlines()] == [
        ["group", "billing"],
        ["generation", "0"],
        ["strategy", "sticky"],
    ]
    lines = offsets.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITION", "COMMITTED", "START", "END", "LAG"]
    assert [line.split() for line in lines[1:]] == [
        ["orders", "0", "2", "0", "3", "1"],
        ["orders", "1", "0", "0", "1", "1"],
    ]
    assert members.split() == ["MEMBER", "TOPIC", "PARTITIONS", "LAST", "HEARTBEAT"]


def test_handle_describe__members(ferry, billing_on_orders):
    membership.join_group(keys.CONSOLE, "billing", "orders", "a")
    membership.join_group(keys.CONSOLE, "billing", "orders", "b")
    settings, _, members = ferry("groups", "describe", "billing").split("\n\n")
    assert settings.splitlines()[1].split() == ["generation", "2"]
    lines = members.splitlines()
    assert lines[0].split() == ["MEMBER", "TOPIC", "PARTITIONS", "LAST", "HEARTBEAT"]
    rows = [line.split() for line in lines[1:]]
    assert [row[:2] for row in rows] == [["a", "orders"], ["b", "orders"]]
    assert sorted(row[2] for row in rows) == ["0", "1"]
    assert all(row[3].endswith("Z") for row in rows)


def test_handle_describe__unknown(ferry):
    with pytest.raises(CommandError, match=r"^group_not_found: "):
        ferry("groups", "describe", "missing")


def test_handle_describe__bad_name(ferry):
    with pytest.raises(CommandError, match=r"^invalid_request: Group names"):
        ferry("groups", "describe", "no spaces")


def test_reset__to_offset_and_to_latest(ferry, topic_factory, console):
    from broker.core import groups, log
    from broker.core.records import NewMessage

    topic = topic_factory("payments", partitions=2)
    log.append_messages(console, topic.name, [NewMessage(b"1", partition=0) for _ in range(3)])
    out = ferry("groups", "reset", "audit", "--topic", "payments", "--to-offset", "0=1")
    assert "payments" in out
    assert groups.describe_group(console, "audit").topics[0].partitions[0].committed_offset == 1
    ferry("groups", "reset", "audit", "--topic", "payments", "--to-latest")
    assert groups.describe_group(console, "audit").topics[0].lag == 0


def test_configure__strategy(ferry, topic_factory, console):
    from broker.core import groups, membership

    topic = topic_factory("jobs", partitions=2)
    membership.join_group(console, "workers", topic.name, "a")
    out = ferry("groups", "configure", "workers", "--strategy", "range")
    assert "range" in out
    assert groups.describe_group(console, "workers").strategy == "range"
