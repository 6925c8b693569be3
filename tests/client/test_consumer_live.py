"""Consumers against a real Daphne: push and pull, ack and nack, concurrency, order, failover."""

import asyncio
import os
import socket
import threading
import time

import pytest

from ferry_client import AsyncConsumer, Consumer, Delivery, FerryError, Producer, Reject
from tests.client.conftest import running, start_daphne, stop, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def produce(url, secret, topic, values, **fields):
    with Producer(url, secret) as producer:
        return [producer.send(topic, v, **fields) for v in values]


def group_topic(admin, group, topic):
    (offsets,) = [t for t in admin.describe_group(group)["topics"] if t["topic"] == topic]
    return offsets


def dead_letters(admin, group):
    try:
        return admin.list_dead_letters(group).total
    except FerryError as exc:
        if exc.code != "group_not_found":  # the group exists once the consumer joined
            raise
        return 0


def settled(admin, group, topic):
    """Nothing left to deliver or settle: the committed offsets reached the end."""
    offsets = group_topic(admin, group, topic)
    return offsets["lag"] == 0 and not any(p["in_flight"] for p in offsets["partitions"])


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_consumer__acks_what_the_handler_returns_from(
    mode, broker_url, secret, topic_factory, admin
):
    topic = topic_factory(partitions=2).name
    produce(broker_url, secret, topic, range(6))
    seen: list[Delivery] = []
    consumer = Consumer(broker_url, secret, "billing", topic, seen.append, mode=mode)
    with running(consumer):
        wait_for(lambda: len(seen) == 6, what="six messages")
        wait_for(lambda: settled(admin, "billing", topic), what="acks")
        # The member says which process it is, for an operator reading the console.
        [member] = admin.describe_group("billing")["members"]
        assert member["client"] == f"ferry_client {socket.gethostname()}:{os.getpid()}"
        assert member["host"].startswith("websocket" if mode == "push" else "rest")
    assert sorted(d.value for d in seen) == list(range(6))
    assert all(d.attempt == 1 and d.receipt and d.topic == topic for d in seen)
    # Stopping left the group.
    assert admin.describe_group("billing")["members"] == []


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_consumer__nacks_with_the_error_text(mode, broker_url, secret, topic_factory, admin):
    topic = topic_factory(trace=True).name
    admin.configure_group("retrying", retry_delays_ms=[0])
    produce(broker_url, secret, topic, ["flaky"])
    attempts = []

    def handler(delivery):
        attempts.append(delivery.attempt)
        if delivery.attempt == 1:
            raise ValueError("database timeout")

    with running(Consumer(broker_url, secret, "retrying", topic, handler, mode=mode)):
        wait_for(lambda: attempts == [1, 2], what="the redelivery")
        wait_for(lambda: settled(admin, "retrying", topic), what="the ack")
    nacked = [e for e in admin.trace(topic, 0, 0) if e["event"] == "nacked"]
    assert [e["detail"]["error"] for e in nacked] == ["database timeout"]


def test_consumer__reject_dead_letters(broker_url, secret, topic_factory, admin):
    topic = topic_factory().name
    produce(broker_url, secret, topic, ["poison"])

    def handler(delivery):
        raise Reject("cannot parse")

    with running(Consumer(broker_url, secret, "strict", topic, handler)):
        wait_for(lambda: dead_letters(admin, "strict") == 1, what="the dead letter")
    (letter,) = admin.list_dead_letters("strict").items
    assert (letter["reason"], letter["last_error"]) == ("rejected", "cannot parse")
    assert letter["message"]["value"] == "poison"


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_consumer__concurrency_runs_handlers_at_once(
    mode, broker_url, secret, topic_factory, admin
):
    topic = topic_factory().name
    produce(broker_url, secret, topic, range(4))
    # Passes only when four handlers wait at the barrier together.
    barrier = threading.Barrier(4, timeout=5)
    done = []

    def handler(delivery):
        barrier.wait()
        done.append(delivery.value)

    consumer = Consumer(broker_url, secret, "wide", topic, handler, mode=mode, concurrency=4)
    with running(consumer):
        wait_for(lambda: len(done) == 4, what="four handlers")
        wait_for(lambda: settled(admin, "wide", topic), what="acks")


def test_async_consumer__async_handlers_run_as_tasks(broker_url, secret, topic_factory, admin):
    topic = topic_factory().name
    produce(broker_url, secret, topic, range(3))

    async def main():
        barrier = asyncio.Barrier(3)
        done = []

        async def handler(delivery):
            async with asyncio.timeout(5):
                await barrier.wait()
            done.append(delivery.value)
            if len(done) == 3:
                consumer.stop()

        consumer = AsyncConsumer(broker_url, secret, "tasks", topic, handler, concurrency=3)
        async with asyncio.timeout(10):
            await consumer.run()
        return done

    assert sorted(asyncio.run(main())) == [0, 1, 2]
    assert settled(admin, "tasks", topic)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_consumer__ordered_runs_a_partition_in_order(
    mode, broker_url, secret, topic_factory, admin
):
    topic = topic_factory(partitions=2).name
    for partition in (0, 1):
        produce(broker_url, secret, topic, range(8), partition=partition)
    busy = {0: 0, 1: 0}
    most_busy = {0: 0, 1: 0}
    seen: dict[int, list[int]] = {0: [], 1: []}
    lock = threading.Lock()

    def handler(delivery):
        with lock:
            busy[delivery.partition] += 1
            most_busy[delivery.partition] = max(
                most_busy[delivery.partition], busy[delivery.partition]
            )
        time.sleep(0.01)
        with lock:
            busy[delivery.partition] -= 1
            seen[delivery.partition].append(delivery.offset)

    consumer = Consumer(
        broker_url, secret, "ordered", topic, handler, mode=mode, concurrency=4, ordered=True
    )
    with running(consumer):
        wait_for(lambda: len(seen[0]) + len(seen[1]) == 16, what="sixteen messages")
    assert seen == {0: list(range(8)), 1: list(range(8))}
    assert most_busy == {0: 1, 1: 1}


def test_consumer__refused_subscription_raises(broker_url, secret):
    consumer = Consumer(broker_url, secret, "g", "no-such-topic", print)
    with pytest.raises(FerryError) as refused:
        consumer.run()
    assert refused.value.code == "topic_not_found"


def test_consumer_push__resubscribes_on_the_next_url(broker_url, secret, topic_factory, admin):
    topic = topic_factory().name
    # A broker of our own to stop; the session's broker is the one to fail over to.
    first, first_url = start_daphne()
    seen: list[Delivery] = []
    try:
        consumer = Consumer([first_url, broker_url], secret, "failover", topic, seen.append)
        with running(consumer):
            # Produced where the consumer is: without Redis, brokers do not wake each other.
            produce(first_url, secret, topic, ["before"])
            wait_for(lambda: len(seen) == 1, what="the first message")
            # Acked first: an ack still waiting when the broker goes means a redelivery.
            wait_for(lambda: settled(admin, "failover", topic), what="the first ack")
            stop(first)
            produce(broker_url, secret, topic, ["after"])
            wait_for(lambda: len(seen) == 2, what="the message after failover")
            wait_for(lambda: settled(admin, "failover", topic), what="acks")
    finally:
        stop(first)
    assert [d.value for d in seen] == ["before", "after"]
