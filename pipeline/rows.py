"""DataFrame rows to Ferry messages, for the `ferry` sink (docs/pipeline.md#writing).

Pure: Arrow record batches in, `ferry_client.Message` chunks out. Columns: `value` (binary or
string: stored as raw bytes) or `value_json` (a string of JSON: stored as a JSON message), and
optionally `key`, `tag`, `headers` (map<string, string>), `partition`, `topic` and `id` (the
message id; without it each row gets `<prefix>-<row index>`); other columns are ignored, so a
DataFrame read from a topic can be written to another as it is.
"""

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from ferry_client import Message
from pipeline.options import OptionError

VALUE_COLUMNS = ("value_json", "value")
OPTIONAL_COLUMNS = ("key", "tag", "headers", "partition", "topic", "id")


def check_columns(names: Sequence[str], *, has_topic_option: bool) -> None:
    """Fail before any task runs when the DataFrame cannot be written."""
    if not set(VALUE_COLUMNS) & set(names):
        raise OptionError(
            "Writing to Ferry needs a 'value' column (binary or string) or a 'value_json' "
            f"column (JSON text); the DataFrame has {list(names)}."
        )
    if not has_topic_option and "topic" not in names:
        raise OptionError("Writing to Ferry needs the 'topic' option or a 'topic' column.")


def _value(value_json: str | None, value: bytes | str | None, row: str) -> Any:
    if value_json is not None:
        return json.loads(value_json)
    if value is None:
        raise ValueError(f"Row {row} has neither a value nor a value_json to send.")
    return value.encode() if isinstance(value, str) else value


def to_messages(batch: pa.RecordBatch, first_index: int, prefix: str) -> Iterator[Message]:
    """Each row as a Message, its id the row's `id` or `<prefix>-<row index>` (deterministic
    per task: a retried task sends the same rows in the same order)."""
    names = set(batch.schema.names)
    n = batch.num_rows
    columns = {
        name: batch.column(name).to_pylist() if name in names else [None] * n
        for name in (*VALUE_COLUMNS, *OPTIONAL_COLUMNS)
    }
    for i, (value_json, value, key, tag, headers, partition, given_id) in enumerate(
        zip(
            columns["value_json"],
            columns["value"],
            columns["key"],
            columns["tag"],
            columns["headers"],
            columns["partition"],
            columns["id"],
            strict=True,
        )
    ):
        row_id = given_id or f"{prefix}-{first_index + i}"
        yield Message(
            _value(value_json, value, row_id),
            key=key,
            tag=tag,
            headers=dict(headers) if headers else {},
            partition=partition,
            id=row_id,
        )


def messages(
    batches: Iterable[pa.RecordBatch], topic: str | None, batch_size: int, prefix: str
) -> Iterator[tuple[str, list[Message]]]:
    """(topic, up to batch_size messages) in row order; the `topic` option beats the column."""
    pending: dict[str, list[Message]] = {}
    index = 0
    for batch in batches:
        topics = (
            [topic] * batch.num_rows
            if topic is not None or "topic" not in batch.schema.names
            else batch.column("topic").to_pylist()
        )
        for row_topic, message in zip(topics, to_messages(batch, index, prefix), strict=True):
            if row_topic is None:
                raise ValueError(f"Row {message.id} has no topic to go to.")
            chunk = pending.setdefault(row_topic, [])
            chunk.append(message)
            if len(chunk) >= batch_size:
                yield row_topic, pending.pop(row_topic)
        index += batch.num_rows
    yield from pending.items()
