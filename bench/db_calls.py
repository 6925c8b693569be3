"""The database calls of the per-message path, alone: CPU per call, in this process.

Not part of the test suite (STYLE.md §6). Without a server or a socket (an event loop in a
thread of its own stands in for the server's, to take the wake-ups commits send), the figures
are steady to a few percent from run to run, where bench/per_message.py's swing by a tenth:
this is how a change to the core's statements is measured (docs/benchmarks.md). On the
embedded default, or on PostgreSQL under scripts/with-postgres.

1. ack and push: `delivery.ack_and_deliver` of one message that delivers the next, as the
   prefetch-2 WebSocket loop calls it (messages produced beforehand);
2. deliver, then ack: `deliver_messages` of one message, then `ack_messages` of it;
3. end to end, acked alone: a one-message group commit (`groupcommit.append_batches`, with its
   flush), the delivery of that message, its ack: what an end-to-end subscriber costs with
   FERRY_WS_ACK_HOLD_MS=0;
4. end to end, ack held: the group commit, then one `ack_and_deliver` that settles the last
   message and delivers the new one: what it costs with the ack held for the next push;
5. group commits of 1, 2 and 8 produce requests of 100 keyed 256-byte messages on a
   4-partition topic: CPU per commit and per message, the fixed cost of a commit against its
   cost per message (issue 18: spread over more processes, each commit groups fewer
   requests);
6. a failed batch: `nack_messages` of 100 delivered together (retry at once), then their
   redelivery (`deliver_messages` of 100) and `ack_messages`, as a consumer that fails a batch
   once meets them;
7. a dead subscriber's batch: `redeliver_expired` (the deadline sweep) of the 400 it held,
   then their redelivery and ack 100 at a time, as the member that takes over meets them;
8. a batch consumer's ack and push: `ack_and_deliver` of B receipts that delivers the next B
   (prefetch 2*B, an ack per B, keyed 256-byte messages: bench/postgres.py's consume), at B=10
   and B=100. From the two, what a call costs whatever its size and what each message adds
   (issue 18: which of the two a change to the B=100 consume has to cut).

    .venv/bin/python bench/db_calls.py [--calls 3000]
"""

import argparse
import asyncio
import functools
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from produce_fetch import progress, setup_django  # noqa: E402


def cpu_us(timings: dict[str, float], name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) as a database thread of the server runs it, its CPU added to timings[name]
    (process-wide: the event loop's share of a wake-up the call sends counts too)."""
    from broker.core import dbthreads

    started = time.process_time()
    # dbthreads._call: what a server's database thread runs, with the event loop that sent the
    # call noted, so a commit's wake-up is handed to that loop as in the server (without one,
    # events._send would start a thread and a loop of its own for each, through async_to_sync).
    result = dbthreads._call(_serving_loop(), fn, *args)
    timings[name] = timings.get(name, 0.0) + time.process_time() - started
    return result


@functools.cache
def _serving_loop() -> asyncio.AbstractEventLoop:
    """An event loop running in a thread of its own, standing in for the server's."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="serving-loop", daemon=True).start()
    return loop


# A 256-byte JSON value, as bench/postgres.py's messages.
VALUE_256 = b'"' + b"x" * 254 + b'"'


def joined_topic(name: str, messages: int, value: bytes = b'"x"', keyed: bool = False) -> str:
    """A 1-partition topic holding at least messages (appended 1,000 at a time; keyed k<n> if
    keyed), and member "m" of a group of the same name."""
    from broker.core import keys, membership, topics
    from broker.core.log import append_messages
    from broker.core.records import NewMessage

    topic = f"bench-calls-{name}-{os.getpid()}-{time.time_ns()}"
    topics.create_topic(keys.CONSOLE, topic, 1)
    for start in range(0, messages, 1000):
        batch = [
            NewMessage(value=value, key=f"k{start + i}" if keyed else None) for i in range(1000)
        ]
        append_messages(keys.CONSOLE, topic, batch)
    membership.join_group(keys.CONSOLE, topic, topic, "m")
    return topic


def ack_and_push(
    timings: dict[str, float], name: str, topic: str, receipts: list[str], credit: int, most: int
) -> Any:
    """Member "m"'s ack and push (its group is named as the topic), as a WebSocket subscriber's:
    at most `most` messages pushed; its CPU added to timings[name]."""
    from broker.core import delivery, keys

    return cpu_us(
        timings,
        name,
        delivery.ack_and_deliver,
        keys.CONSOLE,
        topic,
        receipts,
        topic,
        "m",
        credit,
        most,
    )


def run(calls: int) -> list[tuple[str, dict[str, float]]]:
    from broker.core import delivery, groupcommit, keys
    from broker.core.records import NewMessage

    console = keys.CONSOLE
    results = []

    progress(f"ack and push: {calls} calls")
    topic = joined_topic("loop", calls + 10)
    held = list(delivery.deliver_messages(console, topic, topic, "m", 2).deliveries)
    timings: dict[str, float] = {}
    for _ in range(calls):
        both = ack_and_push(timings, "ack_and_deliver", topic, [held.pop(0).receipt], 0, 100)
        held += both.delivered.deliveries
    results.append(("ack and push (prefetch 2)", timings))

    progress(f"deliver, then ack: {calls} each")
    topic = joined_topic("pair", calls + 10)
    timings = {}
    for _ in range(calls):
        got = cpu_us(
            timings, "deliver_messages", delivery.deliver_messages, console, topic, topic, "m", 1
        ).deliveries
        cpu_us(timings, "ack_messages", delivery.ack_messages, console, topic, [got[0].receipt])
    results.append(("deliver, then ack", timings))

    for held_ack in (False, True):
        label = "end to end, ack held" if held_ack else "end to end, acked alone"
        progress(f"{label}: {calls} messages")
        topic = joined_topic(f"e2e-{int(held_ack)}", 0)
        one = [(console, topic, [NewMessage(value=b"1")])]
        groupcommit.append_batches(one)
        last = list(delivery.deliver_messages(console, topic, topic, "m", 64).deliveries)
        timings = {}
        for _ in range(calls):
            cpu_us(timings, "group commit", groupcommit.append_batches, one)
            receipts = [d.receipt for d in last]
            if held_ack:
                both = ack_and_push(timings, "ack_and_deliver", topic, receipts, 63, 100)
                last = list(both.delivered.deliveries)
            else:
                last = list(
                    cpu_us(
                        timings,
                        "deliver_messages",
                        delivery.deliver_messages,
                        console,
                        topic,
                        topic,
                        "m",
                        64,
                    ).deliveries
                )
                receipts = [d.receipt for d in last]
                cpu_us(timings, "ack_messages", delivery.ack_messages, console, topic, receipts)
        results.append((label, timings))
    return results


def group_commits(calls: int) -> list[tuple[int, float]]:
    """(requests per commit, µs of CPU per commit) for commits of 1, 2 and 8 requests of 100."""
    from broker.core import groupcommit, keys, topics
    from broker.core.records import NewMessage

    topic = f"bench-calls-commits-{os.getpid()}-{time.time_ns()}"
    topics.create_topic(keys.CONSOLE, topic, 4)
    out = []
    for requests in (1, 2, 8):
        progress(f"group commits of {requests} request(s) of 100: {calls}")
        batches = [
            (
                keys.CONSOLE,
                topic,
                [NewMessage(value=VALUE_256, key=f"k{r}-{i}") for i in range(100)],
            )
            for r in range(requests)
        ]
        timings: dict[str, float] = {}
        for _ in range(calls):
            cpu_us(timings, "commit", groupcommit.append_batches, batches)
        out.append((requests, timings["commit"] / calls * 1e6))
    return out


def retries(rounds: int) -> list[tuple[str, dict[str, float]]]:
    """Parts 6 and 7: CPU per round of the retry paths, by call."""
    from broker import models
    from broker.core import delivery, groups, keys

    console = keys.CONSOLE
    out = []
    for label, held in (("a failed batch of 100", 100), ("a dead subscriber's 400", 400)):
        progress(f"{label}: {rounds} rounds")
        topic = joined_topic(f"retries-{held}", held * rounds, VALUE_256)
        groups.configure_group(console, topic, retry_delays_ms=[0])
        timings: dict[str, float] = {}
        for _ in range(rounds):
            got = delivery.deliver_messages(console, topic, topic, "m", held).deliveries
            receipts = [d.receipt for d in got]
            if held == 100:
                cpu_us(timings, "nack", delivery.nack_messages, console, topic, receipts)
            else:
                # Their deadline passed: the sweep finds them as it would a minute later.
                models.InFlight.objects.filter(token=got[0].receipt.split(".")[0]).update(
                    deadline_ms=1
                )
                cpu_us(timings, "sweep", delivery.redeliver_expired)
            for _ in range(held // 100):
                again = cpu_us(
                    timings,
                    "redeliver",
                    delivery.deliver_messages,
                    console,
                    topic,
                    topic,
                    "m",
                    100,
                ).deliveries
                if len(again) != 100 or again[0].attempt != 2:
                    raise SystemExit(f"{label}: not redelivered as second attempts")
                receipts = [d.receipt for d in again]
                cpu_us(timings, "ack", delivery.ack_messages, console, topic, receipts)
        out.append((label, {name: t / rounds for name, t in timings.items()}))
    return out


def batch_acks(calls: int) -> list[tuple[int, float]]:
    """Part 8: (B, µs of CPU per ack_and_deliver call) for B=10 and B=100, their calls taken in
    turns (this machine's speed drifts within a minute: the two sizes see the same drift)."""
    from broker.core import delivery, keys

    console = keys.CONSOLE
    sizes = (10, 100)
    progress(f"ack and push, prefetch 2*B, an ack per B, B in {sizes}: {calls} calls each")
    held: dict[int, tuple[str, list[Any]]] = {}
    for batch in sizes:
        topic = joined_topic(f"batch-{batch}", (calls + 2) * batch, VALUE_256, keyed=True)
        first = delivery.deliver_messages(console, topic, topic, "m", 2 * batch).deliveries
        held[batch] = (topic, list(first))
    timings: dict[str, float] = {}
    for _ in range(calls):
        for batch in sizes:
            topic, hand = held[batch]
            receipts = [d.receipt for d in hand[:batch]]
            del hand[:batch]
            both = ack_and_push(timings, f"B={batch}", topic, receipts, 0, batch)
            got = both.delivered.deliveries if both.delivered is not None else ()
            if both.acked.settled != batch or len(got) != batch:
                raise SystemExit(f"B={batch}: acked {both.acked.settled}, delivered {len(got)}")
            hand += got
    return [(batch, timings[f"B={batch}"] / calls * 1e6) for batch in sizes]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per part (default 3000)")
    args = parser.parse_args()
    setup_django(Path(tempfile.mkdtemp(prefix="ferry-bench-")))
    from django.db import connection

    # The retries first: the sweep would also find the other parts' deliveries left in flight
    # once their deadlines passed.
    retried = retries(max(10, args.calls // 100))
    results = run(args.calls)
    batches = batch_acks(max(20, args.calls // 3))
    print(f"\n== Database calls of the per-message path ({connection.vendor}) ==")
    print(f"command: .venv/bin/python bench/db_calls.py --calls {args.calls}")
    for label, timings in results:
        parts = ", ".join(f"{name} {t / args.calls * 1e6:.0f}" for name, t in timings.items())
        total = sum(timings.values()) / args.calls * 1e6
        print(f"{label:<28} {total:6.0f} µs CPU per message ({parts})")
    for requests, per_commit in group_commits(max(20, args.calls // 20)):
        print(
            f"group commit of {requests} x 100    {per_commit:6.0f} µs CPU per commit, "
            f"{per_commit / (100 * requests):.1f} per message"
        )
    for label, per_round in retried:
        parts = ", ".join(f"{name} {t * 1e3:.1f}" for name, t in per_round.items())
        print(f"{label:<28} {sum(per_round.values()) * 1e3:6.1f} ms CPU per round ({parts})")
    for batch, per_call in batches:
        print(
            f"ack and push, B={batch:<4}        {per_call:6.0f} µs CPU per call, "
            f"{per_call / batch:.1f} per message"
        )
    (small, small_us), (large, large_us) = batches
    per_message = (large_us - small_us) / (large - small)
    print(
        f"  so {small_us - per_message * small:.0f} µs a call whatever its size, "
        f"and {per_message:.1f} µs a message"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
