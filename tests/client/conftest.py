"""Fixtures for the client's tests: a live broker, keys, and a consumer running on a thread."""

import contextlib
import threading
import time

import pytest

from ferry_client import Admin
from tests.integration.conftest import broker_url, start_daphne, stop, tls_broker

__all__ = ["broker_url", "running", "start_daphne", "stop", "tls_broker", "wait_for"]

WAIT_S = 10


def wait_for(predicate, timeout=WAIT_S, what="condition"):
    """Poll until predicate() is true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def running(consumer):
    """Run a Consumer on a thread for the block; stop it and re-raise what run() raised."""
    failures = []

    def target():
        try:
            consumer.run()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield failures
    finally:
        consumer.stop()
        thread.join(WAIT_S)
    assert not thread.is_alive(), "the consumer did not stop"
    if failures:
        raise failures[0]


@pytest.fixture
def secret(key_factory):
    """An admin:* key's secret (every permission)."""
    return key_factory("admin:*")[1]


@pytest.fixture
def admin(broker_url, secret):
    with Admin(broker_url, secret) as client:
        yield client
