"""Admin against a real Daphne: topics, groups, dead letters and traces."""

import pytest

from ferry_client import UNSET, Admin, Consumer, Delivery, FerryError, Producer
from tests.client.conftest import running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_admin__topic_lifecycle(admin):
    created = admin.create_topic("orders", 2, retention_ms=60_000, trace=True)
    assert (created["name"], created["partitions"], created["trace"]) == ("orders", 2, True)
    with pytest.raises(FerryError) as taken:
        admin.create_topic("orders")
    assert (taken.value.code, taken.value.status) == ("topic_exists", 409)
    assert [t["name"] for t in admin.list_topics()] == ["orders"]
    altered = admin.alter_topic("orders", partitions=3, retention_ms=None)
    assert (altered["partitions"], altered["retention_ms"]) == (3, None)
    # Left out (UNSET) keeps the value; None would clear it.
    assert admin.alter_topic("orders", capacity=UNSET)["partitions"] == 3
    assert admin.describe_topic("orders")["partitions"] == 3
    admin.delete_topic("orders")
    with pytest.raises(FerryError) as gone:
        admin.describe_topic("orders")
    assert gone.value.code == "topic_not_found"


def test_admin__lists_read_every_page(admin):
    for name in ("a", "b", "c", "d", "e"):
        admin.create_topic(name)
    for name in ("g1", "g2", "g3"):
        admin.reset_offsets(name, "a", "earliest")
    assert [t["name"] for t in admin.list_topics(page_size=2)] == ["a", "b", "c", "d", "e"]
    assert [g["name"] for g in admin.list_groups(page_size=1)] == ["g1", "g2", "g3"]


def test_admin__groups_configure_describe_reset(broker_url, secret, admin, topic_factory):
    topic = topic_factory(partitions=2).name
    with Producer(broker_url, secret) as producer:
        producer.send_batch(topic, range(4))
    configured = admin.configure_group("audit", max_attempts=3, retry_delays_ms=[0, 100])
    assert configured["settings"]["max_attempts"] == 3
    assert configured["settings"]["retry_delays_ms"] == [0, 100]
    reset = admin.reset_offsets("audit", topic, "latest")
    assert reset["lag"] == 0
    reset = admin.reset_offsets("audit", topic, "offsets", offsets={0: 0})
    assert reset["lag"] == 2
    assert [g["name"] for g in admin.list_groups()] == ["audit"]
    assert admin.describe_group("audit")["topics"][0]["topic"] == topic


def test_admin__dead_letters_list_redrive_purge(broker_url, secret, admin, topic_factory):
    topic = topic_factory().name
    admin.configure_group("payments", max_attempts=1)
    with Producer(broker_url, secret) as producer:
        producer.send_batch(topic, ["a", "b", "c"])
    failing = True
    seen = []

    def handler(delivery):
        seen.append(delivery.value)
        if failing:
            raise RuntimeError(f"cannot pay {delivery.value}")

    with running(Consumer(broker_url, secret, "payments", topic, handler)):
        wait_for(lambda: admin.list_dead_letters("payments").total == 3, what="dead letters")
    page = admin.list_dead_letters("payments", limit=2)
    assert (len(page.items), page.total) == (2, 3)
    letters = list(admin.dead_letters("payments", page_size=2))
    assert [d["last_error"] for d in letters] == ["cannot pay a", "cannot pay b", "cannot pay c"]
    assert {d["reason"] for d in letters} == {"max_attempts"}

    first, second, third = (d["id"] for d in letters)
    assert admin.redrive_dead_letters("payments", [first]) == {"redriven": 1, "missing": []}
    assert admin.purge_dead_letters("payments", [second]) == 1
    failing = False
    seen.clear()
    with running(Consumer(broker_url, secret, "payments", topic, handler)):
        wait_for(lambda: seen == ["a"], what="the redriven message")
    assert [d["id"] for d in admin.dead_letters("payments")] == [third]
    assert admin.purge_dead_letters("payments", topic=topic) == 1
    with pytest.raises(FerryError) as unknown:
        admin.redrive_dead_letters("payments", [third])
    assert unknown.value.code == "dead_letter_not_found"


def test_admin__trace_of_a_message(broker_url, secret, admin, topic_factory):
    topic = topic_factory(trace=True).name
    with Producer(broker_url, secret) as producer:
        producer.send(topic, "traced")
    seen: list[Delivery] = []
    with running(Consumer(broker_url, secret, "tracer", topic, seen.append, mode="pull")):
        wait_for(lambda: "acked" in [e["event"] for e in admin.trace(topic, 0, 0)], what="ack")
    events = admin.trace(topic, 0, 0)
    assert [e["event"] for e in events] == ["produced", "delivered", "acked"]
    assert events[1]["group"] == "tracer"


def test_admin__several_urls_fail_over(broker_url, secret):
    from tests.integration.conftest import free_port

    with Admin([f"http://127.0.0.1:{free_port()}/api/v1/", broker_url], secret) as admin:
        assert admin.health()["status"] == "ok"
