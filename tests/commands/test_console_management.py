"""Console verbs for the management console: purge, group delete, reset preview, messages,
scheduled deliver-now and reschedule, audit list, and the one-line database error."""

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from django.core.management.base import CommandError

from broker import models
from broker.core import keys, log, membership
from broker.core.records import NewMessage


def produce(topic, n, partition=0, **fields):
    log.append_messages(
        keys.CONSOLE,
        topic,
        [NewMessage(value=orjson.dumps(i), partition=partition, **fields) for i in range(n)],
    )


def audit_rows():
    return list(
        models.AuditEntry.objects.order_by("id").values_list("actor", "source", "action", "outcome")
    )


def test_topics_purge__up_to_then_all(ferry, topic_factory):
    topic_factory("orders", partitions=2)
    produce("orders", 4, 0)
    produce("orders", 1, 1)
    out = ferry("topics", "purge", "orders", "--up-to", "0:3")
    assert out.splitlines()[0] == "purged 3 message(s) from orders"
    assert out.splitlines()[2].split()[:4] == ["0", "3", "4", "1"]
    assert ferry("topics", "purge", "orders").splitlines()[0] == "purged 2 message(s) from orders"
    assert audit_rows() == [
        ("console", "console", "topic.purge", "ok"),
        ("console", "console", "topic.purge", "ok"),
    ]


def test_topics_purge__errors(ferry, topic_factory):
    topic_factory("orders")
    produce("orders", 2)
    with pytest.raises(CommandError, match=r"^offset_out_of_range: "):
        ferry("topics", "purge", "orders", "--up-to", "0:9")
    with pytest.raises(CommandError, match="PARTITION:OFFSET"):
        ferry("topics", "purge", "orders", "--up-to", "0=1")
    assert models.Message.objects.count() == 2
    assert audit_rows() == [("console", "console", "topic.purge", "offset_out_of_range")]


def test_groups_delete__refused_then_forced(ferry, topic_factory):
    topic_factory("orders")
    membership.join_group(keys.CONSOLE, "billing", "orders", "m")
    with pytest.raises(CommandError, match=r"^group_has_members: "):
        ferry("groups", "delete", "billing")
    assert ferry("groups", "delete", "billing", "--force") == "deleted group billing\n"
    assert not models.ConsumerGroup.objects.exists()
    with pytest.raises(CommandError, match=r"^group_not_found: "):
        ferry("groups", "delete", "billing")


def test_groups_reset__dry_run_and_shift(ferry, topic_factory):
    topic_factory("orders")
    produce("orders", 5)
    ferry("groups", "reset", "billing", "--topic", "orders", "--to-offset", "0=4")
    preview = ferry(
        "groups", "reset", "billing", "--topic", "orders", "--shift-by", "-2", "--dry-run"
    ).splitlines()
    assert preview[0].split() == ["TOPIC", "PARTITION", "COMMITTED", "TARGET", "DELTA"]
    assert preview[1].split() == ["orders", "0", "4", "2", "-2"]
    assert preview[2] == "dry run: nothing moved"
    out = ferry("groups", "reset", "billing", "--topic", "orders", "--shift-by", "-2")
    assert out.splitlines()[1].split()[:3] == ["orders", "0", "2"]
    assert [a for _, _, a, _ in audit_rows()] == ["group.reset", "group.reset"]


def test_messages_lookup_show_export(ferry, topic_factory):
    topic_factory("orders", partitions=2)
    produce("orders", 2, 0, key="k")
    log.append_messages(
        keys.CONSOLE,
        "orders",
        [NewMessage(value=b"\xff", is_json=False, partition=1, client_id="x")],
    )
    lines = ferry("messages", "lookup", "orders", "--key", "k").splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [["0", "1"], ["0", "0"]]
    by_id = ferry("messages", "lookup", "orders", "--id", "x").splitlines()
    assert by_id[1].split()[:2] == ["1", "0"]
    scanned = ferry("messages", "lookup", "orders", "--tag", "none").splitlines()
    assert scanned[-1] == "scanned 3 message(s), up to the start"
    shown = [
        line.split(maxsplit=1)
        for line in ferry("messages", "show", "orders", "1", "0").splitlines()
    ]
    assert ["value", "b64:/w=="] in shown
    exported = [orjson.loads(line) for line in ferry("messages", "export", "orders").splitlines()]
    assert [(r["partition"], r["offset"]) for r in exported] == [(0, 0), (0, 1), (1, 0)]
    with pytest.raises(CommandError, match=r"^message_not_found: "):
        ferry("messages", "show", "orders", "0", "7")


def test_scheduled_deliver_now_and_reschedule(ferry, topic_factory):
    topic_factory("orders")
    (result,) = log.append_messages(
        keys.CONSOLE, "orders", [NewMessage(value=b"1", delay_ms=60_000)]
    )
    assert result.scheduled_id is not None
    sid = str(result.scheduled_id)
    out = ferry("scheduled", "reschedule", sid, "--delay-ms", "120000")
    assert out.startswith(f"scheduled message {sid} on orders is due ")
    assert (
        ferry("scheduled", "deliver-now", sid) == f"scheduled message {sid} on orders is due now\n"
    )
    assert models.ScheduledMessage.objects.get().due_ms <= log.now_ms()
    with pytest.raises(CommandError, match=r"^scheduled_not_found: "):
        ferry("scheduled", "deliver-now", str(result.scheduled_id + 1))
    assert [(a, o) for _, _, a, o in audit_rows()] == [
        ("scheduled.reschedule", "ok"),
        ("scheduled.deliver_now", "ok"),
        ("scheduled.deliver_now", "scheduled_not_found"),
    ]


def test_audit_list__filters_and_pages(ferry, topic_factory):
    ferry("topics", "create", "a")
    ferry("topics", "delete", "a")
    ferry("apikey", "create", "ci", "--allow", "produce:*")
    lines = ferry("audit", "list", "--limit", "2").splitlines()
    assert [line.split()[4] for line in lines[1:3]] == ["key.create", "topic.delete"]
    assert lines[3].startswith("more: --before-id ")
    only = ferry("audit", "list", "--action", "topic.create").splitlines()
    assert [line.split()[4:7] for line in only[1:]] == [["topic.create", "a", "ok"]]


def test_database_unreachable__one_line(tmp_path: Path):
    missing = tmp_path / "nope"
    env = {**os.environ, "FERRY_DATA_DIR": str(missing)}
    env.pop("DATABASE_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "ferry", "topics", "list"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"CommandError: cannot open the database at {missing}/ferry.sqlite3 "
        f"(FERRY_DATA_DIR={missing}): unable to open database file"
    ]
