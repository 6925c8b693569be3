"""Console noun `produce`: append one message per input line, in batches (docs/console.md)."""

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

import orjson
import tqdm
from django.core.management.base import BaseCommand, CommandError

from broker.cli import arguments
from broker.core import errors, keys, log, records


def add_parser(nouns: "argparse._SubParsersAction[Any]") -> None:
    parser = nouns.add_parser(
        "produce",
        help="Append one message per line of stdin or --file (a JSON string, or JSON with --json).",
    )
    parser.add_argument("topic")
    parser.add_argument("--file", metavar="PATH", help="Read lines from this file, not stdin.")
    parser.add_argument(
        "--json",
        dest="json_lines",
        action="store_true",
        help="Each line is a JSON document, stored as that JSON value.",
    )
    parser.add_argument("--key", help="Message key (chooses the partition by hash).")
    parser.add_argument("--tag")
    parser.add_argument("--partition", type=int, metavar="P")
    parser.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="Repeatable."
    )
    delay = parser.add_mutually_exclusive_group()
    delay.add_argument(
        "--delay-ms", type=int, metavar="MS", help="Deliver every message this much later."
    )
    delay.add_argument(
        "--level",
        dest="delay_level",
        type=int,
        metavar="N",
        help="RocketMQ delay level 1..18 (1s 5s 10s 30s 1m … 2h).",
    )
    delay.add_argument(
        "--deliver-at-ms", type=int, metavar="T", help="Deliver at this time (ms since epoch)."
    )
    parser.add_argument(
        "--batch-size",
        type=arguments.positive_int,
        default=500,
        metavar="N",
        help="Messages per transaction (default 500).",
    )
    parser.set_defaults(handler=handle)


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    topic = options["topic"]
    produced = scheduled = duplicates = 0
    try:
        with open_lines(options["file"]) as lines:
            for batch in batches(lines, options):
                results = log.append_messages(keys.CONSOLE, topic, batch)
                produced += len(results)
                scheduled += sum(r.scheduled_id is not None for r in results)
                duplicates += sum(r.duplicate for r in results)
    except errors.BrokerError:
        if produced:
            command.stderr.write(
                f"{produced} messages were produced before the failing batch; "
                "nothing from the failing batch was stored."
            )
        raise
    summary = f"produced {produced} message{'' if produced == 1 else 's'} to {topic}"
    notes = []
    if scheduled:
        notes.append(f"{scheduled} scheduled")
    if duplicates:
        notes.append(f"{duplicates} duplicates")
    if notes:
        summary += f" ({', '.join(notes)})"
    command.stdout.write(summary)


def batches(lines: Iterator[str], options: dict[str, Any]) -> Iterator[list[records.NewMessage]]:
    """Messages in batches of --batch-size; a bad line raises before its batch is yielded."""
    headers = parse_headers(options["header"])
    batch: list[records.NewMessage] = []
    for number, line in enumerate(lines, start=1):
        value = parse_line(number, line.rstrip("\r\n"), options["json_lines"])
        if value is None:
            continue
        batch.append(
            records.NewMessage(
                value=value,
                is_json=True,
                key=options["key"],
                tag=options["tag"],
                headers=headers,
                partition=options["partition"],
                delay_ms=options["delay_ms"],
                deliver_at_ms=options["deliver_at_ms"],
                delay_level=options["delay_level"],
            )
        )
        if len(batch) == options["batch_size"]:
            yield batch
            batch = []
    if batch:
        yield batch


def parse_headers(pairs: list[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise errors.InvalidRequest(f"--header takes NAME=VALUE, got {pair!r}.")
        headers[name] = value
    return headers


def parse_line(number: int, line: str, json_lines: bool) -> bytes | None:
    """The stored value of one input line, or None for a blank line (skipped)."""
    if not json_lines:
        return orjson.dumps(line) if line else None
    if not line.strip():
        return None
    try:
        return orjson.dumps(orjson.loads(line))
    except orjson.JSONDecodeError as exc:
        raise errors.MalformedJson(f"Line {number} is not a JSON document: {exc}") from None
    except orjson.JSONEncodeError as exc:
        raise errors.InvalidMessage(f"Line {number} cannot be stored as JSON: {exc}") from None


@contextlib.contextmanager
def open_lines(path: str | None) -> Iterator[Iterator[str]]:
    """The input lines: stdin, or a file read with a progress bar by bytes on stderr."""
    if path is None:
        yield iter(sys.stdin)
        return
    with contextlib.ExitStack() as stack:
        try:
            file = stack.enter_context(open(path, "rb"))
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        # A pipe or device has no size: the bar then counts bytes without a total.
        size = os.fstat(file.fileno()).st_size or None
        bar = stack.enter_context(
            tqdm.tqdm(total=size, unit="B", unit_scale=True, desc=path, disable=None)
        )
        yield decoded(file, bar)


def decoded(file: BinaryIO, bar: tqdm.tqdm) -> Iterator[str]:
    for number, raw in enumerate(file, start=1):
        bar.update(len(raw))
        try:
            line = raw.decode()
        except UnicodeDecodeError:
            raise errors.InvalidMessage(f"Line {number} is not UTF-8 text.") from None
        yield line
