"""Fixtures for console tests: run `manage.py ferry ...` in process and capture its output."""

import io
from collections.abc import Callable

import pytest
from django.core.management import call_command


@pytest.fixture
def ferry(db: None) -> Callable[..., str]:
    """Run `ferry <args>` as call_command does; returns stdout (stderr is swallowed)."""

    def run(*args: str) -> str:
        stdout = io.StringIO()
        call_command("ferry", *args, stdout=stdout, stderr=io.StringIO())
        return stdout.getvalue()

    return run
