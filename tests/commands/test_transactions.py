"""Console noun `transactions`."""

import orjson
import pytest
from django.core.management.base import CommandError

from broker import models
from broker.core import keys, log, transactions
from broker.core.records import NewMessage


@pytest.fixture
def open_one(topic_factory, key_factory):
    topic_factory("ledger")
    producer, _ = key_factory("produce:ledger")
    t = transactions.begin_transaction(producer, "billing-1", 60_000)
    transactions.add_messages(producer, t.id, "ledger", [NewMessage(orjson.dumps(1))])
    return t


def test_handle_list__open_ones(ferry, open_one):
    lines = ferry("transactions", "list", "--state", "open").splitlines()
    assert lines[0].split() == [
        "ID",
        "KIND",
        "PRODUCER",
        "EPOCH",
        "STATE",
        "REASON",
        "AGE",
        "MESSAGES",
        "TOPICS",
    ]
    assert lines[1].split() == [
        str(open_one.id),
        "producer",
        "billing-1",
        "1",
        "open",
        "-",
        "0s",
        "1",
        "ledger",
    ]
    assert len(ferry("transactions", "list", "--state", "committed").splitlines()) == 1


def test_handle_show(ferry, open_one):
    out = ferry("transactions", "show", str(open_one.id))
    assert "state       open" in out
    assert "topics      ledger" in out


def test_handle_commit__audited(ferry, open_one):
    out = ferry("transactions", "commit", str(open_one.id))
    assert out.strip() == f"committed transaction {open_one.id}: 1 messages visible"
    assert len(log.read_messages(keys.CONSOLE, "ledger", 0, None, 10).messages) == 1
    entry = models.AuditEntry.objects.get(action="transaction.commit")
    assert (entry.actor, entry.outcome, entry.target) == ("console", "ok", str(open_one.id))
    assert transactions.get_transaction(keys.CONSOLE, open_one.id).reason == "operator"


def test_handle_rollback__then_commit_fails(ferry, open_one):
    ferry("transactions", "rollback", str(open_one.id))
    with pytest.raises(CommandError, match="transaction_not_open"):
        ferry("transactions", "commit", str(open_one.id))
    assert models.AuditEntry.objects.filter(outcome="transaction_not_open").count() == 1


def test_handle_show__unknown(ferry, db):
    with pytest.raises(CommandError, match="transaction_not_found"):
        ferry("transactions", "show", "999999")
