"""Console noun `groups`."""

import pytest
from django.core.management.base import CommandError

from broker.core import delivery, groups, keys, log, membership, records


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
    assert lines[0].split() == [
        "GROUP",
        "TOPIC",
        "COMMITTED",
        "END",
        "LAG",
        "IN",
        "FLIGHT",
        "RETRY",
        "WAITING",
    ]
    assert [line.split() for line in lines[1:]] == [["billing", "orders", "2", "4", "2", "0", "0"]]


def test_handle_list__empty(ferry):
    assert ferry("groups", "list").split() == [
        "GROUP",
        "TOPIC",
        "COMMITTED",
        "END",
        "LAG",
        "IN",
        "FLIGHT",
        "RETRY",
        "WAITING",
    ]


def test_handle_describe__partitions(ferry, billing_on_orders):
    settings, offsets, members = ferry("groups", "describe", "billing").split("\n\n")
    assert [line.split() for line in settings.splitlines()] == [
        ["group", "billing"],
        ["generation", "0"],
        ["strategy", "sticky"],
        ["mode", "clustering"],
        ["ordered", "no"],
        ["ack_deadline_ms", "30000"],
        ["max_attempts", "16"],
        ["retry_delays_ms", "default"],
        ["session_timeout_ms", "45000"],
        ["dead_letters", "0"],
    ]
    lines = offsets.splitlines()
    assert lines[0].split() == [
        "TOPIC",
        "PARTITION",
        "COMMITTED",
        "START",
        "END",
        "LAG",
        "IN",
        "FLIGHT",
        "RETRY",
        "WAITING",
        "FILTERED",
    ]
    assert [line.split() for line in lines[1:]] == [
        ["orders", "0", "2", "0", "3", "1", "0", "0", "0"],
        ["orders", "1", "0", "0", "1", "1", "0", "0", "0"],
    ]
    assert members.split() == [
        "MEMBER",
        "CLIENT",
        "TOPIC",
        "PARTITIONS",
        "LAST",
        "HEARTBEAT",
        "FILTER",
    ]


def test_handle_describe__members(ferry, billing_on_orders):
    membership.join_group(keys.CONSOLE, "billing", "orders", "a")
    membership.join_group(keys.CONSOLE, "billing", "orders", "b")
    membership.join_group(keys.CONSOLE, "billing", "orders", "b", filter={"tags": "x || y"})
    settings, _, members = ferry("groups", "describe", "billing").split("\n\n")
    assert settings.splitlines()[1].split() == ["generation", "3"]
    lines = members.splitlines()
    assert lines[0].split() == [
        "MEMBER",
        "CLIENT",
        "TOPIC",
        "PARTITIONS",
        "LAST",
        "HEARTBEAT",
        "FILTER",
    ]
    rows = [line.split(maxsplit=5) for line in lines[1:]]
    # The console's join names no client: "-".
    assert [row[:3] for row in rows] == [["a", "-", "orders"], ["b", "-", "orders"]]
    assert sorted(row[3] for row in rows) == ["0", "1"]
    assert all(row[4].endswith("Z") for row in rows)
    assert [row[5] for row in rows] == ["-", '{"tags":"x || y"}']


def test_handle_describe__in_flight_and_dead_letters(ferry, billing_on_orders):
    membership.join_group(keys.CONSOLE, "billing", "orders", "a")
    got = delivery.deliver_messages(keys.CONSOLE, "billing", "orders", "a", 10).deliveries
    # Partition 0's last message rejected, partition 1's left in flight.
    [first] = [d for d in got if d.message.partition == 0]
    delivery.reject_messages(keys.CONSOLE, "billing", [first.receipt], error="bad")
    settings, offsets, _ = ferry("groups", "describe", "billing").split("\n\n")
    assert settings.splitlines()[-1].split() == ["dead_letters", "1"]
    assert [line.split()[-3:] for line in offsets.splitlines()[1:]] == [
        ["0", "0", "0"],
        ["1", "0", "0"],
    ]


def test_handle_describe__broadcast_rows_per_member(ferry, topic_factory):
    topic_factory("news")
    log.append_messages(keys.CONSOLE, "news", [records.NewMessage(b"1")])
    groups.configure_group(keys.CONSOLE, "feed", mode="broadcast")
    for member in ("a", "b"):
        membership.join_group(keys.CONSOLE, "feed", "news", member)
        delivery.deliver_messages(keys.CONSOLE, "feed", "news", member, 10)
    settings, offsets, _ = ferry("groups", "describe", "feed").split("\n\n")
    assert ["mode", "broadcast"] in [line.split() for line in settings.splitlines()]
    lines = offsets.splitlines()
    assert lines[0].split()[:3] == ["TOPIC", "MEMBER", "PARTITION"]
    # Each member has the message in flight on its own offsets.
    assert [line.split() for line in lines[1:]] == [
        ["news", "a", "0", "0", "0", "1", "1", "1", "0", "0"],
        ["news", "b", "0", "0", "0", "1", "1", "1", "0", "0"],
    ]


def test_handle_describe__unknown(ferry):
    with pytest.raises(CommandError, match=r"^group_not_found: "):
        ferry("groups", "describe", "missing")


def test_handle_describe__bad_name(ferry):
    with pytest.raises(CommandError, match=r"^invalid_request: Group names"):
        ferry("groups", "describe", "no spaces")


def test_handle_reset__to_offset_and_to_latest(ferry, topic_factory, console):
    from broker.core import groups, log
    from broker.core.records import NewMessage

    topic = topic_factory("payments", partitions=2)
    log.append_messages(console, topic.name, [NewMessage(b"1", partition=0) for _ in range(3)])
    out = ferry("groups", "reset", "audit", "--topic", "payments", "--to-offset", "0=1")
    assert "payments" in out
    assert groups.describe_group(console, "audit").topics[0].partitions[0].committed_offset == 1
    ferry("groups", "reset", "audit", "--topic", "payments", "--to-latest")
    assert groups.describe_group(console, "audit").topics[0].lag == 0


def test_handle_configure__strategy(ferry, topic_factory, console):
    from broker.core import groups, membership

    topic = topic_factory("jobs", partitions=2)
    membership.join_group(console, "workers", topic.name, "a")
    out = ferry("groups", "configure", "workers", "--strategy", "range")
    assert "range" in out
    assert groups.describe_group(console, "workers").strategy == "range"


def test_handle_configure__delivery_settings(ferry, db):
    out = ferry(
        "groups",
        "configure",
        "workers",
        "--mode=broadcast",
        "--ordered",
        "--ack-deadline-ms=60000",
        "--max-attempts=3",
        "--retry-delays-ms=10000,30000,60000",
    )
    fields = dict(line.split() for line in out.splitlines())
    assert (fields["mode"], fields["ordered"]) == ("broadcast", "yes")
    assert (fields["ack_deadline_ms"], fields["max_attempts"]) == ("60000", "3")
    assert fields["retry_delays_ms"] == "10000,30000,60000"
    settings = groups.describe_group(keys.CONSOLE, "workers").settings
    assert settings.retry_delays_ms == (10000, 30000, 60000)
    # Only what is given changes; '' goes back to RocketMQ's levels.
    ferry("groups", "configure", "workers", "--unordered", "--retry-delays-ms=")
    settings = groups.describe_group(keys.CONSOLE, "workers").settings
    assert (settings.mode, settings.ordered, settings.max_attempts) == ("broadcast", False, 3)
    assert settings.retry_delays_ms == ()


def test_handle_configure__nothing_given(ferry, db):
    with pytest.raises(CommandError, match="Nothing to configure"):
        ferry("groups", "configure", "workers")


def test_handle_configure__ordered_and_unordered(ferry, db):
    with pytest.raises(CommandError, match="not allowed with argument"):
        ferry("groups", "configure", "workers", "--ordered", "--unordered")


@pytest.mark.parametrize("bad", ["10s", "1,,2"])
def test_handle_configure__bad_retry_delays(ferry, db, bad):
    with pytest.raises(CommandError, match="expected MS,MS"):
        ferry("groups", "configure", "workers", f"--retry-delays-ms={bad}")


def test_handle_configure__bad_max_attempts(ferry, db):
    with pytest.raises(CommandError, match=r"^invalid_request: max_attempts is 1 to 1000"):
        ferry("groups", "configure", "workers", "--max-attempts=0")


def test_handle_configure__mode_with_members(ferry, topic_factory):
    topic_factory("jobs")
    membership.join_group(keys.CONSOLE, "workers", "jobs", "a")
    with pytest.raises(CommandError, match=r"^group_has_members: "):
        ferry("groups", "configure", "workers", "--mode=broadcast")
    assert groups.describe_group(keys.CONSOLE, "workers").settings.mode == "clustering"
