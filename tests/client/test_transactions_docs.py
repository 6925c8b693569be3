"""docs/transactions.md's Python examples, run against a real Daphne (and the outbox in-process)."""

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import RequestFactory

from broker import models
from broker.core import keys, log, topics
from broker.core.records import NewMessage

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "transactions.md"


def blocks():
    """The ```python blocks (a block titled like ```python (shop/models.py) is shown only)."""
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


class Orders:
    """The example app's Order model, standing in: a real row in the caller's transaction."""

    @staticmethod
    def create(customer, amount_cents):
        row = models.ApiKey.objects.create(
            name=f"order-{customer}", key_hash=customer, prefix="x", permissions=[]
        )
        return SimpleNamespace(pk=row.pk, amount_cents=amount_cents)


def values(topic):
    return [m.value for m in log.read_messages(keys.CONSOLE, topic, 0, None, 100).messages]


def test_transactions_doc__examples_run(broker_url, secret):
    for name in ("orders", "payments", "totals"):
        topics.create_topic(keys.CONSOLE, name, 1)
    log.append_messages(
        keys.CONSOLE,
        "payments",
        [NewMessage(f'{{"amount": {n}}}'.encode()) for n in (5, 7, 30)],
    )
    local, read_process_write, view = blocks()
    env = {"FERRY_URL": broker_url, "FERRY_KEY": secret}
    exec(local, dict(env))  # the doc's own example
    assert values("orders") == [b'{"order":42,"paid":true}']
    exec(read_process_write, dict(env))  # the doc's own example
    assert values("totals") == [b'{"total":42,"count":3}']
    assert not models.InFlight.objects.exists()
    namespace: dict[str, Any] = {"Order": SimpleNamespace(objects=Orders)}
    exec(view, namespace)  # the doc's own example
    request = RequestFactory().post("/orders", {"customer": "ada"})
    response = namespace["place_order"](request)
    assert response.status_code == 201
    assert len(values("orders")) == 2
