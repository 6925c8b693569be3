"""The consumer's pool and settlements against a fake settler: no broker needed."""

import asyncio
import concurrent.futures
import time

import pytest

from ferry_client import Delivery, Reject
from ferry_client.workers import Outcome, Pool, Settlements, is_async, outcome_of


def delivery(offset, partition=0):
    return Delivery(
        topic="t",
        partition=partition,
        offset=offset,
        timestamp_ms=0,
        key=None,
        tag=None,
        headers={},
        id=None,
        value=offset,
        receipt=f"r{partition}-{offset}",
        attempt=1,
        deadline_ms=None,
    )


class FakeSettler:
    def __init__(self):
        self.calls = []

    async def settle(self, action, receipts, error):
        self.calls.append((action, sorted(receipts), error))


def settlements(batch_size=100, interval_s=0.01):
    settler = FakeSettler()
    return settler, Settlements(settler, batch_size, interval_s)


async def finish(pool, total):
    async with asyncio.timeout(5):
        while pool.pending:
            await pool.changed()
    assert pool.pending == 0
    assert total


def test_outcome_of__success_error_reject():
    assert outcome_of(None) == Outcome("ack")
    assert outcome_of(ValueError("db down")) == Outcome("nack", "db down")
    assert outcome_of(KeyError()) == Outcome("nack", "KeyError")
    assert outcome_of(Reject("bad input")) == Outcome("reject", "bad input")


def test_is_async__functions_and_callables():
    class Callable:
        async def __call__(self, delivery):
            pass

    async def handler(delivery):
        pass

    assert is_async(handler)
    assert is_async(Callable())
    assert not is_async(print)


async def test_settlements__acks_batch_failures_group_by_error():
    settler, batch = settlements(batch_size=100, interval_s=0.05)
    flusher = asyncio.create_task(batch.run())
    batch.add("a", Outcome("ack"))
    batch.add("b", Outcome("ack"))
    batch.add("c", Outcome("nack", "boom"))
    batch.add("d", Outcome("nack", "boom"))
    batch.add("e", Outcome("reject", "bad"))
    async with asyncio.timeout(5):
        while len(settler.calls) < 3:
            await asyncio.sleep(0.005)
    batch.close()
    await asyncio.gather(flusher, return_exceptions=True)
    assert settler.calls == [
        ("ack", ["a", "b"], ""),
        ("nack", ["c", "d"], "boom"),
        ("reject", ["e"], "bad"),
    ]


async def test_settlements__a_lone_ack_waits_the_interval_a_full_batch_does_not():
    settler, batch = settlements(batch_size=2, interval_s=0.2)
    flusher = asyncio.create_task(batch.run())
    batch.add("a", Outcome("ack"))
    await asyncio.sleep(0.05)
    assert settler.calls == []
    batch.add("b", Outcome("ack"))
    await asyncio.sleep(0.05)
    assert settler.calls == [("ack", ["a", "b"], "")]
    batch.close()
    batch.add("c", Outcome("ack"))  # dropped: the session is over
    await batch.flush()
    assert len(settler.calls) == 1
    await asyncio.gather(flusher, return_exceptions=True)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_pool__settles_each_outcome(kind):
    def handle(d):
        if d.offset == 1:
            raise RuntimeError("no")
        if d.offset == 2:
            raise Reject("never")

    async def handle_async(d):
        handle(d)

    settler, batch = settlements()
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        pool = Pool(handle if kind == "sync" else handle_async, 2, ordered=False, executor=executor)
        pool.start()
        for offset in range(3):
            pool.submit(delivery(offset), batch)
        await finish(pool, 3)
        await batch.flush()
        await pool.close()
    assert sorted(settler.calls) == [
        ("ack", ["r0-0"], ""),
        ("nack", ["r0-1"], "no"),
        ("reject", ["r0-2"], "never"),
    ]


async def test_pool__concurrency_runs_that_many_at_once():
    running = most = 0

    async def handler(d):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    _, batch = settlements()
    pool = Pool(handler, 3, ordered=False, executor=None)
    pool.start()
    for offset in range(9):
        pool.submit(delivery(offset), batch)
    await finish(pool, 9)
    await pool.close()
    assert most == 3


async def test_pool__ordered_one_at_a_time_per_partition_in_order():
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    busy = set()
    overlap = []

    def handler(d):
        # A sync handler on threads: a partition must never run twice at once.
        if d.partition in busy:
            overlap.append(d)
        busy.add(d.partition)
        time.sleep(0.002)
        seen[d.partition].append(d.offset)
        busy.discard(d.partition)

    _, batch = settlements()
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        pool = Pool(handler, 2, ordered=True, executor=executor)
        pool.start()
        for offset in range(10):
            for partition in (0, 1, 2):
                pool.submit(delivery(offset, partition), batch)
        await finish(pool, 30)
        await pool.close()
    assert seen == {p: list(range(10)) for p in (0, 1, 2)}
    assert overlap == []


async def test_pool__drain_finishes_running_and_drops_waiting():
    started = []
    release = asyncio.Event()

    async def handler(d):
        started.append(d.offset)
        await release.wait()

    settler, batch = settlements()
    pool = Pool(handler, 1, ordered=False, executor=None)
    pool.start()
    for offset in range(3):
        pool.submit(delivery(offset), batch)
    await asyncio.sleep(0.01)
    drained = asyncio.create_task(pool.drain())
    await asyncio.sleep(0.01)
    assert not drained.done()
    release.set()
    await drained
    await finish(pool, 3)
    await batch.flush()
    await pool.close()
    assert started == [0]
    assert settler.calls == [("ack", ["r0-0"], "")]


async def test_pool__skips_deliveries_of_a_closed_session():
    handled: list[Delivery] = []
    _, old = settlements()
    _, new = settlements()
    pool = Pool(handled.append, 1, ordered=False, executor=None)
    # Not started yet: both wait in the queue when the old session ends.
    pool.submit(delivery(0), old)
    pool.submit(delivery(1), new)
    old.close()
    pool.start()
    await finish(pool, 2)
    await pool.close()
    assert [d.offset for d in handled] == [1]
