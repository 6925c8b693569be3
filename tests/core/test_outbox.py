"""broker.outbox: messages published in the caller's transaction.atomic() (docs/transactions.md)."""

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from django.db import connection, transaction

from broker import models, outbox
from broker.core import log, transactions

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def caller_row(name):
    """A row of the caller's own (any model written in the caller's transaction)."""
    return models.ApiKey.objects.create(name=name, key_hash=name, prefix="x", permissions=[])


def failing_work(topic, *values, row=None):
    """The caller's work in its own atomic block: rows, publishes, then an exception."""
    with transaction.atomic():
        if row is not None:
            caller_row(row)
        for value in values:
            outbox.publish(topic, value)
        raise Boom


def stored(console, topic, partition=0):
    return [
        orjson.loads(m.value)
        for m in log.read_messages(console, topic, partition, None, 1000).messages
    ]


def test_publish__visible_when_the_callers_transaction_commits(topic_factory, console):
    topic = topic_factory().name
    with transaction.atomic():
        caller_row("a-row-of-the-caller")
        outbox.publish(topic, {"n": 1}, key="k")
        outbox.publish(topic, {"n": 2}, headers={"h": "v"})
        # Invisible to every reader until the caller commits.
        assert stored(console, topic) == []
    assert stored(console, topic) == [{"n": 1}, {"n": 2}]
    (row,) = models.Transaction.objects.all()
    assert (row.kind, row.state, row.reason, row.message_count) == (
        "outbox",
        "committed",
        "outbox",
        2,
    )
    assert not models.StagedMessage.objects.exists()


def test_publish__nothing_when_the_caller_rolls_back(topic_factory, console):
    topic = topic_factory().name
    with pytest.raises(Boom):
        failing_work(topic, 1, row="rolled-back-row")
    assert stored(console, topic) == []
    assert not models.Transaction.objects.exists()
    assert not models.ApiKey.objects.filter(name="rolled-back-row").exists()
    # The next transaction on this connection starts a fresh outbox transaction.
    with transaction.atomic():
        outbox.publish(topic, 2)
    assert stored(console, topic) == [2]


def test_publish__a_rolled_back_savepoint_drops_its_messages(topic_factory, console):
    topic = topic_factory().name
    with transaction.atomic():
        outbox.publish(topic, 1)
        with pytest.raises(Boom):
            failing_work(topic, 2)
        outbox.publish(topic, 3)
    assert stored(console, topic) == [1, 3]


def test_publish__outside_a_transaction_is_its_own(topic_factory, console):
    topic = topic_factory().name
    outbox.publish(topic, b"raw")
    assert [m.value for m in log.read_messages(console, topic, 0, None, 10).messages] == [b"raw"]


def test_publish__bad_input_raises_before_anything_is_written(topic_factory, console):
    from broker.core import errors

    topic = topic_factory(max_message_bytes=5).name
    with pytest.raises(errors.MessageTooLarge), transaction.atomic():
        outbox.publish(topic, "far too long")
    with pytest.raises(errors.TopicNotFound):
        outbox.publish("missing", 1)
    assert not models.Transaction.objects.exists()


def test_promote_prepared__a_crash_between_commit_and_promotion_still_publishes(
    topic_factory, console
):
    topic = topic_factory().name
    env = dict(os.environ, FERRY_TEST_DB_NAME=str(connection.settings_dict["NAME"]))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.concurrency.worker", "outbox_crash", topic, "3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 9, proc.stderr.decode()
    # Committed with the caller's rows, not yet appended.
    assert models.Transaction.objects.get().state == "prepared"
    assert stored(console, topic) == []
    assert transactions.run_checks().promoted == 1
    assert stored(console, topic) == [0, 1, 2]
    assert transactions.run_checks().promoted == 0
    assert stored(console, topic) == [0, 1, 2]


def test_publish_many__one_outbox_transaction(topic_factory, console):
    topic = topic_factory(partitions=2).name
    with transaction.atomic():
        outbox.publish_many(
            topic, [outbox.message({"n": i}, key="same", headers={"i": str(i)}) for i in range(3)]
        )
        outbox.publish(topic, b"\x00", key="same")
    (row,) = models.Transaction.objects.all()
    assert (row.state, row.message_count) == ("committed", 4)
    number = models.Message.objects.filter(partition__topic__name=topic)[0].partition.number
    values = [m.value for m in log.read_messages(console, topic, number, None, 10).messages]
    assert values == [b'{"n":0}', b'{"n":1}', b'{"n":2}', b"\x00"]
