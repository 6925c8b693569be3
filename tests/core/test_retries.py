"""Redriven dead letters and the topic's TTL (core/retries.py, docs/semantics.md#message-ttl)."""

import time

import orjson

from broker import models
from broker.core import delivery, groups, log, membership, retries
from broker.core.records import NewMessage


def produce(console, topic, count, partition=0):
    log.append_messages(
        console,
        topic,
        [NewMessage(orjson.dumps(i), partition=partition) for i in range(count)],
    )


def deliver(console, topic, member="m"):
    return delivery.deliver_messages(console, "g", topic, member, 100)


def expire(topic):
    """Give the topic a TTL of 1 ms and wait past it: every stored message is expired."""
    models.Topic.objects.filter(name=topic).update(message_ttl_ms=1)
    time.sleep(0.01)


def redrive_expired(console):
    letters = retries.list_dead_letters(console, "g", reason="expired").items
    assert letters
    result = retries.redrive_dead_letters(console, "g", [letter.id for letter in letters])
    assert (result.redriven, result.missing) == (len(letters), ())


def test_redrive_dead_letters__expired_is_delivered_past_its_ttl(topic_factory, console):
    topic = topic_factory(message_ttl_ms=1).name
    produce(console, topic, 1)
    time.sleep(0.01)
    membership.join_group(console, "g", topic, "m")
    first = deliver(console, topic)
    assert (first.deliveries, first.expired) == ((), 1)
    redrive_expired(console)
    again = deliver(console, topic)
    assert [(d.message.offset, d.attempt) for d in again.deliveries] == [(0, 1)]
    assert again.expired == 0
    assert retries.list_dead_letters(console, "g").total == 0
    assert delivery.ack_messages(console, "g", [again.deliveries[0].receipt]).settled == 1
    assert models.InFlight.objects.count() == 0
    assert retries.list_dead_letters(console, "g").total == 0


def test_redrive_dead_letters__nacked_or_past_its_deadline_it_is_retried_not_expired(
    topic_factory, console
):
    topic = topic_factory(message_ttl_ms=1).name
    produce(console, topic, 1)
    time.sleep(0.01)
    membership.join_group(console, "g", topic, "m")
    groups.configure_group(console, "g", retry_delays_ms=[0])
    assert deliver(console, topic).expired == 1
    redrive_expired(console)
    (d,) = deliver(console, topic).deliveries
    delivery.nack_messages(console, "g", [d.receipt], error="boom")
    retry = deliver(console, topic)
    assert [(r.message.offset, r.attempt) for r in retry.deliveries] == [(0, 2)]
    assert retry.expired == 0
    models.InFlight.objects.update(deadline_ms=log.now_ms() - 1)
    assert delivery.redeliver_expired() == 1
    after_deadline = deliver(console, topic)
    assert [(r.message.offset, r.attempt) for r in after_deadline.deliveries] == [(0, 3)]
    assert after_deadline.expired == 0
    assert retries.list_dead_letters(console, "g").total == 0


def test_redrive_dead_letters__a_retry_that_expired_is_delivered_again(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    membership.join_group(console, "g", topic, "m")
    groups.configure_group(console, "g", retry_delays_ms=[0])
    (d,) = deliver(console, topic).deliveries
    delivery.nack_messages(console, "g", [d.receipt])
    expire(topic)
    # Never redriven: a retry past the TTL is dead-lettered.
    retry = deliver(console, topic)
    assert (retry.deliveries, retry.expired) == ((), 1)
    (letter,) = retries.list_dead_letters(console, "g").items
    assert (letter.reason, letter.attempts) == ("expired", 1)
    redrive_expired(console)
    (again,) = deliver(console, topic).deliveries
    assert (again.message.offset, again.attempt) == (0, 1)
    assert retries.list_dead_letters(console, "g").total == 0


def test_redrive_dead_letters__ordered_and_handed_over_it_is_not_expired(topic_factory, console):
    topic = topic_factory(message_ttl_ms=1).name
    produce(console, topic, 2)
    time.sleep(0.01)
    membership.join_group(console, "g", topic, "m")
    groups.configure_group(console, "g", ordered=True, retry_delays_ms=[0])
    assert deliver(console, topic).expired == 2
    redrive_expired(console)
    # One message of the partition in flight at a time, the lowest first.
    (d,) = deliver(console, topic).deliveries
    assert (d.message.offset, d.attempt) == (0, 1)
    # Its member leaves: the next member gets it with the same attempt, still not expired.
    membership.leave_group(console, "g", "m")
    membership.join_group(console, "g", topic, "m2")
    handed = deliver(console, topic, "m2")
    assert [(r.message.offset, r.attempt) for r in handed.deliveries] == [(0, 1)]
    assert handed.expired == 0
    delivery.ack_messages(console, "g", [handed.deliveries[0].receipt])
    (last,) = deliver(console, topic, "m2").deliveries
    assert (last.message.offset, last.attempt) == (1, 1)
    assert retries.list_dead_letters(console, "g").total == 0


def test_redrive_dead_letters__a_plain_poll_moved_past_it_stays_in_the_queue(
    topic_factory, console
):
    """A plain poll takes no retries: a letter behind its committed offset is reported, not
    counted as redriven and lost (docs/api.md#post-groupsgroupdlqredrive)."""
    topic = topic_factory(message_ttl_ms=1).name
    produce(console, topic, 2)
    time.sleep(0.01)
    polled = groups.poll_messages(console, "g", topic, 10, auto_commit=True)
    assert (polled.messages, polled.expired) == ((), 2)
    models.Topic.objects.filter(name=topic).update(message_ttl_ms=None)
    produce(console, topic, 1)  # offset 2, read by the next poll as before
    letters = [letter.id for letter in retries.list_dead_letters(console, "g").items]

    result = retries.redrive_dead_letters(console, "g", letters)

    assert (result.redriven, sorted(result.missing)) == (0, sorted(letters))
    assert retries.list_dead_letters(console, "g").total == 2
    assert not models.InFlight.objects.exists()
    again = groups.poll_messages(console, "g", topic, 10, auto_commit=True)
    assert [m.offset for m in again.messages] == [2]
