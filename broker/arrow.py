"""Fetch answers as an Arrow IPC stream, the bulk read format (docs/api.md, docs/pipeline.md).

`GET /topics/{name}/partitions/{p}/messages` answers this instead of JSON when the request
asks for it with `Accept: application/vnd.apache.arrow.stream`. One record batch holds the
messages, column for column the fields of the JSON answer; the schema's metadata carries the
answer's offsets. Values go out as the stored bytes, never parsed.
"""

from collections.abc import Sequence

import orjson
import pyarrow as pa

from broker.core.records import FetchResult, StoredMessage

MEDIA_TYPE = "application/vnd.apache.arrow.stream"

HEADERS_TYPE = pa.map_(pa.string(), pa.string())

# The JSON answer's message fields, except that `value` is always the stored bytes (the JSON
# text for a JSON message) and `is_json` tells which it is (JSON: `value`, else `value_b64`).
MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp_ms", pa.int64(), nullable=False),
        pa.field("key", pa.string()),
        pa.field("tag", pa.string()),
        pa.field("headers", HEADERS_TYPE, nullable=False),
        pa.field("id", pa.string()),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("is_json", pa.bool_(), nullable=False),
    ]
)


def accepts_arrow(accept: str) -> bool:
    """Whether an Accept header asks for the Arrow stream (a plain substring test suffices:
    no other media type we serve contains it)."""
    return MEDIA_TYPE in accept


def _headers(headers_json: Sequence[str]) -> list[list[tuple[str, str]]]:
    # Most messages have no headers: skip the parse for the stored "{}".
    return [[] if h == "{}" else list(orjson.loads(h).items()) for h in headers_json]


def messages_batch(messages: Sequence[StoredMessage]) -> pa.RecordBatch:
    """The messages as one record batch of MESSAGE_SCHEMA."""
    if not messages:
        return pa.RecordBatch.from_pylist([], schema=MESSAGE_SCHEMA)
    partition, offset, ts, key, tag, headers, value, is_json, client_id = zip(
        *messages, strict=True
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(partition, pa.int32()),
            pa.array(offset, pa.int64()),
            pa.array(ts, pa.int64()),
            pa.array(key, pa.string()),
            pa.array(tag, pa.string()),
            pa.array(_headers(headers), HEADERS_TYPE),
            pa.array(client_id, pa.string()),
            pa.array(value, pa.binary()),
            pa.array(is_json, pa.bool_()),
        ],
        schema=MESSAGE_SCHEMA,
    )


def fetch_stream(result: FetchResult) -> bytes:
    """A fetch answer as an Arrow IPC stream: one batch; the offsets in the schema metadata."""
    metadata = {
        b"next_offset": str(result.next_offset).encode(),
        b"start_offset": str(result.start_offset).encode(),
        b"end_offset": str(result.end_offset).encode(),
    }
    schema = MESSAGE_SCHEMA.with_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(messages_batch(result.messages).replace_schema_metadata(metadata))
    return bytes(sink.getvalue())
