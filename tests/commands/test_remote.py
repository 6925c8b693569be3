"""The console against a real Daphne over REST (--url / FERRY_URL with FERRY_KEY)."""

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from broker import models
from tests.integration.conftest import broker_url

__all__ = ["broker_url"]

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def remote(broker_url, key_factory, monkeypatch):
    """Run `ferry --url <broker> ...` with an admin:* key in FERRY_KEY; returns stdout."""
    monkeypatch.setenv("FERRY_KEY", key_factory("admin:*")[1])

    def run(*args: str, stdin: str = "") -> str:
        stdout = io.StringIO()
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        call_command("ferry", "--url", broker_url, *args, stdout=stdout, stderr=io.StringIO())
        return stdout.getvalue()

    return run


def test_remote__topics_produce_consume_purge(remote):
    assert remote("topics", "create", "orders", "--partitions", "2") == (
        "created topic orders with 2 partition(s)\n"
    )
    assert remote("produce", "orders", "--partition", "0", stdin="a\nb\nc\n") == (
        "produced 3 messages to orders\n"
    )
    listed = remote("topics", "list").splitlines()
    assert listed[1].split()[:3] == ["orders", "2", "3"]
    consumed = remote("consume", "orders", "--group", "g", "--max-messages", "2").splitlines()
    assert [line.count('"offset"') for line in consumed] == [1, 1]
    groups = remote("groups", "list").splitlines()
    assert groups[1].split()[:5] == ["g", "orders", "2", "3", "1"]
    assert "RETRY" in remote("groups", "describe", "g")
    purged = remote("topics", "purge", "orders", "--up-to", "0:2").splitlines()
    assert purged[0] == "purged 2 message(s) from orders"
    assert remote("topics", "describe", "orders").splitlines()[-2].split()[:4] == [
        "0",
        "2",
        "3",
        "1",
    ]
    assert remote("groups", "delete", "g") == "deleted group g\n"
    assert remote("topics", "delete", "orders") == "deleted topic orders\n"
    # The broker wrote the audit log, as the key.
    assert set(models.AuditEntry.objects.values_list("source", flat=True)) == {"api"}


def test_remote__keys_and_dlq(remote):
    created = remote("apikey", "create", "ci", "--allow", "produce:*").splitlines()
    assert created[0] == "created API key ci"
    assert created[-1].startswith("fry_")
    rows = [line.split() for line in remote("apikey", "list").splitlines()[1:]]
    assert [rows[-1][0], rows[-1][2], rows[-1][3]] == ["ci", "produce:*", "no"]
    assert remote("apikey", "revoke", "ci") == "revoked API key ci\n"
    remote("topics", "create", "t")
    remote("consume", "t", "--group", "g")
    assert remote("dlq", "list", "g").splitlines()[0].split()[0] == "ID"
    assert remote("dlq", "redrive", "g", "--all") == "redriven 0; missing: none\n"
    assert remote("dlq", "purge", "g", "--all") == "purged 0\n"


def test_remote__errors(remote, monkeypatch, broker_url):
    with pytest.raises(CommandError, match=r"^topic_not_found: "):
        remote("topics", "describe", "missing")
    with pytest.raises(CommandError, match="has no remote form"):
        remote("messages", "show", "t", "0", "0")
    monkeypatch.delenv("FERRY_KEY")
    with pytest.raises(CommandError, match="FERRY_KEY"):
        remote("topics", "list")
    monkeypatch.setenv("FERRY_KEY", "fry_wrong")
    with pytest.raises(CommandError, match=r"^unauthenticated: "):
        remote("topics", "list")


def test_remote__reset_lookup_scheduled_audit(remote):
    remote("topics", "create", "orders")
    remote("produce", "orders", "--key", "k", stdin="a\nb\nc\n")
    remote("consume", "orders", "--group", "g")
    preview = remote("groups", "reset", "g", "--topic", "orders", "--shift-by", "-2", "--dry-run")
    assert preview.splitlines()[1].split() == ["orders", "0", "3", "1", "-2"]
    moved = remote("groups", "reset", "g", "--topic", "orders", "--shift-by", "-2")
    assert moved.splitlines()[1].split()[:3] == ["orders", "0", "1"]
    found = remote("messages", "lookup", "orders", "--key", "k").splitlines()
    assert [line.split()[:2] for line in found[1:]] == [["0", "2"], ["0", "1"], ["0", "0"]]
    remote("produce", "orders", "--delay-ms", "60000", stdin="later\n")
    (row,) = remote("scheduled", "list", "orders").splitlines()[1:]
    sid = row.split()[0]
    assert "is due" in remote("scheduled", "reschedule", sid, "--delay-ms", "120000")
    assert remote("scheduled", "deliver-now", sid).endswith("is due now\n")
    actions = [line.split()[4] for line in remote("audit", "list").splitlines()[1:]]
    assert actions[:3] == ["scheduled.deliver_now", "scheduled.reschedule", "group.reset"]
    with pytest.raises(CommandError, match="no remote form"):
        remote("messages", "lookup", "orders", "--tag", "x")
