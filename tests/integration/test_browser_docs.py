"""docs/browser.md's examples, run in headless Chromium against a real Daphne, in page order.

Each block runs on the example page (which loads static/ferry.js), inside an async function,
with what the page leaves to the reader filled in: the key for "fry_…" and `token`, a `render`
and a `status` function. The module block's static `import` becomes the same dynamic import.
Blocks that use the `client` of the loading block get it as `client`. Every block runs as
written otherwise, and what it resolves to is checked against what the page says.
"""

import json
import re

import pytest

from broker.core import keys
from tests.integration.conftest import ROOT
from tests.integration.test_browser import chromium, open_page

__all__ = ["chromium", "open_page"]

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DOC = ROOT / "docs" / "browser.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(DOC.read_text())


def in_function(body: str, prelude: str = "", result: str = "null") -> str:
    return f"(async () => {{ {prelude}\n{body}\nreturn {result}; }})()"


def test_browser_md__examples_run_in_chromium(open_page, topic_factory, key_factory):
    topic_factory("orders", partitions=2)
    _, token = key_factory("consume:orders", "produce:orders")
    examples = blocks()
    assert [lang for lang, _ in examples] == ["html", "html", "js", "js", "js"]
    page = open_page()
    page.wait_for("window.Ferry !== undefined")
    fill = {'"fry_…"': json.dumps(token)}

    def filled(code: str) -> str:
        for placeholder, value in fill.items():
            code = code.replace(placeholder, value)
        return code

    # Loading it as a plain script: the page already has ferry.js; run the inline script.
    plain = re.findall(r"<script>(.*?)</script>", examples[0][1], re.S)[0]
    assert '<script src="/static/ferry.js"></script>' in examples[0][1]
    page.evaluate(in_function(filled(plain), result="(window.docClient = client, true)"))
    page.wait_for("window.docClient.connected")

    # As an ES module: the same connect, from ferry.mjs.
    module = re.findall(r'<script type="module">(.*?)</script>', examples[1][1], re.S)[0]
    module = module.replace(
        'import {connect} from "/static/ferry.mjs";',
        'const {connect} = await import("/static/ferry.mjs");',
    )
    assert "await import" in module
    assert page.evaluate(
        in_function(filled(module), result="(client.close(), client instanceof Ferry.Client)")
    )

    # Subscribing: ready answers the `subscribed` frame; unsubscribe leaves the group.
    prelude = (
        "const client = window.docClient; window.rendered = [];"
        "const render = async (value) => { window.rendered.push(value); };"
    )
    info = page.evaluate(in_function(examples[2][1], prelude, "info"))
    assert info["type"] == "subscribed"
    assert info["member_id"]

    # Publishing: resolves once committed, with partition, offset and duplicate per message.
    results = page.evaluate(in_function(examples[3][1], prelude, "results"))
    assert [sorted(r) for r in results] == [["duplicate", "offset", "partition"]]
    assert results[0]["duplicate"] is False

    # Events: a client of its own, with onclose/onerror options and a listener; closed after.
    prelude = f"const token = {json.dumps(token)}; const status = (text) => {{}};"
    opened = page.evaluate(
        in_function(
            examples[4][1],
            prelude,
            "await new Promise((resolve) => {"
            " client.addEventListener('open', () => { client.close(); resolve(true); },"
            " {once: true}); })",
        )
    )
    assert opened is True
    page.evaluate("window.docClient.close(), true")
    # The placeholder keys look like real ones (the prefix of keys.KEY_PREFIX).
    assert f'"{keys.KEY_PREFIX}…"' in examples[0][1]
    assert f'"{keys.KEY_PREFIX}…"' in examples[1][1]
