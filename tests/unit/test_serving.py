"""How Ferry is served: every way gives Daphne FERRY_WS_MAX_FRAME_BYTES (docs/websocket.md#limits),
keys stay out of the access log, autobahn styles no log line per frame and unmasks a client's
frame with the websockets library's function, and Django's connection lookups raise nothing
(mqsite/serving.py)."""

import itertools
import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("--websocket-max-message-size", "--websocket-max-frame-size")


def daphne_commands(text: str) -> list[str]:
    """Each daphne command line, with its backslash continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if re.search(r"bin/daphne\b", line)]


def test_scripts_run__passes_the_frame_limit_to_daphne():
    (command,) = daphne_commands((ROOT / "scripts" / "run").read_text())
    for flag in FLAGS:
        assert f'{flag} "$ws_max"' in command


def test_readme__production_command_passes_the_frame_limit():
    from broker import settings as ferry_settings

    commands = daphne_commands((ROOT / "README.md").read_text())
    assert commands
    limit = ferry_settings.Defaults.WS_MAX_FRAME_BYTES
    for command in commands:
        for flag in FLAGS:
            assert f"{flag} {limit}" in command, command


def test_redact__keys_and_token_parameters():
    from mqsite.serving import redact

    assert redact("GET /examples/subscribe/?token=abc&topic=t") == (
        "GET /examples/subscribe/?token=[redacted]&topic=t"
    )
    assert redact("GET /x?a=1&api_key=s3cret") == "GET /x?a=1&api_key=[redacted]"
    assert redact("GET /x?key=fry_AbC-_9") == "GET /x?key=[redacted]"
    assert redact("GET /topics/t/messages?key=customer-42") == (
        "GET /topics/t/messages?key=customer-42"
    )


def test_plain_frame_logs__a_frame_sent_styles_no_log_line(monkeypatch):
    """autobahn builds a debug line's arguments for every frame it sends, logged or not; under
    Daphne they are left unstyled (mqsite/serving.py): no click.style call per frame."""
    import click
    from autobahn.twisted.websocket import WebSocketServerProtocol
    from autobahn.websocket.protocol import TrafficStats
    from twisted.internet.testing import StringTransport

    from mqsite import serving

    serving._plain_frame_logs()
    styled: list[str] = []

    def style(text: str, **kwargs: Any) -> str:
        styled.append(text)
        return text

    monkeypatch.setattr(click, "style", style)
    sender: Any = WebSocketServerProtocol()
    sender.transport = wire = StringTransport()
    sender.state, sender.peer = sender.STATE_OPEN, "tcp:127.0.0.1:1"
    sender.logOctets = sender.logFrames = False
    sender.send_queue, sender.trafficStats = [], TrafficStats()
    sender.sendData(b"a frame")
    assert wire.value() == b"a frame"
    assert styled == []


def _masked(payload: bytes, mask: bytes) -> bytes:
    return bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@settings(max_examples=300, deadline=None)
@given(
    payload=st.binary(max_size=300),
    mask=st.binary(min_size=4, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=6),
)
def test_unmasker__a_payload_in_any_pieces_unmasks_as_one(payload, mask, cuts):
    """_Unmasker (mqsite/serving.py) takes a client frame's payload as Twisted hands it over, in
    pieces cut anywhere, and gives back what the client masked, counting what it took."""
    from mqsite.serving import _Unmasker

    masked = _masked(payload, mask)
    bounds = sorted({0, len(payload), *(c for c in cuts if c < len(payload))})
    unmasker = _Unmasker(mask, len(payload))
    out = [unmasker.process(masked[a:b]) for a, b in itertools.pairwise(bounds)]
    assert b"".join(out) == payload
    assert unmasker.pointer() == len(payload)
    unmasker.reset()
    assert unmasker.pointer() == 0


def test_unmask_with_websockets__a_client_frame_reaches_the_protocol_unmasked():
    """Through a real autobahn server protocol after its opening handshake: a client's masked
    text frame, fed in pieces that split its mask's 4-byte groups, arrives as its text."""
    from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
    from autobahn.websocket import protocol
    from twisted.internet.testing import StringTransport

    from mqsite import serving

    serving._unmask_with_websockets()
    assert protocol.create_xor_masker is serving._Unmasker
    got: list[bytes] = []

    class Receiver(WebSocketServerProtocol):
        def onMessage(self, payload: bytes, isBinary: bool) -> None:
            got.append(payload)

    factory = WebSocketServerFactory("ws://127.0.0.1:9")
    factory.protocol = Receiver
    receiver: Any = factory.buildProtocol(None)
    receiver.makeConnection(wire := StringTransport())
    receiver.dataReceived(
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1:9\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    assert b"101 Switching Protocols" in wire.value()
    text, mask = b'{"type": "publish", "topic": "t", "messages": []}', b"\x11\x22\x33\x44"
    frame = bytes([0x81, 0x80 | len(text)]) + mask + _masked(text, mask)
    for a, b in ((0, 9), (9, 15), (15, len(frame))):
        receiver.dataReceived(frame[a:b])
    assert got == [text]


def test_thread_locals_without_exceptions__the_storage_asgiref_would_give():
    """_storage_of (mqsite/serving.py) answers as asgiref's thread-critical Local does: the
    thread's own storage off an event loop, and on one a context's own, the same within it."""
    import asyncio

    from asgiref.local import Local, _CVar, _ThreadCriticalLocal

    from mqsite.serving import _storage_of

    local: Any = Local(thread_critical=True)
    assert _storage_of(local) is local._storage

    async def on_a_loop() -> tuple[object, object]:
        return _storage_of(local), _storage_of(local)

    first, second = asyncio.run(on_a_loop())
    assert isinstance(first, _CVar)
    assert first is second is local._storage.cvar
    # Django's connections through it: one per thread, as before.
    from django.db import connections

    from mqsite import serving

    serving._thread_locals_without_exceptions()
    assert _ThreadCriticalLocal._get_storage is _storage_of
    assert connections["default"] is connections["default"]
