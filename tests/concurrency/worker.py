"""A producer, poller or member in its own process, against the test database FERRY_TEST_DB_NAME.

Usage: python -m tests.concurrency.worker produce TOPIC BATCHES BATCH_SIZE [ID_PREFIX]
       python -m tests.concurrency.worker poll TOPIC GROUP ROUNDS
       python -m tests.concurrency.worker release BATCH_SIZE ROUNDS
       python -m tests.concurrency.worker member TOPIC GROUP MEMBER ROUNDS [batch=N]
                                         [auto_ack=1] [pause_ms=N] [want=N] [push=1]
       python -m tests.concurrency.worker sweep SECONDS
       python -m tests.concurrency.worker outbox_crash TOPIC COUNT
Prints one JSON document with what it stored or received.
"""

import os
import sys
import time

import django
import orjson

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from broker.core import delivery, groups, keys, log, membership, scheduling  # noqa: E402
from broker.core.records import NewMessage  # noqa: E402


def produce(topic: str, batches: int, batch_size: int, id_prefix: str = "") -> list:
    stored = []
    for b in range(batches):
        batch = [
            NewMessage(
                value=orjson.dumps([os.getpid(), b, i]),
                client_id=f"{id_prefix}{b}-{i}" if id_prefix else None,
            )
            for i in range(batch_size)
        ]
        stored += [
            (r.partition, r.offset, r.duplicate)
            for r in log.append_messages(keys.CONSOLE, topic, batch)
        ]
    return stored


def poll(topic: str, group: str, rounds: int) -> list:
    got = []
    for _ in range(rounds):
        result = groups.poll_messages(keys.CONSOLE, group, topic, 7, auto_commit=True)
        got += [(m.partition, m.offset) for m in result.messages]
    return got


def member(
    topic: str,
    group: str,
    member_id: str,
    rounds: int,
    *,
    batch: int = 5,
    auto_ack: int = 0,
    pause_ms: int = 0,
    want: int = 0,
    push: int = 0,
) -> list:
    """Join, take deliveries and ack each batch at once, leave.

    Returns one [partition, offset, attempt, member, delivered_s, acked_s] per delivery; the
    times are time.monotonic(), one clock for every process of the machine. Stops early once it
    has `want` deliveries (0: run every round). With push, the ack of a batch and the delivery
    of the next are one call (delivery.ack_and_deliver, as a waiting WebSocket subscriber's),
    and the last batch is acked on its own.
    """
    membership.join_group(keys.CONSOLE, group, topic, member_id)
    got: list = []
    unacked: list[str] = []
    try:
        for _ in range(rounds):
            if push and unacked:
                both = delivery.ack_and_deliver(
                    keys.CONSOLE, group, unacked, topic, member_id, 0, batch
                )
                assert not both.acked.stale, both.acked
                result = both.delivered
                if result is None:
                    break  # the member is gone: nothing was delivered
            else:
                result = delivery.deliver_messages(
                    keys.CONSOLE, group, topic, member_id, batch, auto_ack=bool(auto_ack)
                )
            delivered_s = time.monotonic()
            if push:
                unacked = [d.receipt for d in result.deliveries]
                got += [
                    [d.message.partition, d.message.offset, d.attempt, member_id, delivered_s, 0]
                    for d in result.deliveries
                ]
                time.sleep(pause_ms / 1000)
                continue
            if result.deliveries and not auto_ack:
                acked_s = time.monotonic()
                settled = delivery.ack_messages(
                    keys.CONSOLE, group, [d.receipt for d in result.deliveries]
                )
                # A long ack deadline: nothing may expire between delivery and ack.
                assert not settled.stale, settled
            else:
                acked_s = delivered_s
            got += [
                [d.message.partition, d.message.offset, d.attempt, member_id, delivered_s, acked_s]
                for d in result.deliveries
            ]
            if want and len(got) >= want:
                break
            time.sleep(pause_ms / 1000)
        if unacked:
            assert not delivery.ack_messages(keys.CONSOLE, group, unacked).stale
    finally:
        membership.leave_group(keys.CONSOLE, group, member_id)
    return got


def release(batch_size: int, rounds: int) -> list:
    """Run the scheduler's release rounds; returns how many each round released."""
    return [scheduling.release_due(batch_size) for _ in range(rounds)]


def sweep(seconds: float) -> list:
    """Run the deadline sweep in a loop for this long; returns how many each round handled."""
    handled = []
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        handled.append(delivery.redeliver_expired())
        time.sleep(0.02)
    return handled


def outbox_crash(topic: str, count: int) -> None:
    """Publish through the outbox and die (SIGKILL-like) right after the commit, before the
    promotion: the process's first on-commit callback exits it."""
    from django.db import transaction

    from broker import outbox

    with transaction.atomic():
        transaction.on_commit(lambda: os._exit(9))
        for i in range(count):
            outbox.publish(topic, i, key=str(i))


def options(pairs: list[str]) -> dict[str, int]:
    return {name: int(value) for name, value in (pair.split("=", 1) for pair in pairs)}


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "produce":
        out = produce(args[0], int(args[1]), int(args[2]), *(args[3:4]))
    elif command == "member":
        out = member(args[0], args[1], args[2], int(args[3]), **options(args[4:]))
    elif command == "release":
        out = release(int(args[0]), int(args[1]))
    elif command == "sweep":
        out = sweep(float(args[0]))
    elif command == "outbox_crash":
        outbox_crash(args[0], int(args[1]))
        out = []
    else:
        out = poll(args[0], args[1], int(args[2]))
    sys.stdout.write(orjson.dumps(out).decode())
