"""docs/console.md's examples, replayed in order through the ferry command.

Each `$ python manage.py ferry …` line is run as written (pipes, other environments and remote
mode are left out); its outcome must be the page's: an error where it shows a CommandError,
with that exact text, and a table with the page's header line where it shows one.
"""

import io
import re
import shlex
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

DOC = Path(__file__).resolve().parents[2] / "docs" / "console.md"
BLOCK = re.compile(r"```console\n(.*?)```", re.S)
COMMAND = "$ python manage.py ferry "

# Commands whose outcome depends on what the page's story did off-page (a client produced,
# time passed, a member consumed); only that they run is checked.
OFF_PAGE = {
    "topics trace orders 1 1",
    "topics purge orders --up-to 1:1",
    "topics purge orders --up-to 0:99",
    "messages show orders 1 1",
    "groups describe packing",
    "groups configure billing --mode broadcast",
    "dlq list billing --limit 1",
    "dlq list billing --after-id 1",
    "dlq redrive billing --id 2",
    "dlq redrive billing --id 7",
    "dlq purge billing --all --reason rejected",
    "scheduled cancel 5",
}


def runs() -> list[tuple[str, list[str]]]:
    """(command, the output lines the page shows for it), in page order."""
    found: list[tuple[str, list[str]]] = []
    for block in BLOCK.findall(DOC.read_text()):
        current: tuple[str, list[str]] | None = None
        for line in block.splitlines():
            if line.startswith("$ "):
                current = None
                # Not piped, and not a follower, which waits for messages the story produced.
                if line.startswith(COMMAND) and "|" not in line and "--follow" not in line:
                    current = (line.removeprefix(COMMAND), [])
                    found.append(current)
            elif current is not None:
                current[1].append(line)
    return found


def is_header(line: str) -> bool:
    return bool(re.fullmatch(r"[A-Z_]+( +[A-Z_ ]+)*", line.strip())) and "  " in line


@pytest.mark.django_db(transaction=True)
def test_console_doc__commands_answer_as_shown():
    mismatches = []
    commands = runs()
    assert {command for command, _ in commands} >= OFF_PAGE, "OFF_PAGE names a command gone"
    for command, shown in commands:
        out, err = io.StringIO(), io.StringIO()
        try:
            call_command("ferry", *shlex.split(command), stdout=out, stderr=err)
            error = None
        except CommandError as exc:
            error = f"CommandError: {exc}"
        except SystemExit as exc:
            error = f"exit {exc.code}"
        if command in OFF_PAGE:
            continue
        shown_error = next((line for line in shown if line.startswith("CommandError:")), None)
        if shown_error != error:
            mismatches.append(f"{command}: {error!r}, shown {shown_error!r}")
            continue
        if shown and is_header(shown[0]):
            real = out.getvalue().splitlines()
            if not real or real[0].split() != shown[0].split():
                mismatches.append(f"{command}: header {real[:1]}, shown {shown[0]!r}")
    assert not mismatches, "\n".join(mismatches)
