"""The reference for bench/per_message.py: the least an ASGI app can do under the same Daphne.

It reads the request body and answers a fixed produce-shaped JSON, so the round trip and the
server CPU it costs are the transport's share of a Ferry request (no Django, no database).
"""

from typing import Any

BODY = b'{"results":[{"partition":0,"offset":0,"duplicate":false}]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
