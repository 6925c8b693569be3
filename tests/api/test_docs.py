"""docs/api.md's curl examples, replayed in order against the API: statuses and errors as shown.

Each `$ curl` example is parsed (method, path, query, body, key) and sent through Django's test
client, in the order the page shows them, so that each one finds the state the ones before it
left. A documented status must be the real one, and a documented error body the real code and
message. Success bodies are checked by their top-level fields where the page shows them whole.
"""

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings

from broker import api
from broker.core import keys, partitioning

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
BLOCK = re.compile(r"```console\n(.*?)```", re.S)
STATUS = re.compile(r"^HTTP/1\.1 (\d{3})", re.M)


class Example:
    settings: dict[str, int]

    def __init__(self, index: int, text: str) -> None:
        self.index = index
        self.text = text
        command, _, rest = text.partition("\nHTTP/1.1 ")
        self.response_text = "HTTP/1.1 " + rest if rest else ""
        start = command.find("$ curl")
        # One curl command per example; a body may span lines inside its quotes.
        self.curl = re.sub(r"\\\n\s*", " ", command[start:]) if start >= 0 else None

    def __repr__(self) -> str:
        return f"example {self.index} ({self.key})"

    @property
    def key(self) -> str:
        """METHOD path?query [body], which names an example in NOT_REPLAYED."""
        request = parse_curl(self.curl or "$ curl", {})
        url = (request["url"] or "").removeprefix("http://127.0.0.1:8000")
        return " ".join(" ".join(filter(None, [request["method"], url, request["body"]])).split())


def examples() -> list[Example]:
    """The console examples in page order, each with the FERRY_* settings its section names.

    A section may say its examples come "from a server started with `FERRY_X=n`": those apply
    to its examples, until the next heading.
    """
    found: list[Example] = []
    settings_now: dict[str, int] = {}
    position = 0
    text = DOC.read_text()
    for index, match in enumerate(BLOCK.finditer(text)):
        prose = text[position : match.start()]
        if re.search(r"^#", prose, re.M):
            settings_now = {}
        for name, value in re.findall(r"`(FERRY_[A-Z_]+)=(\d+)`", prose):
            settings_now[name] = int(value)
        example = Example(index, match.group(1))
        example.settings = dict(settings_now)
        found.append(example)
        position = match.end()
    return found


def parse_curl(command: str, env: dict[str, str]) -> dict[str, Any]:
    for name, value in env.items():
        command = command.replace(f"${name}", value)
    words = shlex.split(command.removeprefix("$ "))[1:]
    request: dict[str, Any] = {"method": None, "headers": {}, "body": None, "url": None}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-H":
            name, _, value = words[i + 1].partition(":")
            request["headers"][name.strip().lower()] = value.strip()
            i += 2
        elif word in ("-d", "--data-binary"):
            request["body"] = words[i + 1]
            i += 2
        elif word == "-X":
            request["method"] = words[i + 1]
            i += 2
        elif word == "-i":
            i += 1
        else:
            request["url"] = word
            i += 1
    request["method"] = request["method"] or ("POST" if request["body"] is not None else "GET")
    return request


def documented_json(response_text: str) -> Any:
    """The documented body, if shown whole (no '…'), else None."""
    body = response_text.partition("\n")[2].strip()
    if not body or "…" in body:
        return None
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return None


# Examples whose answer depends on state the page describes in prose but does not make with an
# earlier example (topics set up off-page, messages a client produced, time passing). Only
# their documented error code is checked to exist. Each key must still name an example.
NOT_REPLAYED = {
    # Topics the page's prose makes with options or from another server.
    'POST /api/v1/topics/orders.eu/messages {"messages": [{"value": 1}]}': "topic off-page",
    "DELETE /api/v1/topics/scratch": "topic off-page",
    'POST /api/v1/topics/tiny/messages {"messages": [{"value": "12345678"}]}': "topic off-page",
    'POST /api/v1/topics/tiny/messages {"messages": [{"value": "123456789"}]}': "topic off-page",
    'POST /api/v1/topics/tiny/messages {"messages": [{"value": "ok"}, {"value": "abc", "key": '
    '"k12", "headers": {"h": "vv"}}]}': "topic off-page",
    'POST /api/v1/topics/audit/messages {"messages": [{"value": 3}, {"value": 4}]}': "off-page",
    'POST /api/v1/topics/ticks/messages {"messages": [{"value": 1}, {"value": 2}, {"value": 3}, '
    '{"value": 4}, {"value": 5}]}': "topic off-page",
    "GET /api/v1/topics/ticks": "topic off-page",
    "GET /api/v1/topics/ticks/partitions/0/messages?offset=0": "topic off-page",
    'POST /api/v1/groups/late/commit {"topic": "ticks", "offsets": [{"partition": 0, "offset": '
    "0}]}": "topic off-page",
    'POST /api/v1/groups/workers/poll {"topic": "payments", "member_id": "worker-1"}': "off-page",
    # Messages and groups the story's clients made between examples.
    'POST /api/v1/topics/orders/purge {"up_to": {"0": 2}}': "messages off-page",
    'POST /api/v1/topics/orders/purge {"up_to": {"0": 9}}': "messages off-page",
    'POST /api/v1/groups/billing/commit {"topic": "orders", "offsets": [{"partition": 0, '
    '"offset": 9}]}': "messages off-page",
    'POST /api/v1/groups/billing/commit {"topic": "orders", "offsets": [ {"partition": 0, '
    '"offset": 1}, {"partition": 1, "offset": 4}, {"partition": 2, "offset": 1}, '
    '{"partition": 3, "offset": 2}]}': "messages off-page",
    'POST /api/v1/groups/mailer/commit {"topic": "invoices", "offsets": [{"partition": 0, '
    '"offset": 2}], "member_id": "mailer-1", "generation": 0}': "member joined off-page",
    "GET /api/v1/groups/fulfilment": "group off-page",
    "DELETE /api/v1/groups/fulfilment": "group off-page",
    'PATCH /api/v1/groups/mailer {"mode": "broadcast"}': "a member joined off-page",
    "DELETE /api/v1/groups/workers/members/3d65cfd8655043f49a04f43060f1ffe3": "random member id",
    'POST /api/v1/groups/mailer/ack {"receipts": ["a1401432f1db621c.7.1"]}': "random receipt",
    'POST /api/v1/groups/mailer/nack {"receipts": ["01129441031d0133.7.1"], "error": "SMTP 550: '
    'mailbox unavailable"}': "random receipt",
    'POST /api/v1/groups/mailer/dlq/redrive {"ids": [2]}': "dead letters off-page",
    'POST /api/v1/groups/g/dlq/redrive-jobs {"all": true, "topic": "orders", "dry_run": true}': (
        "dead letters off-page"
    ),
    'POST /api/v1/groups/g/dlq/redrive-jobs {"all": true, "topic": "orders", '
    '"rate_per_second": 2}': "dead letters off-page",
    "GET /api/v1/redrive-jobs/1": "dead letters off-page",
    "DELETE /api/v1/redrive-jobs/1": "dead letters off-page",
    # Time passing: a long poll answered by a produce, a delayed message released.
    "GET /api/v1/topics/orders/partitions/1/messages?offset=5&max_wait_ms=2000": "timing",
    "POST /api/v1/scheduled/1/deliver_now": "timing",
}

# The settings a server started with FERRY_<NAME>=n would have.
DJANGO_SETTING = {"FERRY_MAX_REQUEST_BYTES": "DATA_UPLOAD_MAX_MEMORY_SIZE"}


def run(example: Example, env: dict[str, str], files: dict[str, str]) -> tuple[int, Any]:
    assert example.curl is not None
    request = parse_curl(example.curl, env)
    body = request["body"]
    if body is not None and body.startswith("@"):
        body = files[body[1:]]
    url = request["url"].removeprefix("http://127.0.0.1:8000")
    headers = {}
    if "authorization" in request["headers"]:
        headers["HTTP_AUTHORIZATION"] = request["headers"]["authorization"]
    overrides = {DJANGO_SETTING.get(k, k): v for k, v in example.settings.items()}
    with override_settings(**overrides):
        response = Client().generic(
            request["method"],
            url,
            data=(body or "").encode(),
            content_type="application/json",
            **headers,
        )
    try:
        return response.status_code, json.loads(response.content or b"null")
    except json.JSONDecodeError:
        return response.status_code, response.content.decode(errors="replace")


# reset_sequences: the page shows scheduled ids 1, 2, 3, and PostgreSQL's sequences do not roll
# back with a test's transaction, so a test before this one would shift them.
@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_api_doc__examples_answer_as_shown(monkeypatch):
    # Keyless messages take turns per topic id, and ids restart here: start the turns afresh.
    monkeypatch.setattr(partitioning, "_round_robin", partitioning.RoundRobin())
    _, admin = keys.create_api_key(keys.CONSOLE, "admin", [keys.parse_permission("admin:*")])
    _, producer = keys.create_api_key(
        keys.CONSOLE, "producer", [keys.parse_permission("produce:orders.*")]
    )
    env = {"FERRY_KEY": admin, "PRODUCER_KEY": producer}
    files: dict[str, str] = {}
    mismatches = []
    seen: set[str] = set()
    for example in examples():
        for line in example.text.splitlines():
            made = re.match(r"\$ python3 -c '(.*)' > (\S+)$", line)
            if made:
                files[made.group(2)] = eval_print(made.group(1))
        if example.curl is None:
            continue
        status, body = run(example, env, files)
        if status == 201 and isinstance(body, dict) and "epoch" in body:
            # A transaction begun: later examples name it $TX, and the one before $OLD_TX.
            if "TX" in env:
                env["OLD_TX"] = env["TX"]
            env["TX"] = str(body["id"])
        shown = STATUS.search(example.response_text)
        if shown is None:
            continue
        if example.key in NOT_REPLAYED:
            seen.add(example.key)
            expected = documented_json(example.response_text)
            if isinstance(expected, dict) and isinstance(expected.get("error"), dict):
                assert expected["error"]["code"] in api.STATUS_BY_CODE or int(shown.group(1)) == 400
            continue
        if int(shown.group(1)) != status:
            mismatches.append(f"{example!r}: status {status}, shown {shown.group(1)}: {body}")
            continue
        expected = documented_json(example.response_text)
        if isinstance(expected, dict) and isinstance(expected.get("error"), dict):
            real = body.get("error", {}) if isinstance(body, dict) else {}
            for field in ("code", "message"):
                if real.get(field) != expected["error"].get(field):
                    mismatches.append(
                        f"{example!r}: error {field} {real.get(field)!r}, "
                        f"shown {expected['error'].get(field)!r}"
                    )
        elif isinstance(expected, dict) and isinstance(body, dict) and set(expected) != set(body):
            mismatches.append(f"{example!r}: fields {sorted(body)}, shown {sorted(expected)}")
    assert not mismatches, "\n".join(mismatches)
    assert seen == set(NOT_REPLAYED), set(NOT_REPLAYED) - seen


def eval_print(code: str) -> str:
    """What `python3 -c code` prints, for the examples that make a file that way."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # the page's own one-liner
    return out.getvalue()
