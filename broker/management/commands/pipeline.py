"""`manage.py pipeline <job> [args]`: run a pipeline job in its own process (docs/pipeline.md).

The job is `python -m pipeline.jobs.<job>`: a client of Ferry over REST with its own Spark
JVM, so the Django process never imports Spark. The job's arguments pass through as given.
"""

import subprocess
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

JOBS = ("archive", "replay", "stats")
ROOT = Path(__file__).resolve().parents[3]


class Command(BaseCommand):
    help = "Run a pipeline job on Spark: archive, replay or stats (their --help says more)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", choices=JOBS)
        parser.add_argument("job_args", nargs="*", metavar="...", help="the job's arguments")

    def run_from_argv(self, argv: list[str]) -> None:
        # The job's own options (--topic, --help) are not this command's: pass them through.
        if len(argv) > 2 and argv[2] in JOBS and "--" not in argv:
            argv = [*argv[:3], "--", *argv[3:]]
        super().run_from_argv(argv)

    def handle(self, *args: Any, **options: Any) -> None:
        command = [sys.executable, "-m", f"pipeline.jobs.{options['job']}", *options["job_args"]]
        code = subprocess.call(command, cwd=ROOT)  # noqa: S603 -- our interpreter, a listed job
        if code:
            raise CommandError(f"pipeline {options['job']} failed (exit status {code})")
