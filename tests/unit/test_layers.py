"""The import contracts (pyproject.toml [tool.importlinter]) pass here and fail on a breach.

Each case copies the project's packages and pyproject.toml to a temporary directory, adds one
import that a contract forbids, and runs lint-imports there, as scripts/lint runs it here
(docs/decisions/0011-core-layers.md).
"""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "dashboard", "ferry_client", "mqsite", "pipeline")
# What the core may import from broker/ besides itself.
BENEATH_CORE = {"__init__", "core", "models", "settings", "migrations"}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path):
    """A copy of the project's Python packages and its pyproject.toml."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "migrations", "templates"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_contracts_kept_on_this_tree(tree):
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


def _contract(name: str) -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == name]
    return contract


def _broker_edges(but: frozenset[str] = frozenset()) -> set[str]:
    """broker's modules and packages beside the core (the edges), less those named."""
    return {
        f"broker.{path.stem}"
        for path in (ROOT / "broker").iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").exists())
        and path.stem not in BENEATH_CORE | but
    }


def test_every_edge_of_broker_is_forbidden_to_the_core():
    assert _broker_edges() <= set(_contract("core-below-edges")["forbidden_modules"])


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # An upward import inside the core: topics (low) from delivery (high).
        (
            "broker/core/topics.py",
            "from broker.core import delivery  # noqa",
            "broker.core in layers",
        ),
        # The log calling up into scheduling: the circle this contract untied.
        (
            "broker/core/log/append.py",
            "from broker.core import scheduling  # noqa",
            "broker.core in layers",
        ),
        # Two modules of one layer that must stay apart.
        (
            "broker/core/history.py",
            "from broker.core import browse  # noqa",
            "broker.core in layers",
        ),
        # The core reaching into an edge.
        ("broker/core/keys.py", "from broker import api  # noqa", "broker.core imports no edge"),
        # An edge reaching past the core into the models.
        (
            "dashboard/views/topics.py",
            "from broker import models  # noqa",
            "the edges reach the models only through the core",
        ),
        ("broker/api.py", "from broker.models import Topic  # noqa", "the edges reach the models"),
        # The client importing the broker or Django.
        (
            "ferry_client/records.py",
            "from broker.core import records  # noqa",
            "ferry_client imports nothing",
        ),
        ("ferry_client/errors.py", "import django  # noqa", "ferry_client imports nothing"),
        # The Spark pipeline reaching past the client into the broker.
        ("pipeline/rows.py", "from broker import models  # noqa", "pipeline imports nothing"),
    ],
)
def test_contract_broken_by_a_forbidden_import(tree, module, line, broken):
    _append(tree / module, line)
    result = _lint(tree)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{broken}" in result.stdout
    assert "BROKEN" in result.stdout


def test_every_edge_is_kept_from_the_models():
    """The models' contract names every edge: broker's modules beside the core (the read-only
    admin and the app's config aside), the console and the site."""
    edges = _broker_edges(but=frozenset({"admin", "apps"})) | {"dashboard", "mqsite"}
    assert edges == set(_contract("edges-through-core")["source_modules"])


def test_a_new_core_module_must_be_placed_in_a_layer(tree):
    (tree / "broker/core/newcomer.py").write_text('"""Not placed in any layer."""\n')
    result = _lint(tree)
    assert result.returncode != 0
    assert "newcomer" in result.stdout + result.stderr
