"""How Ferry is served: every way gives Daphne FERRY_WS_MAX_FRAME_BYTES (docs/websocket.md#limits),
keys stay out of the access log, and autobahn styles no log line per frame (mqsite/serving.py)."""

import re
from pathlib import Path
from typing import Any

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
