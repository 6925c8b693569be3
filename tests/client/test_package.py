"""ferry_client stands alone: importable without Django or the broker (pipeline/ relies on it)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
sys.path.insert(0, {root!r})
import ferry_client
import ferry_client.producer_async, ferry_client.pull, ferry_client.push, ferry_client.workers
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {{"django", "broker", "mqsite"}})
assert not loaded, loaded
print("ok")
"""


def test_import__needs_no_django():
    # -I: isolated mode, no PYTHONPATH, no user site, not even the current directory on the path;
    # the environment is emptied too, so no DJANGO_SETTINGS_MODULE reaches it.
    done = subprocess.run(
        [sys.executable, "-I", "-c", CHECK.format(root=str(ROOT))],
        env={},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
