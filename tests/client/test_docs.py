"""docs/client.md's examples, run: each Python block as a script against a real Daphne.

The runnable blocks run in page order, each in its own interpreter with FERRY_URL and FERRY_KEY
set as the page says, and must exit 0 (they print what they got; the page shows no output).
Checked structurally instead, and said so here:
- the signature blocks (`Producer(urls, api_key, *, …)`), which are not calls: every keyword
  they name is a parameter of the class, and the other way round;
- the `pip install ./ferry_client` block: tests/client/test_package.py runs that command in a
  fresh virtualenv;
- the `export FERRY_URL=…` block: the URL is make run's, the key has the keys' prefix.
The TLS section's block runs against the same broker behind HAProxy with TLS (FERRY_URL its
https:// address, FERRY_CA_FILE the self-signed certificate's .crt).
"""

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ferry_client
from broker.core import keys
from tests.integration.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DOC = ROOT / "docs" / "client.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
RUN_TIMEOUT_S = 60


def blocks(language: str) -> list[str]:
    return [text for lang, text in BLOCK.findall(DOC.read_text()) if lang == language]


def is_signature(code: str) -> bool:
    try:
        compile(code, "<doc>", "exec")
    except SyntaxError:
        return True
    return False


def test_client_md__python_blocks_run_against_a_live_broker(
    broker_url, tls_broker, key_factory, tmp_path
):
    _, secret = key_factory("admin:*")
    env = dict(os.environ, FERRY_URL=broker_url, FERRY_KEY=secret)
    # Where ferry_client lives: the checkout, as `pip install ./ferry_client` would provide it.
    env["PYTHONPATH"] = str(ROOT)
    # The TLS section's example: the same broker behind HAProxy with a self-signed certificate.
    tls_env = dict(env, FERRY_URL=tls_broker.url, FERRY_CA_FILE=str(tls_broker.ca_file))
    runnable = [code for code in blocks("python") if not is_signature(code)]
    assert len(runnable) >= 9
    assert sum("FERRY_CA_FILE" in code for code in runnable) == 1
    for index, code in enumerate(runnable):
        script = Path(tmp_path) / f"example_{index}.py"
        script.write_text(code)
        done = subprocess.run(
            [sys.executable, str(script)],
            env=tls_env if "FERRY_CA_FILE" in code else env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert done.returncode == 0, f"example {index}:\n{code}\n{done.stdout}\n{done.stderr}"


def test_client_md__signatures_match_the_classes():
    signatures = [code for code in blocks("python") if is_signature(code)]
    assert signatures
    for code in signatures:
        name, _, rest = code.strip().partition("(")
        documented = set(re.findall(r"(\w+)=", rest)) | set(
            re.findall(r"^\s*(\w+)(?=,|\)|$)", rest.replace(", ", ",\n"), re.M)
        )
        documented.discard("")
        actual = set(inspect.signature(getattr(ferry_client, name)).parameters)
        assert documented == actual, (name, documented ^ actual)


def test_client_md__shell_blocks():
    install, environment = blocks("sh")
    assert install.split("#")[0].split() == ["pip", "install", "./ferry_client"]
    assert (ROOT / "ferry_client" / "pyproject.toml").exists()
    url = re.search(r"FERRY_URL=(\S+)", environment)
    key = re.search(r"FERRY_KEY=(\S+)", environment)
    assert url
    assert key
    assert url.group(1) == "http://127.0.0.1:8000"
    assert key.group(1).startswith(keys.KEY_PREFIX)
