"""`manage.py pipeline <job>`: runs the job module in its own process, arguments passed on."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline__job_arguments_pass_through():
    done = subprocess.run(
        [sys.executable, "manage.py", "pipeline", "replay", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: replay" in done.stdout
    assert "--to-topic" in done.stdout


def test_pipeline__job_failure_is_a_command_error():
    # Argument errors are found before a JVM starts.
    with pytest.raises(CommandError, match=r"pipeline archive failed \(exit status 2\)"):
        call_command("pipeline", "archive", "--", "--topic", "x")


def test_pipeline__unknown_job():
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("pipeline", "nope")


def test_pipeline__django_does_not_import_spark():
    check = (
        "import django, sys; django.setup(); "
        "import broker.management.commands.pipeline, mqsite.urls, broker.api; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'pyspark', 'pipeline'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
