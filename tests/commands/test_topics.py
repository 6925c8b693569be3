"""Console noun `topics`."""

import pytest
from django.core.management.base import CommandError

from broker import models
from broker.core import delivery, keys, log, membership, records, topics


def test_handle_create__defaults(ferry):
    out = ferry("topics", "create", "orders")
    assert out == "created topic orders with 1 partition(s)\n"
    info = topics.get_topic(keys.CONSOLE, "orders")
    assert info.partition_count == 1
    assert info.capacity is None
    assert info.overflow_policy == "reject"


def test_handle_create__with_limits(ferry):
    ferry(
        "topics",
        "create",
        "orders",
        "--partitions=3",
        "--retention-ms=60000",
        "--retention-bytes=1000000",
        "--max-message-bytes=2048",
        "--capacity=10",
        "--overflow=drop_oldest",
    )
    info = topics.get_topic(keys.CONSOLE, "orders")
    assert (info.partition_count, info.retention_ms, info.retention_bytes) == (3, 60000, 1000000)
    assert (info.max_message_bytes, info.capacity, info.overflow_policy) == (
        2048,
        10,
        "drop_oldest",
    )


def test_handle_create__ttl_and_trace(ferry):
    ferry("topics", "create", "orders", "--message-ttl-ms=60000", "--trace")
    info = topics.get_topic(keys.CONSOLE, "orders")
    assert (info.message_ttl_ms, info.trace) == (60000, True)
    lines = [line.split() for line in ferry("topics", "describe", "orders").splitlines()]
    assert ["message_ttl_ms", "60000"] in lines
    assert ["trace", "yes"] in lines


def test_handle_create__bad_ttl(ferry):
    with pytest.raises(CommandError, match=r"^invalid_request: "):
        ferry("topics", "create", "orders", "--message-ttl-ms=0")
    assert topics.list_topics(keys.CONSOLE) == []


def test_handle_create__bad_name(ferry):
    with pytest.raises(CommandError, match=r"^invalid_topic_name: "):
        ferry("topics", "create", "no spaces")


def test_handle_create__exists(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match=r"^topic_exists: "):
        ferry("topics", "create", "orders")


def test_handle_create__bad_limit(ferry):
    with pytest.raises(CommandError, match=r"^invalid_request: capacity must be at least 1"):
        ferry("topics", "create", "orders", "--capacity=0")
    assert topics.list_topics(keys.CONSOLE) == []


def test_handle_create__bad_overflow(ferry):
    with pytest.raises(CommandError, match="invalid choice"):
        ferry("topics", "create", "orders", "--overflow=block")


def test_handle_list__table(ferry, topic_factory):
    topic_factory("orders", partitions=2, capacity=50)
    topic_factory("audit")
    log.append_messages(
        keys.CONSOLE, "orders", [records.NewMessage(b"1"), records.NewMessage(b"2")]
    )
    topic_factory("events", message_ttl_ms=60000, trace=True)
    size = models.Message.objects.all()[0].size_bytes
    lines = ferry("topics", "list").splitlines()
    assert lines[0].split() == [
        "NAME",
        "PARTITIONS",
        "MESSAGES",
        "BYTES",
        "CAPACITY",
        "MESSAGE_TTL_MS",
        "TRACE",
    ]
    assert [line.split() for line in lines[1:]] == [
        ["audit", "1", "0", "0", "-", "-", "no"],
        ["events", "1", "0", "0", "-", "60000", "yes"],
        ["orders", "2", "2", str(size * 2), "50", "-", "no"],
    ]


def test_handle_describe__settings_and_offsets(ferry, topic_factory):
    topic_factory("orders", partitions=2)
    log.append_messages(keys.CONSOLE, "orders", [records.NewMessage(b"1", partition=1)] * 3)
    lines = ferry("topics", "describe", "orders").splitlines()
    assert lines[0].split() == ["topic", "orders"]
    assert ["partitions", "2"] in [line.split() for line in lines]
    size = models.Message.objects.all()[0].size_bytes
    assert lines[-3].split() == ["PARTITION", "START", "END", "MESSAGES", "BYTES"]
    assert [line.split() for line in lines[-2:]] == [
        ["0", "0", "0", "0", "0"],
        ["1", "0", "3", "3", str(3 * size)],
    ]


def test_handle_describe__unknown(ferry):
    with pytest.raises(CommandError, match=r"^topic_not_found: "):
        ferry("topics", "describe", "missing")


def test_handle_alter__grows_partitions_and_removes_capacity(ferry, topic_factory):
    topic_factory("orders", partitions=1, capacity=10, retention_ms=5000)
    out = ferry("topics", "alter", "orders", "--partitions=4", "--capacity=none")
    assert out.startswith("altered topic orders\n")
    info = topics.get_topic(keys.CONSOLE, "orders")
    assert info.partition_count == 4
    assert info.capacity is None
    assert info.retention_ms == 5000  # not given, so kept


def test_handle_alter__ttl_and_trace(ferry, topic_factory):
    topic_factory("orders", message_ttl_ms=5000, trace=True, capacity=10)
    ferry("topics", "alter", "orders", "--message-ttl-ms=none", "--no-trace")
    info = topics.get_topic(keys.CONSOLE, "orders")
    assert (info.message_ttl_ms, info.trace, info.capacity) == (None, False, 10)
    ferry("topics", "alter", "orders", "--message-ttl-ms=7000")
    info = topics.get_topic(keys.CONSOLE, "orders")
    assert (info.message_ttl_ms, info.trace) == (7000, False)  # trace not given, so kept


def test_handle_alter__shrink(ferry, topic_factory):
    topic_factory("orders", partitions=3)
    with pytest.raises(CommandError, match=r"^invalid_partition_count: "):
        ferry("topics", "alter", "orders", "--partitions=2")


def test_handle_alter__nothing_given(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match="Nothing to alter"):
        ferry("topics", "alter", "orders")


def test_handle_alter__unknown(ferry):
    with pytest.raises(CommandError, match=r"^topic_not_found: "):
        ferry("topics", "alter", "missing", "--capacity=5")


def test_handle_delete__gone(ferry, topic_factory):
    topic_factory("orders")
    assert ferry("topics", "delete", "orders") == "deleted topic orders\n"
    assert topics.list_topics(keys.CONSOLE) == []


def test_handle_delete__unknown(ferry):
    with pytest.raises(CommandError, match=r"^topic_not_found: "):
        ferry("topics", "delete", "missing")


def test_handle_trace__one_line_per_event(ferry, topic_factory):
    topic_factory("orders", trace=True)
    log.append_messages(keys.CONSOLE, "orders", [records.NewMessage(b"1")])
    membership.join_group(keys.CONSOLE, "g", "orders", "m")
    [d] = delivery.deliver_messages(keys.CONSOLE, "g", "orders", "m", 10).deliveries
    delivery.nack_messages(keys.CONSOLE, "g", [d.receipt], error="db down", delay_ms=0)
    lines = ferry("topics", "trace", "orders", "0", "0").splitlines()
    events = [line.split()[1] for line in lines]
    assert events == ["produced", "delivered", "nacked", "retry_scheduled"]
    assert all(line.split()[0].endswith("Z") for line in lines)
    assert "group=g member=m attempt=1" in lines[1]
    assert 'error="db down"' in lines[2]


def test_handle_trace__nothing_recorded(ferry, topic_factory):
    topic_factory("orders")
    assert ferry("topics", "trace", "orders", "0", "5") == ""


def test_handle_trace__unknown_partition(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match=r"^partition_not_found: "):
        ferry("topics", "trace", "orders", "3", "0")


def test_handle_trace__unknown_topic(ferry):
    with pytest.raises(CommandError, match=r"^topic_not_found: "):
        ferry("topics", "trace", "missing", "0", "0")


def test_handle_list__shows_topics_being_deleted(ferry):
    ferry("topics", "create", "orders")
    ferry("topics", "create", "scratch")
    ferry("topics", "delete", "scratch")

    listed = ferry("topics", "list")

    assert "scratch" not in listed.splitlines()[1]
    assert listed.splitlines()[-1] == "being deleted: scratch (0 messages)"
    topics.run_topic_deletions()
    assert "being deleted" not in ferry("topics", "list")
