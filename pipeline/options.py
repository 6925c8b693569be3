"""The `ferry` data source's options: parsed and checked once, with errors that say what to fix.

Pure: no Spark, no network (docs/pipeline.md#options). Spark hands options over as a
case-insensitive mapping of strings; everything here takes such a mapping.
"""

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

# Kafka's conventions in offset JSON: -2 is a partition's earliest offset, -1 its latest.
EARLIEST = -2
LATEST = -1

# The broker answers at most this many messages per fetch and takes as many per produce.
MAX_FETCH_SIZE = 10_000
MAX_BATCH_SIZE = 10_000

# {"topic": {"partition": offset}}: partition numbers are strings, as JSON keeps them.
Offsets = dict[str, dict[str, int]]


class OptionError(ValueError):
    """A `ferry` data source option is missing or wrong; the message names it and the fix."""


# What a startingOffsets / endingOffsets option says: "earliest", "latest", or JSON.
OffsetSpec = str | Offsets


@dataclass(frozen=True)
class Connection:
    """Where the broker is and how to talk to it: what read and write tasks need."""

    url: str
    api_key: str
    timeout_s: float
    # A CA certificate (PEM) to trust for an https:// url: a private CA, or a self-signed one.
    ca_file: str | None = None

    @property
    def verify(self) -> str | bool:
        """ferry_client's `verify`: the CA file, or the default trust store."""
        return self.ca_file or True


@dataclass(frozen=True)
class ReadOptions:
    connection: Connection
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    ending_timestamp_ms: int | None
    max_offsets_per_trigger: int | None
    max_rows_per_partition: int
    fetch_size: int
    fail_on_data_loss: bool


@dataclass(frozen=True)
class WriteOptions:
    connection: Connection
    topic: str | None
    batch_size: int
    write_id: str | None


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name)
    if value is None or str(value).strip() == "":
        return None
    return str(value).strip()


def _int(options: Mapping[str, str], name: str, default: int | None, low: int, high: int) -> int:
    raw = _get(options, name)
    if raw is None:
        if default is None:
            raise OptionError(f"Option {name!r} is required.")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"Option {name!r} must be an integer, not {raw!r}.") from None
    if not low <= value <= high:
        raise OptionError(f"Option {name!r} must be between {low} and {high}, not {value}.")
    return value


def _optional_int(options: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    return None if _get(options, name) is None else _int(options, name, None, low, high)


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.lower() in {"true", "1", "yes"}:
        return True
    if raw.lower() in {"false", "0", "no"}:
        return False
    raise OptionError(f"Option {name!r} must be true or false, not {raw!r}.")


def connection(options: Mapping[str, str]) -> Connection:
    url = _get(options, "url")
    if url is None:
        raise OptionError("Option 'url' is required: the broker's base URL, http://host:8000.")
    if not url.startswith(("http://", "https://")):
        raise OptionError(f"Option 'url' must start with http:// or https://, not {url!r}.")
    api_key = _get(options, "apiKey")
    if api_key is None:
        raise OptionError("Option 'apiKey' is required: a Ferry API key (fry_...).")
    timeout_s = _int(options, "timeout", 30, 1, 3600)
    ca_file = _get(options, "caFile")
    if ca_file is not None and not os.path.isfile(ca_file):
        # Checked on the driver, where the mistake is cheapest; executors read the same path.
        raise OptionError(f"Option 'caFile' names no file: {ca_file!r}.")
    return Connection(url, api_key, float(timeout_s), ca_file)


def _is_position(partition: object, offset: object) -> bool:
    """A partition number and an offset, -2 (earliest) or -1 (latest)."""
    is_int = isinstance(offset, int) and not isinstance(offset, bool)
    return str(partition).isdigit() and is_int and offset >= EARLIEST  # type: ignore[operator]


def offset_spec(options: Mapping[str, str], name: str, default: str) -> OffsetSpec:
    """'earliest', 'latest', or {"topic": {"partition": offset}} (-2 earliest, -1 latest)."""
    raw = _get(options, name) or default
    if raw.lower() in {"earliest", "latest"}:
        return raw.lower()
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    ok = isinstance(parsed, dict) and all(
        isinstance(parts, dict) and all(_is_position(p, o) for p, o in parts.items())
        for parts in parsed.values()
    )
    if not ok or not isinstance(parsed, dict):
        raise OptionError(
            f"Option {name!r} must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 42, "1": -2}}}} (-2: earliest, -1: latest), not {raw!r}.'
        )
    return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}


def topics(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = _get(options, "topic")
    if raw is None:
        raise OptionError("Option 'topic' is required: a topic name, or several, comma-separated.")
    names = tuple(t.strip() for t in raw.split(",") if t.strip())
    return names


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Every read option, checked; streaming reads start at the latest offsets by default."""
    names = topics(options)
    starting = offset_spec(options, "startingOffsets", "latest" if streaming else "earliest")
    ending = offset_spec(options, "endingOffsets", "latest")
    for name in ("endingOffsets", "endingTimestamp"):
        if streaming and _get(options, name) is not None:
            raise OptionError(f"Option {name!r} is for batch reads; a stream has no end.")
    if ending == "earliest":
        raise OptionError("Option 'endingOffsets' cannot be 'earliest'.")
    for spec, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
        if isinstance(spec, dict) and set(spec) - set(names):
            unknown = sorted(set(spec) - set(names))
            raise OptionError(f"Option {name!r} names topics not in 'topic': {unknown}.")
    max_per_trigger = _optional_int(options, "maxOffsetsPerTrigger", 1, 2**62)
    if max_per_trigger is not None and not streaming:
        raise OptionError("Option 'maxOffsetsPerTrigger' is for streaming reads.")
    return ReadOptions(
        connection=connection(options),
        topics=names,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=_optional_int(options, "startingTimestamp", 0, 2**62),
        ending_timestamp_ms=_optional_int(options, "endingTimestamp", 0, 2**62),
        max_offsets_per_trigger=max_per_trigger,
        max_rows_per_partition=_int(options, "maxRowsPerPartition", 1_000_000, 1, 2**62),
        fetch_size=_int(options, "fetchSize", MAX_FETCH_SIZE, 1, MAX_FETCH_SIZE),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    return WriteOptions(
        connection=connection(options),
        topic=_get(options, "topic"),
        batch_size=_int(options, "batchSize", 1000, 1, MAX_BATCH_SIZE),
        write_id=_get(options, "writeId"),
    )
