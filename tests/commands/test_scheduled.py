"""Console noun `scheduled`."""

import orjson
import pytest
from django.core.management.base import CommandError

from broker import models
from broker.core import keys, log, records, scheduling

DUE_MS = 2_208_988_800_000  # 2040-01-01T00:00:00Z


@pytest.fixture
def two_scheduled(topic_factory, settings):
    """Two delayed messages on orders: a long JSON value due later, bytes due first."""
    settings.FERRY_MAX_DELAY_SECONDS = 100 * 365 * 24 * 3600  # allow a fixed date years away
    topic_factory("orders", partitions=2)
    return log.append_messages(
        keys.CONSOLE,
        "orders",
        [
            records.NewMessage(
                orjson.dumps({"text": "x" * 50}), key="k", tag="t", deliver_at_ms=DUE_MS + 1000
            ),
            records.NewMessage(b"\x00\x01", is_json=False, partition=1, deliver_at_ms=DUE_MS),
        ],
    )


def test_handle_list__soonest_first(ferry, two_scheduled):
    later, sooner = two_scheduled
    lines = ferry("scheduled", "list", "orders").splitlines()
    assert lines[0].split() == ["ID", "DUE", "PARTITION", "KEY", "TAG", "VALUE"]
    assert [line.split() for line in lines[1:]] == [
        [str(sooner.scheduled_id), "2040-01-01T00:00:00.000Z", "1", "-", "-", "b64:AAE="],
        [
            str(later.scheduled_id),
            "2040-01-01T00:00:01.000Z",
            "-",
            "k",
            "t",
            '{"text":"' + "x" * 30 + "…",  # 40 characters in all
        ],
    ]


def test_handle_list__limit_and_after(ferry, two_scheduled):
    later, sooner = two_scheduled
    first = ferry("scheduled", "list", "orders", "--limit=1").splitlines()
    assert [line.split()[0] for line in first[1:]] == [str(sooner.scheduled_id)]
    rest = ferry("scheduled", "list", "orders", f"--after={sooner.scheduled_id}").splitlines()
    assert [line.split()[0] for line in rest[1:]] == [str(later.scheduled_id)]


def test_handle_list__empty(ferry, topic_factory):
    topic_factory("orders")
    assert ferry("scheduled", "list", "orders").split() == [
        "ID",
        "DUE",
        "PARTITION",
        "KEY",
        "TAG",
        "VALUE",
    ]


def test_handle_list__unknown_topic(ferry):
    with pytest.raises(CommandError, match=r"^topic_not_found: "):
        ferry("scheduled", "list", "missing")


def test_handle_list__bad_limit(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match="must be at least 1"):
        ferry("scheduled", "list", "orders", "--limit=0")


def test_handle_cancel__removes_it(ferry, two_scheduled):
    later, sooner = two_scheduled
    out = ferry("scheduled", "cancel", str(sooner.scheduled_id))
    assert out == (
        f"cancelled scheduled message {sooner.scheduled_id} on orders "
        "(was due 2040-01-01T00:00:00.000Z)\n"
    )
    remaining = scheduling.list_scheduled(keys.CONSOLE, "orders")
    assert [s.id for s in remaining] == [later.scheduled_id]


def test_handle_cancel__unknown_id(ferry, db):
    with pytest.raises(CommandError, match=r"^scheduled_not_found: No scheduled message 4242 "):
        ferry("scheduled", "cancel", "4242")


def test_handle_cancel__after_release(ferry, two_scheduled):
    _, sooner = two_scheduled
    models.ScheduledMessage.objects.update(due_ms=0)
    scheduling.release_due()
    with pytest.raises(CommandError, match=r"^scheduled_not_found: "):
        ferry("scheduled", "cancel", str(sooner.scheduled_id))


@pytest.mark.parametrize("bad", ["0", "x", str(2**63)])
def test_handle_cancel__bad_id(ferry, bad):
    with pytest.raises(CommandError, match=r"invalid scheduled_id value|must be"):
        ferry("scheduled", "cancel", bad)
