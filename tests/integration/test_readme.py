"""README.md's and docs/metrics.md's examples, run against a real Daphne and the test database.

README.md:
- the tour's curl commands run as written, one by one, in bash with curl (the key for
  `fry_…`, the live server for 127.0.0.1:8000, and `<receipt>` the receipt the member poll
  before it answered), and each must answer 2xx;
- the console commands run as written through manage.py on the test database;
- checked structurally, since they install or start long-running servers: `make run` and
  `make test` (Makefile targets), and the production block (the variables it sets are read by
  the settings; the Daphne flags are tests/unit/test_serving.py's; migrate and the Celery app
  exist).
docs/metrics.md: `curl /metrics` on a broker holding the example's state (six messages on
`orders`, group `g` three behind) answers the lines shown.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import httpx
import pytest

from broker.core import groups, keys, log, topics
from broker.core.records import NewMessage
from tests.integration.conftest import ROOT, server_env

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
TIMEOUT_S = 60


def blocks(path: str, language: str) -> list[str]:
    return [t for lang, t in BLOCK.findall((ROOT / path).read_text()) if lang == language]


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found, pending = [], ""
    for line in joined.splitlines():
        line = pending + line
        # A quoted argument may go on over several lines (the produce body).
        if line.count("'") % 2:
            pending = line + "\n"
            continue
        pending = ""
        code = line.split("  #")[0].strip() if not line.lstrip().startswith("#") else ""
        if code:
            found.append(code)
    return found


def test_readme__tour_runs_against_a_live_broker(broker_url, key_factory):
    _, secret = key_factory("admin:*")
    tour = next(b for b in blocks("README.md", "sh") if "$FERRY/topics" in b)
    env = dict(os.environ, FERRY_KEY=secret, FERRY=f"{broker_url}/api/v1")
    lines = commands(tour)
    assert lines[0].startswith("export FERRY_KEY=fry_")
    setup = "\n".join(
        line
        for line in lines
        if line.startswith(("export", "auth="))
        and not line.startswith("export FERRY_KEY=")
        and not line.startswith("export FERRY=")
    )
    curls = [line for line in lines if line.startswith("curl")]
    assert len(curls) >= 8
    receipt = None
    for command in curls:
        if "<receipt>" in command:
            assert receipt, "no member poll answered a receipt before the ack"
            command = command.replace("<receipt>", receipt)
        command = command.replace("curl -s", "curl -s -w '\\n%{http_code}'", 1)
        done = subprocess.run(
            ["bash", "-c", f"{setup}\n{command}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=True,
        )
        body, _, status = done.stdout.rpartition("\n")
        assert status.startswith("2"), f"{command}\n{done.stdout}"
        answer = json.loads(body)
        if "member_id" in command and "/poll" in command:
            receipt = answer["messages"][0]["receipt"]


def test_readme__console_commands_run(django_db_blocker):
    block = next(b for b in blocks("README.md", "sh") if "manage.py ferry" in b)
    env = server_env()
    outputs = []
    for command in commands(block):
        assert ".venv/bin/python manage.py ferry " in command
        command = command.replace(".venv/bin/python", shlex.quote(sys.executable))
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    consumed = [json.loads(line)["value"] for line in outputs[2].splitlines()]
    assert consumed == ["first", "second"]
    assert "audit" in outputs[3]


def test_readme__commands_that_start_servers_are_checked_structurally():
    two = next(b for b in blocks("README.md", "sh") if "make run" in b)
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", two, re.M):
        assert re.search(rf"^{target}:", makefile, re.M), target
    production = next(b for b in blocks("README.md", "sh") if "DATABASE_URL" in b)
    read = (ROOT / "mqsite" / "settings.py").read_text() + (
        ROOT / "broker" / "settings.py"
    ).read_text()
    for name in re.findall(r"export (\w+)=", production) + re.findall(r" (\w+)=", production):
        if name.startswith("FERRY_"):
            assert name.removeprefix("FERRY_") in read, name
        else:
            assert name in read, name
    assert ".venv/bin/python manage.py migrate" in production
    assert "celery -A mqsite worker -B" in production
    assert (ROOT / "mqsite" / "celery.py").exists()


def test_metrics_md__scrape_answers_the_lines_shown(broker_url):
    topics.create_topic(keys.CONSOLE, "orders", 1)
    log.append_messages(keys.CONSOLE, "orders", [NewMessage(value=b"1") for _ in range(6)])
    groups.commit_offsets(keys.CONSOLE, "g", "orders", {0: 3})
    (example,) = blocks("docs/metrics.md", "console")
    command, *shown = example.strip().splitlines()
    assert command == "$ curl http://127.0.0.1:8000/metrics"
    answer = httpx.get(f"{broker_url}/metrics", timeout=30)
    assert answer.status_code == 200
    lines = set(answer.text.splitlines())
    for line in shown:
        if line != "…":
            assert line in lines, line
