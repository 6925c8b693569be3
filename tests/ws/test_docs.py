"""docs/websocket.md's full session, replayed frame by frame (tests/api/test_docs.py's twin).

The client frames are sent as written (the key, and the receipts the server hands out, put in
for the page's `…`); each answer must have the type and the fields the page shows, and the
error frame its code and message.
"""

import re
from pathlib import Path

import orjson
import pytest

from broker.core import keys
from tests.ws.test_consumers import connect, new_topic, produce, recv

pytestmark = pytest.mark.django_db(transaction=True)

DOC = Path(__file__).resolve().parents[2] / "docs" / "websocket.md"


def session() -> list[tuple[str, str]]:
    """The page's session as (direction, frame text) pairs; direction is '>' or '<'."""
    block = DOC.read_text().split("## A full session", 1)[1]
    block = block.split("```", 2)[1]
    frames: list[tuple[str, str]] = []
    for line in block.splitlines():
        if line.startswith(("> ", "< ")):
            frames.append((line[0], line[2:]))
        elif line.startswith("   ") and frames:
            frames[-1] = (frames[-1][0], frames[-1][1] + " " + line.strip())
    return frames


def shown(text: str) -> dict | None:
    """A frame the page shows whole, parsed; None where '…' stands for something."""
    if "…" in text:
        return None
    return orjson.loads(text)


def keys_of(text: str) -> set[str]:
    """The top-level fields a frame shows, even one with '…' in it."""
    found, depth, i = set(), 0, 0
    while i < len(text):
        char = text[i]
        if char == '"':
            end = text.index('"', i + 1)
            if depth == 1 and text[end + 1 : end + 2] == ":":
                found.add(text[i + 1 : end])
            i = end
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        i += 1
    return found


async def test_websocket_doc__full_session_answers_as_shown():
    from asgiref.sync import sync_to_async

    await new_topic("orders", partitions=2)
    await produce("orders", [{"order": n} for n in (7, 9, 8)], tag="paid")
    _, secret = await sync_to_async(keys.create_api_key)(
        keys.CONSOLE, "orders-worker", [keys.parse_permission("admin:orders")]
    )
    ws = await connect()
    receipts: list[str] = []
    pushed: list[dict] = []
    steps: list[tuple[str, list[str]]] = []
    for direction, text in session():
        if direction == ">":
            steps.append((text, []))
        else:
            steps[-1][1].append(text)
    try:
        for text, answers in steps:
            frame = text.replace('"fry_…"', orjson.dumps(secret).decode())
            for placeholder in ("9d2e…", "51ab…"):
                if placeholder in frame:
                    frame = frame.replace(placeholder, receipts.pop(0))
            await ws.send_to(text_data=frame)
            for answer in answers:
                match = re.match(r'\{"type": "(\w+)"', answer)
                assert match is not None, answer
                want = match.group(1)
                # A push may come before or after the answer the page shows it next to.
                if want == "messages" and pushed:
                    got = pushed.pop(0)
                else:
                    got = await recv(ws)
                    while got["type"] == "messages" and want != "messages":
                        receipts += [m["receipt"] for m in got["items"]]
                        pushed.append(got)
                        got = await recv(ws)
                    if want == "messages":
                        receipts += [m["receipt"] for m in got["items"]]
                assert got["type"] == want, (answer, got)
                whole = shown(answer)
                if whole is not None and want == "error":
                    assert got["error"] == whole["error"]
                assert keys_of(answer) <= set(got), (answer, got)
    finally:
        await ws.disconnect()
