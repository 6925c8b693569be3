"""Transaction frames on /ws/v1/: begin, add, commit, rollback (docs/websocket.md#transactions)."""

import asyncio

import pytest
from channels.db import database_sync_to_async

from broker.core import groups, keys, log, transactions
from broker.core.records import NewMessage
from tests.ws.test_consumers import make_key, new_topic, recv_type, send, session


async def sync(fn, *args):
    """Run fn on the database thread, closing its connection after (as consumers do)."""
    return await database_sync_to_async(fn)(*args)


pytestmark = pytest.mark.django_db(transaction=True)


async def stored(topic):
    result = await sync(log.read_messages, keys.CONSOLE, topic, 0, None, 100)
    return [m.value for m in result.messages]


async def test_transaction_frames__begin_add_commit():
    await new_topic("ledger")
    secret = await make_key("produce:ledger")
    async with session(secret) as ws:
        await send(ws, {"type": "begin", "ref": 1, "producer_id": "ws-1", "timeout_ms": 60000})
        begun = await recv_type(ws, "begun")
        tx = begun["transaction"]["id"]
        assert (begun["ref"], begun["transaction"]["epoch"]) == (1, 1)
        await send(
            ws,
            {
                "type": "add",
                "ref": 2,
                "transaction": tx,
                "topic": "ledger",
                "messages": [{"value": 1}, {"value": 2}],
            },
        )
        assert (await recv_type(ws, "added"))["transaction"]["messages"] == 2
        assert await stored("ledger") == []
        await send(ws, {"type": "commit", "ref": 3, "transaction": tx})
        committed = await recv_type(ws, "committed")
        assert committed["transaction"]["state"] == "committed"
        assert [r["offset"] for r in committed["results"]] == [0, 1]
    assert await stored("ledger") == [b"1", b"2"]


async def test_transaction_frames__rollback_and_errors():
    await new_topic("ledger")
    secret = await make_key("produce:ledger")
    async with session(secret) as ws:
        await send(ws, {"type": "begin", "producer_id": "ws-1", "timeout_ms": 60000})
        old = (await recv_type(ws, "begun"))["transaction"]["id"]
        await send(ws, {"type": "begin", "producer_id": "ws-1", "timeout_ms": 60000})
        new = (await recv_type(ws, "begun"))["transaction"]["id"]
        await send(ws, {"type": "commit", "ref": "c", "transaction": old})
        error = await recv_type(ws, "error")
        assert (error["ref"], error["error"]["code"]) == ("c", "fenced")
        await send(
            ws, {"type": "add", "transaction": new, "topic": "ledger", "messages": [{"value": 1}]}
        )
        await recv_type(ws, "added")
        await send(ws, {"type": "rollback", "transaction": new})
        assert (await recv_type(ws, "rolled_back"))["transaction"]["reason"] == "producer"
        await send(ws, {"type": "commit", "transaction": new})
        assert (await recv_type(ws, "error"))["error"]["code"] == "transaction_not_open"
        await send(ws, {"type": "add", "transaction": 1, "topic": "ledger", "messages": []})
        assert (await recv_type(ws, "error"))["error"]["code"] == "invalid_frame"
    assert await stored("ledger") == []


async def commit_fifty(topic):
    def work():
        t = transactions.begin_transaction(keys.CONSOLE, "p", 60_000)
        transactions.add_messages(
            keys.CONSOLE, t.id, topic, [NewMessage(str(i).encode()) for i in range(50)]
        )
        return transactions.commit_transaction(keys.CONSOLE, t.id)

    return await sync(work)


async def test_subscriber__gets_a_committed_transaction_whole():
    await new_topic("whole")
    secret = await make_key("admin:*")
    async with session(secret) as ws:
        await send(ws, {"type": "subscribe", "sub": "s", "topic": "whole", "group": "g"})
        await recv_type(ws, "subscribed")
        await asyncio.sleep(0.1)  # the subscriber waits for a wake-up
        await commit_fifty("whole")
        frame = await recv_type(ws, "messages")
        assert [m["value"] for m in frame["items"]] == list(range(50))


async def test_long_poll__wakes_on_commit_with_the_whole_transaction():
    await new_topic("polled")
    waiting = asyncio.create_task(
        groups.poll_messages_async(keys.CONSOLE, "g", "polled", 100, True, 5000)
    )
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await commit_fifty("polled")
    result = await asyncio.wait_for(waiting, 5)
    assert [m.offset for m in result.messages] == list(range(50))
    await sync(lambda: None)  # the poll's thread hop left a connection open: close it


async def test_call_async__concurrent_commits_share_and_stay_whole():
    await new_topic("shared", partitions=2)

    async def one(n):
        info = await transactions.call_async(
            transactions.begin_transaction,
            keys.CONSOLE,
            f"shared-{n}",
            60_000,
            None,
            "shared",
            [NewMessage(f"[{n}, {i}]".encode(), key=str(i)) for i in range(5)],
        )
        return await transactions.call_async(transactions.commit_transaction, keys.CONSOLE, info.id)

    results = await asyncio.gather(*(one(n) for n in range(12)))
    assert all(r.transaction.state == "committed" for r in results)
    offsets = sorted((r.partition, r.offset) for result in results for _, r in result.results)
    assert len(set(offsets)) == 60
    for partition in (0, 1):
        mine = [o for p, o in offsets if p == partition]
        assert mine == list(range(len(mine)))
    await sync(lambda: None)


async def test_begin_frame__with_the_first_messages():
    await new_topic("first")
    secret = await make_key("produce:first")
    async with session(secret) as ws:
        await send(
            ws,
            {
                "type": "begin",
                "producer_id": "w",
                "timeout_ms": 60000,
                "topic": "first",
                "messages": [{"value": 1}],
            },
        )
        begun = await recv_type(ws, "begun")
        assert begun["transaction"]["messages"] == 1
        await send(ws, {"type": "commit", "transaction": begun["transaction"]["id"]})
        await recv_type(ws, "committed")
        await send(
            ws,
            {
                "type": "begin",
                "ref": 9,
                "producer_id": "w",
                "timeout_ms": 60000,
                "topic": "first",
                "messages": [{"value": 1, "value_b64": "AA=="}],
            },
        )
        error = await recv_type(ws, "error")
        assert (error["ref"], error["error"]["code"]) == (9, "invalid_frame")
    assert await stored("first") == [b"1"]
