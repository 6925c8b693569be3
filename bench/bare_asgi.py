"""The reference for bench/per_message.py: the least an ASGI app can do under the same Daphne.

HTTP: it reads the request body and answers a fixed produce-shaped JSON, so the round trip and
the server CPU it costs are the transport's share of a Ferry request (no Django, no database).

WebSocket: it plays Ferry's side of the prefetch-2 loop with nothing behind it. A `subscribe`
frame gets `subscribed` and two one-message `messages` frames; each `ack` frame gets `acked`
and one more one-message `messages` frame, shaped as Ferry's (docs/websocket.md). What that
costs the server is the transport's share of a consumed message (no Channels, no database).
"""

import time
from typing import Any

import orjson

BODY = b'{"results":[{"partition":0,"offset":0,"duplicate":false}]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await prefetch_two(receive, send)
        return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


def _messages(sub: str, offset: int) -> str:
    now = int(time.time() * 1000)
    item: dict[str, Any] = {
        "partition": 0,
        "offset": offset,
        "timestamp_ms": now,
        "key": None,
        "tag": None,
        "headers": {},
        "id": None,
        "value": offset,
        "receipt": f"{offset:016x}.1.{offset:x}",
        "attempt": 1,
        "deadline_ms": now + 30_000,
    }
    return orjson.dumps({"type": "messages", "sub": sub, "items": [item]}).decode()


async def prefetch_two(receive: Any, send: Any) -> None:
    offset = 0
    while True:
        event = await receive()
        if event["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
            continue
        if event["type"] != "websocket.receive":
            return  # websocket.disconnect
        frame = orjson.loads(event.get("text") or event.get("bytes") or b"{}")
        sub = frame.get("sub", "s")
        if frame.get("type") == "subscribe":
            answers = [orjson.dumps({"type": "subscribed", "ref": frame.get("ref"), "sub": sub})]
            pushes = 2
        elif frame.get("type") == "ack":
            settled = len(frame.get("receipts", ()))
            answers = [
                orjson.dumps(
                    {
                        "type": "acked",
                        "ref": frame.get("ref"),
                        "sub": sub,
                        "settled": settled,
                        "stale": [],
                        "dead_lettered": 0,
                    }
                )
            ]
            pushes = 1
        else:
            continue
        for answer in answers:
            await send({"type": "websocket.send", "text": answer.decode()})
        for _ in range(pushes):
            await send({"type": "websocket.send", "text": _messages(sub, offset)})
            offset += 1
