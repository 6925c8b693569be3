"""A producer or poller in its own process, against the test database named by FERRY_TEST_DB_NAME.

Usage: python -m tests.concurrency.worker produce TOPIC BATCHES BATCH_SIZE [ID_PREFIX]
       python -m tests.concurrency.worker poll TOPIC GROUP ROUNDS
       python -m tests.concurrency.worker release BATCH_SIZE ROUNDS
       python -m tests.concurrency.worker member TOPIC GROUP MEMBER ROUNDS
Prints one JSON document with what it stored or received.
"""

import os
import sys

import django
import orjson

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from broker.core import groups, keys, log, membership, scheduling  # noqa: E402
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


def member(topic: str, group: str, member_id: str, rounds: int) -> list:
    """Join as a member, poll with auto-commit, leave; returns what it got."""
    membership.join_group(keys.CONSOLE, group, topic, member_id)
    got = []
    try:
        for _ in range(rounds):
            result = groups.poll_messages(
                keys.CONSOLE, group, topic, 5, auto_commit=True, member_id=member_id
            )
            got += [(m.partition, m.offset) for m in result.messages]
    finally:
        membership.leave_group(keys.CONSOLE, group, member_id)
    return got


def release(batch_size: int, rounds: int) -> list:
    """Run the scheduler's release rounds; returns how many each round released."""
    return [scheduling.release_due(batch_size) for _ in range(rounds)]


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "produce":
        out = produce(args[0], int(args[1]), int(args[2]), *(args[3:4]))
    elif command == "member":
        out = member(args[0], args[1], args[2], int(args[3]))
    elif command == "release":
        out = release(int(args[0]), int(args[1]))
    else:
        out = poll(args[0], args[1], int(args[2]))
    sys.stdout.write(orjson.dumps(out).decode())
