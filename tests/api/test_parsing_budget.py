"""The budget of request bodies being parsed at once (broker/middleware.py, docs/api.md#limits)."""

import asyncio

import orjson
from django.test import override_settings

from broker import middleware


def request(size: int | None, method: str = "POST") -> dict:
    headers = [] if size is None else [(b"content-length", str(size).encode())]
    return {"type": "http", "method": method, "path": "/api/v1/x", "headers": headers}


class Recorder:
    def __init__(self):
        self.messages: list[dict] = []

    async def __call__(self, message):
        self.messages.append(message)

    @property
    def status(self):
        return self.messages[0]["status"] if self.messages else None


@override_settings(FERRY_MAX_PARSING_BYTES=1000, DATA_UPLOAD_MAX_MEMORY_SIZE=600)
async def test_parsing_budget__over_it_is_503_busy_with_retry_after():
    held = asyncio.Event()
    entered = []

    async def app(scope, receive, send):
        entered.append(scope)
        await held.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    budgeted = middleware.parsing_budget(app)
    first = asyncio.create_task(budgeted(request(800), None, Recorder()))
    await asyncio.sleep(0)
    refused = Recorder()
    await budgeted(request(300), None, refused)
    assert refused.status == 503
    headers = dict(refused.messages[0]["headers"])
    assert headers[b"retry-after"] == b"1"
    body = orjson.loads(refused.messages[1]["body"])
    assert body["error"]["code"] == "busy"
    assert body["error"]["detail"] == {"retry_after": 1, "max_parsing_bytes": 1000}
    # Without Content-Length a body counts as the largest allowed (600): over too.
    chunked = Recorder()
    await budgeted(request(None), None, chunked)
    assert chunked.status == 503
    # Bodiless requests and ones that fit go through.
    small = asyncio.create_task(budgeted(request(200), None, Recorder()))
    get = asyncio.create_task(budgeted(request(None, "GET"), None, Recorder()))
    await asyncio.sleep(0)
    assert len(entered) == 3
    held.set()
    await asyncio.gather(first, small, get)
    assert middleware._parsing_bytes == 0
    # Alone, a request larger than the budget is let in.
    alone = Recorder()
    await budgeted(request(5000), None, alone)
    assert alone.status == 200


class Cyclic:
    """A big body held in a reference cycle, as a request's objects are."""

    def __init__(self, size: int) -> None:
        self.body = bytes(size)
        self.me = self


async def test_parsing_budget__big_request_garbage_collected_at_once():
    import gc
    import weakref

    left: list[weakref.ref] = []

    async def app(scope, receive, send):
        left.append(weakref.ref(Cyclic(1024)))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    budgeted = middleware.parsing_budget(app)
    gc.disable()
    try:
        await budgeted(request(middleware.COLLECT_AFTER_BYTES - 1), None, Recorder())
        # A small request leaves its cycles to the collector's own schedule...
        assert left[0]() is not None
        await budgeted(request(middleware.COLLECT_AFTER_BYTES), None, Recorder())
        # ...a big one's are collected as soon as it is answered.
        assert left[0]() is None
        assert left[1]() is None
    finally:
        gc.enable()
