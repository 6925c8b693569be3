"""Transactions through ferry_client against a real Daphne: the with block, check-back."""

import asyncio

import pytest

from broker import models
from broker.core import log, transactions
from ferry_client import AsyncProducer, CheckBackServer, FerryError, Producer, Reader

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class Boom(Exception):
    pass


def failing(txn, topic):
    with txn:
        txn.send(topic, 1)
        raise Boom


def values(broker_url, secret, topic):
    with Reader(broker_url, secret) as reader:
        return [m["value"] for m in reader.fetch(topic, 0).messages]


def test_transaction__commits_at_the_end_of_the_block(broker_url, secret, topic_factory):
    a, b = topic_factory().name, topic_factory().name
    with Producer(broker_url, secret) as producer:
        with producer.transaction("svc-1") as txn:
            txn.send(a, {"n": 1}, key="k")
            txn.send_batch(b, [2, 3])
            assert values(broker_url, secret, a) == []
        assert [(r.topic, r.offset) for r in txn.results] == [(a, 0), (b, 0), (b, 1)]
    assert values(broker_url, secret, a) == [{"n": 1}]
    assert values(broker_url, secret, b) == [2, 3]


def test_transaction__an_exception_rolls_back(broker_url, secret, topic_factory):
    a = topic_factory().name
    with Producer(broker_url, secret) as producer:
        txn = producer.transaction("svc-1")
        with pytest.raises(Boom):
            failing(txn, a)
        assert txn.info is not None
        assert txn.info.state == "rolled_back"
    assert values(broker_url, secret, a) == []


def test_transaction__fenced_by_a_newer_one(broker_url, secret, topic_factory):
    a = topic_factory().name
    with Producer(broker_url, secret) as producer:
        zombie = producer.transaction("svc-1")
        zombie.send(a, "old")
        with producer.transaction("svc-1") as txn:
            txn.send(a, "new")
        with pytest.raises(FerryError) as refused:
            zombie.commit()
    assert (refused.value.code, refused.value.status) == ("fenced", 409)
    assert values(broker_url, secret, a) == ["new"]


def test_local_transactions__check_back_decides_after_a_crash(broker_url, secret, topic_factory):
    a = topic_factory().name
    committed_locally: set[int] = set()

    def check(request):
        return "commit" if request.transaction_id in committed_locally else "rollback"

    with CheckBackServer(check) as server, Producer(broker_url, secret) as producer:
        local = producer.local_transactions("orders-svc", server.url)
        local.run(a, ["paid"], committed_locally.add)
        assert values(broker_url, secret, a) == ["paid"]
        # A local transaction that committed, then the process died before the broker heard.
        crashed = producer.transaction("orders-svc-2", check_url=server.url)
        crashed.send(a, "recovered")
        committed_locally.add(crashed.id)
        # One that never committed locally.
        lost = producer.transaction("orders-svc-3", check_url=server.url)
        lost.send(a, "lost")
        models.Transaction.objects.filter(id__in=[crashed.id, lost.id]).update(
            deadline_ms=log.now_ms() - 1
        )
        done = transactions.run_checks()
    assert (done.committed, done.rolled_back) == (1, 1)
    assert values(broker_url, secret, a) == ["paid", "recovered"]


def test_async_transaction__commit_and_rollback(broker_url, secret, topic_factory):
    a = topic_factory().name

    async def main():
        async with AsyncProducer(broker_url, secret) as producer:
            async with producer.transaction("async-1") as txn:
                await txn.send(a, 1)
                await txn.send_batch(a, [2, 3])
            doomed = producer.transaction("async-1")
            with pytest.raises(Boom):
                await failing_async(doomed, a)
            return txn, doomed

    txn, doomed = asyncio.run(main())
    assert [r.offset for r in txn.results] == [0, 1, 2]
    assert doomed.info is not None
    assert doomed.info.state == "rolled_back"
    assert values(broker_url, secret, a) == [1, 2, 3]


async def failing_async(txn, topic):
    async with txn:
        await txn.send(topic, "lost")
        raise Boom
