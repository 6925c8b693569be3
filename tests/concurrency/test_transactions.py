"""Commits are atomic under concurrency: a reader never sees part of a transaction, offsets
stay gapless while transactions and plain produces interleave, on SQLite and PostgreSQL."""

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator

import orjson
import pytest
from django.db import connections
from django.db.models import Min

from broker import models
from broker.core import delivery, keys, log, membership, transactions
from broker.core.records import NewMessage
from ferry_client import CheckBackServer
from tests.concurrency.test_offsets import assert_gapless, run_threads

pytestmark = pytest.mark.django_db(transaction=True)

WRITERS = 3
TRANSACTIONS = 8
SIZE = 6


def test_commit_transaction__readers_never_see_part_of_one(topic_factory):
    a = topic_factory(partitions=3).name
    b = topic_factory(partitions=2).name
    stop = threading.Event()
    partial: list[str] = []
    reads = [0]

    def reader():
        try:
            while not stop.is_set():
                # One statement over both topics: one snapshot on either database.
                rows = models.Message.objects.filter(partition__topic__name__in=[a, b])
                seen: Counter[tuple[int, int]] = Counter()
                for value in rows.values_list("value", flat=True):
                    decoded = orjson.loads(bytes(value))
                    if decoded[0] == "tx":
                        seen[(decoded[1], decoded[2])] += 1
                partial.extend(f"{k}: {n}" for k, n in seen.items() if n != SIZE)
                reads[0] += 1
        finally:
            connections.close_all()

    def writer(n):
        for t in range(TRANSACTIONS):
            tx = transactions.begin_transaction(keys.CONSOLE, f"w{n}", 60_000)
            half = SIZE // 2
            transactions.add_messages(
                keys.CONSOLE,
                tx.id,
                a,
                [NewMessage(orjson.dumps(["tx", n, t, i]), key=str(i)) for i in range(half)],
            )
            transactions.add_messages(
                keys.CONSOLE,
                tx.id,
                b,
                [NewMessage(orjson.dumps(["tx", n, t, i])) for i in range(half, SIZE)],
            )
            # A plain produce between: interleaves with the commits on the same partitions.
            log.append_messages(keys.CONSOLE, a, [NewMessage(orjson.dumps(["plain", n, t]))])
            transactions.commit_transaction(keys.CONSOLE, tx.id)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        run_threads(writer, WRITERS)
    finally:
        stop.set()
        thread.join(60)
    assert reads[0] > 0
    assert not partial, partial[:5]
    counts = assert_gapless(a)
    assert sum(counts.values()) == WRITERS * TRANSACTIONS * (SIZE // 2 + 1)
    assert sum(assert_gapless(b).values()) == WRITERS * TRANSACTIONS * (SIZE - SIZE // 2)
    # Each transaction's messages to one partition are in the order they were added.
    rows = models.Message.objects.filter(partition__topic__name=b).order_by("partition", "offset")
    last: dict[tuple[int, int, int], int] = {}
    for partition_id, value in rows.values_list("partition_id", "value"):
        _, n, t, i = orjson.loads(bytes(value))
        assert last.get((partition_id, n, t), -1) < i
        last[(partition_id, n, t)] = i
    assert not models.StagedMessage.objects.exists()


def test_commit_transaction__read_process_write_exactly_once(topic_factory):
    """Members of one group take deliveries, transform them and commit the output with the
    acks in one transaction: every input is transformed exactly once, whatever the interleaving
    of the members' commits (docs/transactions.md#exactly-once-read-process-write)."""
    src = topic_factory(partitions=3).name
    out = topic_factory(partitions=2).name
    log.append_messages(
        keys.CONSOLE, src, [NewMessage(orjson.dumps(i), partition=i % 3) for i in range(90)]
    )
    done: Counter[int] = Counter()

    def worker(n):
        member = f"m{n}"
        membership.join_group(keys.CONSOLE, "sum", src, member)
        try:
            for _ in range(200):
                got = delivery.deliver_messages(keys.CONSOLE, "sum", src, member, 7).deliveries
                if not got:
                    if sum(done.values()) >= 90:
                        return
                    continue
                tx = transactions.begin_transaction(keys.CONSOLE, f"rpw-{n}", 60_000)
                transactions.add_messages(
                    keys.CONSOLE,
                    tx.id,
                    out,
                    [NewMessage(orjson.dumps(orjson.loads(d.message.value) * 10)) for d in got],
                )
                transactions.add_acks(keys.CONSOLE, tx.id, "sum", [d.receipt for d in got])
                transactions.commit_transaction(keys.CONSOLE, tx.id)
                done[n] += len(got)
        finally:
            membership.leave_group(keys.CONSOLE, "sum", member)

    run_threads(worker, 3)
    values = [
        orjson.loads(bytes(v))
        for v in models.Message.objects.filter(partition__topic__name=out).values_list(
            "value", flat=True
        )
    ]
    assert sorted(values) == [i * 10 for i in range(90)]
    assert not models.InFlight.objects.exists()


@contextlib.contextmanager
def transactions_due(
    topic: str, count: int, pause_s: float
) -> Iterator[tuple[list[int], Counter[int]]]:
    """count open transactions of topic past their deadline; their check-back callback counts
    its calls and answers "unknown" after pause_s (a slow callback)."""
    asked: Counter[int] = Counter()
    lock = threading.Lock()

    def check(request):
        with lock:
            asked[request.transaction_id] += 1
        time.sleep(pause_s)
        return "unknown"

    with CheckBackServer(check) as server:
        ids = []
        for n in range(count):
            t = transactions.begin_transaction(keys.CONSOLE, f"c{n}", 60_000, server.url)
            transactions.add_messages(keys.CONSOLE, t.id, topic, [NewMessage(b"1")])
            ids.append(t.id)
        models.Transaction.objects.update(deadline_ms=log.now_ms() - 1)
        yield ids, asked


def test_run_checks__each_transaction_checked_by_one_runner(topic_factory):
    """Runners on several threads (or processes) never ask about one transaction twice."""
    # A slow callback: the other runners look meanwhile.
    with transactions_due(topic_factory().name, 6, 0.1) as (ids, asked):
        run_threads(lambda n: transactions.run_checks(), 3)
    assert dict(asked) == dict.fromkeys(ids, 1)
    assert all(transactions.get_transaction(keys.CONSOLE, i).checks == 1 for i in ids)


def test_run_checks__lease_expired_mid_round_each_transaction_asked_once(topic_factory, settings):
    """A round of slow callbacks outlasts its claim's lease and a second runner starts then:
    each transaction is still asked once and counted once (docs/transactions.md#check-back)."""
    settings.FERRY_TRANSACTION_CHECK_TIMEOUT_SECONDS = 1  # the claim's lease: 3 s
    settings.FERRY_TRANSACTION_CHECK_BACKOFF_MS = 60_000  # nothing is due twice in the round
    # 16 callbacks of 0.3 s, one after another: past the 3 s lease.
    with transactions_due(topic_factory().name, 16, 0.3) as (ids, asked):
        done = {}
        late: list[int] = []

        def runner(n):
            if n == 1:
                # Second runner: starts once the first one's claim lease has run out.
                deadline = time.monotonic() + 5
                while not asked and time.monotonic() < deadline:
                    time.sleep(0.01)
                # The claim's lease (of those the first runner has not reached yet).
                lease = models.Transaction.objects.filter(id__in=ids).aggregate(
                    until=Min("checking_until_ms")
                )["until"]
                while log.now_ms() <= lease + 100 and time.monotonic() < deadline:
                    time.sleep(0.02)
                late.append(sum(asked.values()))
            done[n] = transactions.run_checks()

        run_threads(runner, 2)
    # The second runner started while the first was still asking, and took part of its round.
    assert 0 < late[0] < len(ids)
    assert done[1].checked > 0
    assert dict(asked) == dict.fromkeys(ids, 1)
    assert [transactions.get_transaction(keys.CONSOLE, i).checks for i in ids] == [1] * len(ids)
