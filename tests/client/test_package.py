"""ferry_client stands alone: importable without Django or the broker (pipeline/ relies on it)."""

import shutil
import subprocess
import sys
import sysconfig
import tomllib
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


VENV_CHECK = """
import sys, ferry_client, ferry_client.push, ferry_client.workers
from importlib import metadata
assert ferry_client.__file__.startswith(sys.prefix), ferry_client.__file__
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"django", "broker", "mqsite"})
assert not loaded, loaded
dist = metadata.distribution("ferry-client")
requires = sorted(r.split(">")[0] for r in dist.requires)
assert requires == ["httpx", "murmurhash2", "websockets"], dist.requires
assert any(str(f).endswith("py.typed") for f in dist.files)
print(dist.version)
"""


def test_pip_install__in_a_clean_virtualenv(tmp_path):
    """docs/client.md's one command, `pip install ./ferry_client`, in a fresh virtualenv."""
    source = tmp_path / "checkout" / "ferry_client"
    # A copy, so that the build leaves nothing in the working tree.
    shutil.copytree(
        ROOT / "ferry_client",
        source,
        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"),
    )
    venv = tmp_path / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    # pip's build backend (setuptools) comes from pip's configured index, as for any user;
    # the dependencies are not downloaded but lent from this environment's site-packages, last
    # on the path, which holds Django too: the check shows that ferry_client never imports it.
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "zz_lent_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "-q", str(source)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    done = subprocess.run(
        [str(python), "-I", "-c", VENV_CHECK],
        cwd=tmp_path,
        env={},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    root_version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert done.stdout.strip() == root_version
