"""static/ferry.js in a real headless Chromium against a real Daphne: the example page
subscribes, shows and acks messages, publishes, reconnects; a throwing handler nacks.

Chromium is driven over --remote-debugging-pipe (the DevTools protocol as NUL-separated JSON on
file descriptors 3 and 4), so a test waits for a condition on the live page instead of a fixed
time: `--dump-dom --virtual-time-budget` dumps as soon as the page idles on its open socket,
before any message is pushed.
"""

import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from broker.core import groups, keys
from tests.integration.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WAIT_S = 10
# The page's state in one read: what a failing assertion prints.
PAGE_STATE = """JSON.stringify({
  status: document.getElementById("status").textContent,
  errors: document.getElementById("errors").textContent,
  acked: Number(document.getElementById("acked").textContent),
  messages: [...document.querySelectorAll("#messages li .value")].map((e) => e.textContent),
  published: [...document.querySelectorAll("#published li .value")].map((e) => e.textContent),
})"""


class Browser:
    """One headless Chromium showing one page, driven over the DevTools pipe."""

    def __init__(self, binary: str, url: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="ferry-chromium-")
        # Chromium reads commands on fd 3 and answers on fd 4; bash moves our pipe ends there
        # (dash takes no fd numbers above 9).
        to_browser, self.commands = (_high_fd(fd) for fd in os.pipe())
        self.answers, from_browser = (_high_fd(fd) for fd in os.pipe())
        self.proc = subprocess.Popen(
            [
                "bash",
                "-c",
                f'exec "$@" 3<&{to_browser} 4>&{from_browser} {to_browser}<&- {from_browser}>&-',
                "chromium",
                binary,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe",
                url,
            ],
            pass_fds=(to_browser, from_browser),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # A session of its own: Chromium's helper processes go with it if it must be killed.
            start_new_session=True,
        )
        os.close(to_browser)
        os.close(from_browser)
        self.buffer = b""
        self.next_id = 0
        self.session: str | None = None
        try:
            self._attach()
        except BaseException:
            self.close()
            raise

    def _attach(self) -> None:
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        attached = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        self.session = attached["sessionId"]
        self._wait_loaded()

    def _wait_loaded(self) -> None:
        # The target starts on about:blank, and has no context to evaluate in while navigating.
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                if self.evaluate(
                    'location.href !== "about:blank" && document.readyState === "complete"'
                ):
                    return
            time.sleep(0.05)
        pytest.fail("the page did not load")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        command: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            command["sessionId"] = self.session
        os.write(self.commands, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + WAIT_S
        while True:
            while b"\0" not in self.buffer:
                ready, _, _ = select.select(
                    [self.answers], [], [], max(0, deadline - time.monotonic())
                )
                chunk = os.read(self.answers, 1 << 16) if ready else b""
                if not chunk:
                    raise RuntimeError(f"chromium gave no answer to {method}")
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(line)
            if answer.get("id") == self.next_id:  # anything else is an event
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def state(self) -> dict[str, Any]:
        """The example page's status, errors, ack count, messages and published values."""
        return json.loads(self.evaluate(PAGE_STATE))

    def wait_for(self, expression: str) -> None:
        """Poll until expression is true on the page."""
        deadline = time.monotonic() + WAIT_S
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {expression}: {self.evaluate(PAGE_STATE)}")
            time.sleep(0.05)

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(timeout=WAIT_S)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            # Not reaped yet, so the group is still ours: Chromium and its helpers.
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        finally:
            os.close(self.commands)
            os.close(self.answers)
            shutil.rmtree(self.profile, ignore_errors=True)


def _high_fd(fd: int) -> int:
    """fd moved to 10 or above, clear of the 3 and 4 that Chromium's pipe needs."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium binary, installed from Debian's packages when missing."""
    found = subprocess.run(
        [str(ROOT / "scripts" / "chromium"), "ensure"], check=True, capture_output=True, text=True
    )
    return found.stdout.strip().splitlines()[-1]


@pytest.fixture
def open_page(chromium, broker_url) -> Iterator[Any]:
    """Open the example page with these query parameters in a new headless Chromium."""
    browsers: list[Browser] = []

    def open_(token: str | None = None, **params: str) -> Browser:
        # The key in the fragment, never the query string: it must not reach the server's log.
        address = f"{broker_url}/examples/subscribe/?{urlencode(params)}"
        if token is not None:
            address += f"#{urlencode({'token': token})}"
        browsers.append(Browser(chromium, address))
        return browsers[-1]

    yield open_
    for browser in browsers:
        browser.close()


@pytest.fixture
def topic_and_key(topic_factory, key_factory):
    topic = topic_factory(partitions=2)
    _, secret = key_factory(f"consume:{topic.name}", f"produce:{topic.name}")
    return topic.name, secret


@pytest.fixture
def http(broker_url, topic_and_key) -> Iterator[httpx.Client]:
    """REST on the same server, with the page's key."""
    _, secret = topic_and_key
    with httpx.Client(
        base_url=f"{broker_url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=10
    ) as client:
        yield client


def produce(http: httpx.Client, topic: str, *values: Any) -> None:
    response = http.post(
        f"/topics/{topic}/messages", json={"messages": [{"value": v} for v in values]}
    )
    assert response.status_code == 200, response.text


def stored_values(http: httpx.Client, topic: str) -> list[Any]:
    values = []
    for partition in range(2):
        fetched = http.get(f"/topics/{topic}/partitions/{partition}/messages", params={"offset": 0})
        values += [m["value"] for m in fetched.json()["messages"]]
    return values


def committed(http: httpx.Client, group: str, topic: str) -> dict[str, Any]:
    described = http.get(f"/groups/{group}")
    assert described.status_code == 200, described.text
    [offsets] = [t for t in described.json()["topics"] if t["topic"] == topic]
    return offsets


def test_subscribe_page__shows_acks_and_publishes(open_page, http, topic_and_key):
    topic, secret = topic_and_key
    produce(http, topic, {"n": 0}, {"n": 1}, {"n": 2})

    page = open_page(token=secret, topic=topic, group="web", publish="hello")
    page.wait_for('document.getElementById("acked").textContent === "4"')
    state = page.state()

    assert state["errors"] == ""
    assert state["status"].startswith(f"subscribed to {topic} as web")
    assert sorted(state["messages"]) == sorted(['{"n":0}', '{"n":1}', '{"n":2}', "hello"])
    assert state["published"] == ["hello"]
    # The key came in the fragment (never sent to the server) and left the address bar.
    assert page.evaluate("location.hash") == ""
    # The page's publish is stored, and its acks moved the group's committed offset.
    assert "hello" in stored_values(http, topic)
    offsets = committed(http, "web", topic)
    assert (offsets["committed_offset"], offsets["lag"]) == (4, 0)


def test_subscribe_page__reconnects_and_resubscribes(open_page, http, topic_and_key):
    topic, secret = topic_and_key
    produce(http, topic, "before")
    page = open_page(token=secret, topic=topic, group="web")
    page.wait_for('document.getElementById("acked").textContent === "1"')

    # The socket drops under the client (not client.close()): it reconnects by itself.
    page.evaluate(
        """window.resubscribed = false;
        client.addEventListener("subscribed", () => { window.resubscribed = true; });
        client.ws.close();
        true"""
    )
    page.wait_for("window.resubscribed")
    produce(http, topic, "after")
    page.wait_for('document.getElementById("acked").textContent === "2"')
    state = page.state()

    assert state["messages"] == ["before", "after"]
    assert committed(http, "web", topic)["committed_offset"] == 2


def test_subscribe__throwing_handler_nacks_with_error_text(open_page, http, topic_and_key):
    topic, secret = topic_and_key
    # One attempt: the nack dead-letters at once, keeping the handler's error text.
    groups.configure_group(keys.CONSOLE, "failing", max_attempts=1)
    produce(http, topic, "poison")
    page = open_page(token=secret, topic=topic, group="web")
    page.wait_for('document.getElementById("status").textContent.startsWith("subscribed")')

    page.evaluate(
        f"""window.nacked = 0;
        client.addEventListener("nacked", (e) => {{ window.nacked += e.detail.settled; }});
        client.subscribe({{topic: {json.dumps(topic)}, group: "failing"}}, async (msg) => {{
          throw new Error(`cannot handle ${{msg.value}}`);
        }});
        true"""
    )
    page.wait_for("window.nacked === 1")

    dead = http.get("/groups/failing/dlq").json()
    assert [(d["message"]["value"], d["last_error"]) for d in dead["items"]] == [
        ("poison", "cannot handle poison")
    ]


def test_subscribe_page__bad_token_is_not_retried(open_page, topic_and_key):
    topic, _ = topic_and_key

    page = open_page(token="fy_wrong", topic=topic, group="web")
    page.wait_for('document.getElementById("status").textContent === "closed (4401)"')
    state = page.state()

    assert state["errors"].startswith("unauthenticated:")
    assert state["messages"] == []


def test_ferry_mjs__exports_the_plain_script_client(open_page):
    page = open_page()

    exported = page.evaluate(
        """import("/static/ferry.mjs").then((m) => [
          m.default === window.Ferry, typeof m.connect, typeof m.Client, typeof m.FerryError,
        ])"""
    )

    assert exported == [True, "function", "function", "function"]


# A scripted server for ferry.js, in the page: the outage answers a real server gives only while
# its database is away (tests/integration/test_faults.py drives the real ones).
FAKE_OUTAGE_SERVER = """
(() => {
  const unavailable = {code: "unavailable", message: "database away",
                       detail: {retry_after: 0.05, dependency: "database"}};
  window.sent = [];
  let subscribes = 0, publishes = 0, acks = 0;
  class FakeSocket {
    constructor(url) {
      setTimeout(() => this.onopen(), 0);
    }
    answer(frame) {
      setTimeout(() => this.onmessage({data: JSON.stringify(frame)}), 0);
    }
    send(data) {
      const f = JSON.parse(data);
      window.sent.push(f.type);
      if (f.type === "subscribe") {
        subscribes += 1;
        if (subscribes === 1) return this.answer({type: "error", ref: f.ref, error: unavailable});
        this.answer({type: "subscribed", ref: f.ref, sub: f.sub, member_id: "m",
                     mode: "clustering", partitions: [0]});
        if (subscribes === 2) {
          // The subscription ends on the server: it is subscribed again.
          this.answer({type: "error", sub: f.sub, error: unavailable});
        } else {
          this.answer({type: "messages", sub: f.sub, items: [{value: "v", receipt: "r"}]});
        }
      } else if (f.type === "publish") {
        publishes += 1;
        if (publishes === 1) return this.answer({type: "error", ref: f.ref, error: unavailable});
        this.answer({type: "published", ref: f.ref, results: [{partition: 0, offset: 0}]});
      } else if (f.type === "ack") {
        acks += 1;
        if (acks === 1) return this.answer({type: "error", ref: f.ref, error: unavailable});
        this.answer({type: "acked", ref: f.ref, sub: f.sub, settled: 1, stale: []});
      }
    }
    close() {}
  }
  window.outage = {handled: 0, acked: 0, published: null};
  const client = Ferry.connect("/ws/v1/", {WebSocket: FakeSocket, ackDelayMs: 0});
  client.subscribe({topic: "t", group: "g"}, () => { window.outage.handled += 1; });
  client.addEventListener("acked", () => { window.outage.acked += 1; });
  client.publish("t", [{id: "m1", value: 1}]).then((r) => { window.outage.published = r; });
  return true;
})()
"""


def test_ferry_js__rides_out_unavailable_answers(open_page):
    """A subscribe refused and a subscription ended as unavailable subscribe again after
    retry_after; a publish with ids and an ack answered unavailable are sent again."""
    page = open_page()
    page.evaluate(FAKE_OUTAGE_SERVER)

    page.wait_for("window.outage.acked === 1 && window.outage.published !== null")

    assert page.evaluate("window.outage.handled") == 1
    assert page.evaluate("window.sent.filter((t) => t === 'subscribe').length") == 3
    assert page.evaluate("window.sent.filter((t) => t === 'publish').length") == 2
    assert page.evaluate("window.sent.filter((t) => t === 'ack').length") == 2
