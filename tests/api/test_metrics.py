"""/metrics: the Prometheus text format, its figures and its protection (broker/metrics.py)."""

import base64
from typing import Any

import orjson
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from broker import models
from broker.core import dbthreads, delivery, groups, keys, log, membership
from broker.core.log import recent
from broker.core.records import NewMessage

CONSOLE = keys.CONSOLE


def samples(text):
    """{(name, frozenset(labels)): value} of a scrape."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(client=None, **extra):
    response = (client or Client()).get("/metrics", **extra)
    return response, samples(response.content.decode()) if response.status_code == 200 else {}


@pytest.fixture
def busy(topic_factory):
    topic_factory("orders", partitions=2)
    topic_factory("secret")
    log.append_messages(CONSOLE, "orders", [NewMessage(b"1", partition=0) for _ in range(5)])
    log.append_messages(CONSOLE, "orders", [NewMessage(b"1", partition=1)])
    groups.commit_offsets(CONSOLE, "g", "orders", {0: 2})
    groups.configure_group(CONSOLE, "d", retry_delays_ms=[60_000])
    membership.join_group(CONSOLE, "d", "orders", "m")
    got = delivery.deliver_messages(CONSOLE, "d", "orders", "m", 3).deliveries
    delivery.nack_messages(CONSOLE, "d", [got[0].receipt])
    delivery.reject_messages(CONSOLE, "d", [got[1].receipt])
    log.append_messages(CONSOLE, "secret", [NewMessage(orjson.dumps(1), delay_ms=60_000)])
    now = log.now_ms()
    models.BrokerProcess.objects.create(
        name="h:1", kind="server", version="0.1.0", started_ms=now, heartbeat_ms=now
    )


def test_metrics__figures(busy):
    response, got = scrape()
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert got[("ferry_topic_messages_in_total", frozenset({("topic", "orders")}))] == 6
    p0 = frozenset({("topic", "orders"), ("partition", "0")})
    assert got[("ferry_partition_messages_stored", p0)] == 5
    assert got[("ferry_partition_bytes_stored", p0)] > 0
    g0 = frozenset({("group", "g"), ("topic", "orders"), ("partition", "0")})
    assert got[("ferry_group_lag", g0)] == 3
    assert got[("ferry_group_committed_offset", g0)] == 2
    d = {("group", "d"), ("topic", "orders")}

    def over_partitions(name):
        return sum(got.get((name, frozenset({*d, ("partition", p)})), 0) for p in ("0", "1"))

    # Three delivered, one nacked (waiting for its retry), one rejected (dead).
    assert over_partitions("ferry_group_in_flight") == 1
    assert over_partitions("ferry_group_retry_waiting") == 1
    assert got[("ferry_dead_letters", frozenset(d))] == 1
    assert got[("ferry_scheduled_messages", frozenset({("topic", "secret")}))] == 1
    assert got[("ferry_broker_processes_alive", frozenset({("kind", "server")}))] >= 1
    assert got[("ferry_info", frozenset({("version", "0.1.0")}))] == 1


def test_metrics__this_processs_database_threads(db, monkeypatch):
    figures = {("write", "append_batches"): dbthreads.CallFigures(3, 0.5, 0.25)}
    monkeypatch.setattr(dbthreads, "_figures", figures)
    _, got = scrape()
    labels = frozenset({("pool", "write"), ("call", "append_batches")})
    assert got[("ferry_database_calls_total", labels)] == 3
    assert got[("ferry_database_call_seconds_total", labels)] == 0.5
    assert got[("ferry_database_call_queued_seconds_total", labels)] == 0.25


def test_metrics__this_processs_message_cache(
    topic_factory, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(recent, "_answered", {"kept": 0, "read": 0})
    recent.clear()
    topic_factory("orders")
    with django_capture_on_commit_callbacks(execute=True):
        log.append_messages(CONSOLE, "orders", [NewMessage(b"1") for _ in range(3)])
    membership.join_group(CONSOLE, "g", "orders", "m")
    delivery.deliver_messages(CONSOLE, "g", "orders", "m", 10)
    recent.clear()
    membership.join_group(CONSOLE, "g2", "orders", "m")
    delivery.deliver_messages(CONSOLE, "g2", "orders", "m", 10)  # nothing kept: read
    _, got = scrape()
    assert got[("ferry_message_cache_reads_total", frozenset({("result", "kept")}))] == 1
    assert got[("ferry_message_cache_reads_total", frozenset({("result", "read")}))] == 1
    assert got[("ferry_message_cache_bytes", frozenset())] == 0


@pytest.mark.parametrize(
    ("address", "status"), [("127.0.0.1", 200), ("::1", 200), ("10.1.2.3", 403)]
)
def test_metrics__loopback_by_default(db, address, status):
    response = Client().get("/metrics", REMOTE_ADDR=address)
    assert response.status_code == status
    if status == 403:
        assert response.json()["error"]["code"] == "permission_denied"


def test_metrics__open(db, settings):
    settings.FERRY_METRICS_AUTH = "open"
    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200


def test_metrics__key_sees_its_topics(busy, settings, key_factory):
    settings.FERRY_METRICS_AUTH = "key"
    _, admin_orders = key_factory("admin:orders")
    _, consumer = key_factory("consume:*")
    remote: dict[str, Any] = {"REMOTE_ADDR": "10.1.2.3"}
    response, got = scrape(Client(HTTP_AUTHORIZATION=f"Bearer {admin_orders}"), **remote)
    assert response.status_code == 200
    topics = {dict(labels).get("topic") for _, labels in got} - {None}
    assert topics == {"orders"}
    assert Client(HTTP_AUTHORIZATION=f"Bearer {consumer}").get("/metrics").status_code == 403
    assert Client().get("/metrics").status_code == 401
    assert Client(HTTP_AUTHORIZATION="Bearer fry_nope").get("/metrics").status_code == 401


def test_metrics__basic(db, settings):
    settings.FERRY_METRICS_AUTH = "basic:prom:s3:cret"
    good = base64.b64encode(b"prom:s3:cret").decode()
    bad = base64.b64encode(b"prom:nope").decode()
    remote: dict[str, Any] = {"REMOTE_ADDR": "10.1.2.3"}
    assert Client(HTTP_AUTHORIZATION=f"Basic {good}").get("/metrics", **remote).status_code == 200
    refused = Client(HTTP_AUTHORIZATION=f"Basic {bad}").get("/metrics", **remote)
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == 'Basic realm="ferry metrics"'
    assert Client(HTTP_AUTHORIZATION="Basic !!").get("/metrics", **remote).status_code == 401


def test_metrics__post_refused(db):
    assert Client().post("/metrics").status_code == 405
