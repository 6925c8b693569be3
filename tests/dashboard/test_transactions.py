"""The console's transactions page: open ones with their age; commit and roll back, audited."""

import orjson
import pytest

from broker import models
from broker.core import activity, keys, log, transactions
from broker.core.records import NewMessage


@pytest.fixture
def open_one(topic_factory, key_factory):
    topic_factory("ledger")
    producer, _ = key_factory("produce:ledger")
    t = transactions.begin_transaction(producer, "billing-1", 60_000)
    transactions.add_messages(producer, t.id, "ledger", [NewMessage(orjson.dumps(1))])
    return t


def test_transaction_list__open_ones_with_age(viewer, open_one):
    page = viewer.get("/transactions/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-transaction-id="{open_one.id}"' in html
    assert "billing-1" in html
    assert 'data-testid="transaction-age"' in html
    # A viewer sees no actions.
    assert 'data-testid="transaction-commit"' not in html
    assert viewer.get("/transactions/live/?state=committed").status_code == 200


def test_transaction_commit__operator_and_audited(operator, open_one):
    html = operator.get("/transactions/").content.decode()
    assert 'data-testid="transaction-commit"' in html
    response = operator.post(f"/transactions/{open_one.id}/commit/")
    assert response.status_code == 302
    assert transactions.get_transaction(keys.CONSOLE, open_one.id).state == "committed"
    assert len(log.read_messages(keys.CONSOLE, "ledger", 0, None, 10).messages) == 1
    entry = models.AuditEntry.objects.get(action="transaction.commit")
    assert (entry.source, entry.outcome, entry.target) == ("dashboard", "ok", str(open_one.id))


def test_transaction_rollback__operator_and_audited(operator, open_one):
    operator.post(f"/transactions/{open_one.id}/rollback/")
    info = transactions.get_transaction(keys.CONSOLE, open_one.id)
    assert (info.state, info.reason) == ("rolled_back", "operator")
    operator.post(f"/transactions/{open_one.id}/commit/")
    assert models.AuditEntry.objects.filter(outcome="transaction_not_open").count() == 1


def test_transaction_commit__viewer_refused(viewer, open_one):
    assert viewer.post(f"/transactions/{open_one.id}/commit/").status_code == 403
    assert transactions.get_transaction(keys.CONSOLE, open_one.id).state == "open"


def test_fingerprint__transactions_area(open_one):
    before = activity.fingerprint()
    transactions.rollback_transaction(keys.CONSOLE, open_one.id)
    assert "transactions" in activity.fingerprint().changed_since(before)
