"""Console noun `dlq`."""

import orjson
import pytest
from django.core.management.base import CommandError

from broker import models
from broker.core import delivery, groups, keys, log, membership, records, retries


@pytest.fixture
def dead_letters(topic_factory):
    """Group billing's three dead letters: orders offsets 0 and 1, audit offset 0; their ids."""
    for topic, count in (("orders", 2), ("audit", 1)):
        topic_factory(topic)
        log.append_messages(
            keys.CONSOLE, topic, [records.NewMessage(orjson.dumps(n)) for n in range(count)]
        )
        membership.join_group(keys.CONSOLE, "billing", topic, f"m-{topic}")
        got = delivery.deliver_messages(keys.CONSOLE, "billing", topic, f"m-{topic}", 10)
        # One at a time, so the ids follow the offsets.
        for d in sorted(got.deliveries, key=lambda d: d.message.offset):
            delivery.reject_messages(
                keys.CONSOLE, "billing", [d.receipt], error=f"cannot bill\n{topic}: " + "x" * 60
            )
    ids = [d.id for d in retries.list_dead_letters(keys.CONSOLE, "billing").items]
    assert len(ids) == 3
    return ids


def remaining():
    return [d.id for d in retries.list_dead_letters(keys.CONSOLE, "billing").items]


def test_handle_list__table(ferry, dead_letters):
    lines = ferry("dlq", "list", "billing").splitlines()
    assert lines[0].split() == [
        "ID",
        "TOPIC",
        "PARTITION",
        "OFFSET",
        "REASON",
        "ATTEMPTS",
        "DEAD",
        "AT",
        "LAST",
        "ERROR",
    ]
    rows = [line.split(maxsplit=7) for line in lines[1:]]
    assert [row[:6] for row in rows] == [
        [str(dead_letters[0]), "orders", "0", "0", "rejected", "1"],
        [str(dead_letters[1]), "orders", "0", "1", "rejected", "1"],
        [str(dead_letters[2]), "audit", "0", "0", "rejected", "1"],
    ]
    assert all(row[6].endswith("Z") for row in rows)
    # On one line, cut to 40 characters.
    assert rows[0][7] == "cannot bill orders: " + "x" * 19 + "…"


def test_handle_list__pages(ferry, dead_letters):
    first = ferry("dlq", "list", "billing", "--limit=2").splitlines()
    assert [line.split()[0] for line in first[1:3]] == [str(i) for i in dead_letters[:2]]
    assert first[3:] == ["", f"2 of 3; next page: --after-id {dead_letters[1]}"]
    rest = ferry("dlq", "list", "billing", f"--after-id={dead_letters[1]}").splitlines()
    assert [line.split()[0] for line in rest[1:]] == [str(dead_letters[2])]


def test_handle_list__topic_and_reason(ferry, dead_letters):
    lines = ferry("dlq", "list", "billing", "--topic=audit", "--reason=rejected").splitlines()
    assert [line.split()[0] for line in lines[1:]] == [str(dead_letters[2])]
    assert len(ferry("dlq", "list", "billing", "--reason=expired").splitlines()) == 1


def test_handle_list__bad_reason(ferry, db):
    with pytest.raises(CommandError, match="invalid choice"):
        ferry("dlq", "list", "billing", "--reason=lost")


def test_handle_list__unknown_group(ferry, db):
    with pytest.raises(CommandError, match=r"^group_not_found: "):
        ferry("dlq", "list", "missing")


def test_handle_redrive__ids(ferry, dead_letters):
    out = ferry(
        "dlq", "redrive", "billing", f"--id={dead_letters[0]}", "--id", str(dead_letters[2])
    )
    assert out == "redriven 2; missing: none\n"
    assert remaining() == [dead_letters[1]]
    # Back to the group: delivered again, attempts counted from 1.
    got = delivery.deliver_messages(keys.CONSOLE, "billing", "orders", "m-orders", 10).deliveries
    assert [(d.message.offset, d.attempt) for d in got] == [(0, 1)]


def test_handle_redrive__all_of_a_topic(ferry, dead_letters):
    assert ferry("dlq", "redrive", "billing", "--all", "--topic=orders") == (
        "redriven 2; missing: none\n"
    )
    assert remaining() == [dead_letters[2]]


def test_handle_redrive__retention_removed_message(ferry, dead_letters):
    log.append_messages(keys.CONSOLE, "audit", [records.NewMessage(b"1")] * 2)
    # As retention does: the dead letter's offset 0 is before the start offset now.
    models.Partition.objects.filter(topic__name="audit").update(start_offset=2)
    out = ferry("dlq", "redrive", "billing", "--all", "--topic=audit")
    assert out == f"redriven 0; missing: {dead_letters[2]}\n"
    assert dead_letters[2] in remaining()


def test_handle_redrive__unknown_id(ferry, dead_letters):
    with pytest.raises(CommandError, match=r"^dead_letter_not_found: "):
        ferry("dlq", "redrive", "billing", f"--id={dead_letters[0]}", "--id=999999")
    assert remaining() == dead_letters  # nothing redriven


def test_handle_redrive__unknown_group(ferry, db):
    with pytest.raises(CommandError, match=r"^group_not_found: "):
        ferry("dlq", "redrive", "missing", "--all")


def test_handle_redrive__id_with_all(ferry, dead_letters):
    with pytest.raises(CommandError, match="not allowed with argument"):
        ferry("dlq", "redrive", "billing", f"--id={dead_letters[0]}", "--all")
    assert remaining() == dead_letters


def test_handle_redrive__id_or_all_required(ferry, dead_letters):
    with pytest.raises(CommandError, match="one of the arguments --id --all is required"):
        ferry("dlq", "redrive", "billing")


@pytest.mark.parametrize("bad", ["0", "x", str(2**63)])
def test_handle_redrive__bad_id(ferry, db, bad):
    with pytest.raises(CommandError, match=r"invalid dead_letter_id value|must be"):
        ferry("dlq", "redrive", "billing", f"--id={bad}")


def test_handle_purge__ids(ferry, dead_letters):
    assert ferry("dlq", "purge", "billing", f"--id={dead_letters[1]}") == "purged 1\n"
    assert remaining() == [dead_letters[0], dead_letters[2]]


def test_handle_purge__all_of_a_reason(ferry, dead_letters):
    assert ferry("dlq", "purge", "billing", "--all", "--reason=expired") == "purged 0\n"
    assert ferry("dlq", "purge", "billing", "--all", "--reason=rejected") == "purged 3\n"
    assert remaining() == []


def test_handle_purge__unknown_id(ferry, dead_letters):
    with pytest.raises(CommandError, match=r"^dead_letter_not_found: "):
        ferry("dlq", "purge", "billing", "--id=999999")
    assert remaining() == dead_letters


def test_handle_purge__unknown_group(ferry, db):
    with pytest.raises(CommandError, match=r"^group_not_found: "):
        ferry("dlq", "purge", "missing", "--all")


def test_handle_purge__id_with_all(ferry, dead_letters):
    with pytest.raises(CommandError, match="not allowed with argument"):
        ferry("dlq", "purge", "billing", "--all", f"--id={dead_letters[0]}")
    assert remaining() == dead_letters


def test_handle_list__broadcast_member_column(ferry, topic_factory):
    topic_factory("news")
    log.append_messages(keys.CONSOLE, "news", [records.NewMessage(b"1")])
    groups.configure_group(keys.CONSOLE, "feed", mode="broadcast")
    for member in ("a", "b"):
        membership.join_group(keys.CONSOLE, "feed", "news", member)
        [d] = delivery.deliver_messages(keys.CONSOLE, "feed", "news", member, 10).deliveries
        delivery.reject_messages(keys.CONSOLE, "feed", [d.receipt])
    lines = ferry("dlq", "list", "feed").splitlines()
    assert lines[0].split()[:4] == ["ID", "TOPIC", "MEMBER", "PARTITION"]
    assert [line.split()[2] for line in lines[1:]] == ["a", "b"]
    assert all(line.split()[-1] == "-" for line in lines[1:])  # no error given
