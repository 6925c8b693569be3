"""The Django admin: every list and a change page render, names not ids, bounded queries."""

import orjson
import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from broker import models
from broker.core import delivery, history, keys, log, membership, processes, redrives
from broker.core.records import NewMessage

CONSOLE = keys.CONSOLE


@pytest.fixture
def data(topic_factory, key_factory):
    """A bit of everything the admin lists."""
    topic_factory("orders", partitions=2, trace=True)
    log.append_messages(
        CONSOLE,
        "orders",
        [
            NewMessage(orjson.dumps({"n": 1, "name": "ä"}), key="k1", headers={"h": "v"}),
            NewMessage(b"\x00\x01\xff", is_json=False, key="bin"),
            NewMessage(b"plain text", is_json=False, client_id="c-1"),
            NewMessage(orjson.dumps(1), delay_ms=60_000),
        ],
    )
    membership.join_group(CONSOLE, "g", "orders", "m")
    got = delivery.deliver_messages(CONSOLE, "g", "orders", "m", 10).deliveries
    delivery.reject_messages(CONSOLE, "g", [got[0].receipt], error="bad")
    key_factory("consume:orders", name="reader")
    models.AuditEntry.objects.create(
        at_ms=log.now_ms(),
        actor="user:ann",
        source="dashboard",
        action="topic.create",
        target="orders",
        outcome="ok",
    )
    history.sample_metrics()
    processes.heartbeat()
    redrives.start_redrive(CONSOLE, "g")
    assert models.TraceEvent.objects.exists()


def registered():
    """The broker's models in the admin (auth's users and groups are Django's own)."""
    broker_models = [m for m in admin.site._registry if m._meta.app_label == "broker"]
    return sorted(broker_models, key=lambda m: m.__name__)


def test_admin__every_list_and_change_page_render(admin_client, data):
    for model in registered():
        meta = model._meta
        changelist = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        response = admin_client.get(changelist)
        assert response.status_code == 200, changelist
        first = model.objects.order_by("pk").first()
        assert first is not None, f"no {meta.model_name} in the test data"
        change = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[first.pk])
        assert admin_client.get(change).status_code == 200, change
        # Filters and search on every list.
        model_admin = admin.site._registry[model]
        assert model_admin.search_fields, meta.model_name
        assert model_admin.list_filter, meta.model_name
        assert admin_client.get(changelist, {"q": "orders"}).status_code == 200


def test_admin__names_times_and_values(admin_client, data):
    page = admin_client.get(reverse("admin:broker_message_changelist")).content.decode()
    first = models.Message.objects.select_related("partition__topic").order_by("id")[0]
    assert f"orders[{first.partition.number}]@{first.offset}" in page
    assert "hex: 00 01 ff" in page
    message = models.Message.objects.get(key="k1")
    page = admin_client.get(reverse("admin:broker_message_change", args=[message.pk]))
    assert "&quot;name&quot;: &quot;ä&quot;" in page.content.decode()
    letter = models.DeadLetter.objects.get()
    page = admin_client.get(reverse("admin:broker_deadletter_change", args=[letter.pk]))
    assert "bad" in page.content.decode()
    keys_page = admin_client.get(reverse("admin:broker_apikey_changelist")).content.decode()
    assert "consume:orders" in keys_page
    assert str(models.Partition.objects.select_related("topic").first()) == "orders[0]"
    assert str(letter) == f"g orders[{letter.partition_number}]@{letter.offset}"


def test_admin__nothing_editable(admin_client, data):
    letter = models.DeadLetter.objects.get()
    url = reverse("admin:broker_deadletter_change", args=[letter.pk])
    assert admin_client.post(url, {"reason": "expired"}).status_code == 403
    assert admin_client.get(reverse("admin:broker_topic_add")).status_code == 403


@pytest.mark.parametrize("model_name", ["message", "deadletter", "scheduledmessage", "inflight"])
def test_admin__list_queries_do_not_grow_with_rows(admin_client, data, model_name):
    url = reverse(f"admin:broker_{model_name}_changelist")

    def count():
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(url).status_code == 200
        return len(queries)

    before = count()
    log.append_messages(CONSOLE, "orders", [NewMessage(orjson.dumps(i)) for i in range(20)])
    log.append_messages(
        CONSOLE, "orders", [NewMessage(orjson.dumps(i), delay_ms=60_000) for i in range(5)]
    )
    got = delivery.deliver_messages(CONSOLE, "g", "orders", "m", 30).deliveries
    delivery.reject_messages(CONSOLE, "g", [d.receipt for d in got[:10]])
    assert count() == before
    assert before <= 12
