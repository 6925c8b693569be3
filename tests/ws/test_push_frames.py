"""How a push is cut into `messages` frames (BrokerConsumer._push, docs/websocket.md#limits):
one frame when it fits; else frames within FERRY_WS_MAX_FRAME_BYTES, in order; a message that
fits no frame gets `push_too_large` and the rest still go."""

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson

from broker import wire
from broker.consumers import BrokerConsumer
from broker.core.records import Delivery, StoredMessage


def _deliveries(count: int, headers_json: str = "{}") -> list[Delivery]:
    return [
        Delivery(
            StoredMessage(
                0,
                n,
                1_700_000_000_000 + n,
                f"k{n}",
                None,
                headers_json,
                orjson.dumps({"n": n, "pad": "x" * 200}),
                True,
                None,
            ),
            f"{'0' * 16}.1.{n:x}",
            1,
            1_700_000_030_000,
        )
        for n in range(count)
    ]


def _pushed(deliveries: list[Delivery]) -> list[bytes]:
    """The frames _push sends for deliveries, to subscription "s"."""
    consumer: Any = BrokerConsumer()
    sent: list[bytes] = []

    async def send_raw(data: bytes) -> None:
        sent.append(data)

    consumer._send_raw = send_raw
    asyncio.run(consumer._push(SimpleNamespace(sub="s"), deliveries))
    return sent


def _frame(deliveries: list[Delivery]) -> bytes:
    """The one `messages` frame that holds deliveries, as docs/websocket.md shows it."""
    return orjson.dumps({"type": "messages", "sub": "s", "items": wire.deliveries_out(deliveries)})


def test_push__a_push_that_fits_is_one_frame():
    deliveries = _deliveries(100)
    assert _pushed(deliveries) == [_frame(deliveries)]


def test_push__a_push_over_the_limit_is_cut_into_frames_within_it_in_order(settings):
    deliveries = _deliveries(100)
    settings.FERRY_WS_MAX_FRAME_BYTES = limit = 4096
    frames = _pushed(deliveries)
    assert len(frames) > 1
    assert all(len(f) <= limit for f in frames)
    items = [item for f in frames for item in orjson.loads(f)["items"]]
    assert items == orjson.loads(_frame(deliveries))["items"]


def test_push__a_message_that_fits_no_frame_gets_an_error_and_the_rest_go(settings):
    settings.FERRY_WS_MAX_FRAME_BYTES = 4096
    deliveries = _deliveries(3)
    # Headers that JSON-escape to many times their size: \u0001 is six bytes for one.
    huge = _deliveries(10, orjson.dumps({"h": "\u0001" * 1000}).decode())[9]
    frames = [orjson.loads(f) for f in _pushed([deliveries[0], huge, *deliveries[1:]])]
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["error"]["code"] for e in errors] == ["push_too_large"]
    assert errors[0]["error"]["detail"]["receipt"] == huge.receipt
    pushed = [item["offset"] for f in frames if f["type"] == "messages" for item in f["items"]]
    assert pushed == [0, 1, 2]
