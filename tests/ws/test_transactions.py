"""Transaction frames on /ws/v1/: begin, add, commit, rollback (docs/websocket.md#transactions)."""

import pytest

from broker.core import keys, log
from tests.ws.test_consumers import make_key, new_topic, recv_type, send, session, sync

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
