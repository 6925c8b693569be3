"""ferry_client over HTTPS (docs/client.md#tls): the suite's broker behind HAProxy with TLS and a
self-signed certificate (the README's production set-up, `scripts/haproxy cert`), trusted with
`verify=` the certificate's file; refused without it, and nothing sent."""

import asyncio
import logging
import ssl
import threading
import time

import pytest

from ferry_client import (
    Admin,
    AsyncProducer,
    BrokerUnavailable,
    Consumer,
    Delivery,
    Producer,
    Reader,
    ReadProcessWrite,
)
from ferry_client.consumer import Mode
from ferry_client.transport import Verify

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
WAIT_S = 30


def consume_one(url: str, key: str, group: str, mode: Mode, verify: Verify) -> object:
    """The first message a new group of `tls` gets, in push (wss://) or pull mode."""
    got: list[object] = []

    def handle(delivery: Delivery) -> None:
        got.append(delivery.value)
        consumer.stop()

    consumer = Consumer(url, key, group, "tls", handle, mode=mode, verify=verify)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    consumer.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert got, "nothing consumed"
    return got[0]  # (messages prefetched with it may be handled before stop() takes)


def test_every_client_over_https__trusting_the_certificates_file(tls_broker, key_factory):
    _, key = key_factory("admin:*")
    url, ca_file = tls_broker.url, str(tls_broker.ca_file)
    assert url.startswith("https://127.0.0.1:")
    with Admin(url, key, verify=ca_file) as admin:
        admin.create_topic("tls", 1)
    # A path as str or Path, or an SSLContext of one's own: the same trust.
    with Producer(url, key, verify=tls_broker.ca_file) as producer:
        assert producer.send("tls", "over tls").offset == 0

    async def send_async() -> int | None:
        context = ssl.create_default_context(cafile=ca_file)
        async with AsyncProducer(url, key, verify=context) as producer:
            return (await producer.send("tls", "async over tls")).offset

    assert asyncio.run(send_async()) == 1
    with Reader(url, key, verify=ca_file) as reader:
        page = reader.fetch("tls", 0, 0)
    assert [m["value"] for m in page.messages] == ["over tls", "async over tls"]
    # The push consumer's WebSocket (wss://) trusts what its REST calls trust.
    assert consume_one(url, key, "tls-push", "push", ca_file) == "over tls"
    assert consume_one(url, key, "tls-pull", "pull", ca_file) == "over tls"
    with ReadProcessWrite(
        url, key, group="tls-rpw", topic="tls", member_id="m1", verify=ca_file
    ) as rpw:
        assert rpw.process(lambda deliveries, txn: None) == 2


def test_an_untrusted_certificate__refused_and_nothing_stored(
    tls_broker, broker_url, key_factory, tmp_path, caplog
):
    _, key = key_factory("admin:*")
    with Admin(broker_url, key) as admin:
        admin.create_topic("tls-untrusted", 1)
    # The default trust store does not hold a self-signed certificate.
    producer = Producer(tls_broker.url, key, retries=0)
    with producer, pytest.raises(BrokerUnavailable) as refused:
        producer.send("tls-untrusted", "never")
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value.__cause__)
    with Reader(broker_url, key) as reader:
        assert reader.offsets("tls-untrusted")[0].end_offset == 0
    # A CA file that is not there fails at once, not at the first request.
    with pytest.raises(FileNotFoundError):
        Producer(tls_broker.url, key, verify=tmp_path / "missing.crt")
    # A push consumer keeps trying (a broker's certificate can be renewed) and says why.
    consumer = Consumer(tls_broker.url, key, "g", "tls-untrusted", lambda d: None)
    thread = threading.Thread(target=consumer.run, daemon=True)

    def said_why() -> bool:
        return any(
            r.getMessage().startswith("subscription on")
            and "CERTIFICATE_VERIFY_FAILED" in r.getMessage()
            for r in caplog.records
        )

    with caplog.at_level(logging.WARNING, logger="ferry_client"):
        thread.start()
        deadline = time.monotonic() + WAIT_S
        while not said_why():
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
    consumer.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive()
