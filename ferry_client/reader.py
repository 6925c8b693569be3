"""Reader: a topic's log by offset, without a consumer group (docs/client.md#reading-by-offset).

What bulk readers such as the Spark data source (docs/pipeline.md) need: every partition's
start and end offsets in one request, and ranged fetches as JSON or as an Arrow IPC stream.
pyarrow is needed only for `fetch_arrow`, and imported only there.

Like the producer, each read is written once as an exchange (`read_offsets`, `read_page`,
`read_arrow`: the request, then the answer turned into records) and `Reader` is the blocking
shell that runs them on a `transport.Transport`; an asyncio reader would run the same ones on
an `AsyncTransport`.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ferry_client import transport

if TYPE_CHECKING:
    import pyarrow

ARROW_STREAM = "application/vnd.apache.arrow.stream"

Json = dict[str, Any]


@dataclass(frozen=True)
class PartitionOffsets:
    """A partition's start offset (first kept) and end offset (next to be written).

    `offset_for_timestamp`: the first offset at or after the asked time, else the end offset;
    None when no time was asked.
    """

    partition: int
    start_offset: int
    end_offset: int
    offset_for_timestamp: int | None = None


@dataclass(frozen=True)
class FetchPage:
    """One fetch of a partition: the messages as the JSON answer has them, and where next."""

    messages: list[Json]
    next_offset: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True)
class ArrowPage:
    """One fetch as an Arrow table (columns of docs/api.md's Arrow answer), and where next."""

    table: "pyarrow.Table"
    next_offset: int
    start_offset: int
    end_offset: int


def read_offsets(
    topic: str, timestamp_ms: int | None = None
) -> transport.Exchange[list[PartitionOffsets]]:
    """Every partition's start and end offsets (one request), by partition number."""
    body = yield transport.Request(
        "GET", f"/topics/{topic}/offsets", params={"timestamp": timestamp_ms}
    )
    return [
        PartitionOffsets(
            p["partition"], p["start_offset"], p["end_offset"], p.get("offset_for_timestamp")
        )
        for p in body["partitions"]
    ]


def _page_request(
    topic: str, partition: int, offset: int | None, limit: int, accept: str | None = None
) -> transport.Request:
    return transport.Request(
        "GET",
        f"/topics/{topic}/partitions/{partition}/messages",
        params={"offset": offset, "limit": limit},
        accept=accept,
    )


def read_page(
    topic: str, partition: int, offset: int | None = None, limit: int = 100
) -> transport.Exchange[FetchPage]:
    """At most `limit` messages of a partition from `offset` (default: its start offset)."""
    body = yield _page_request(topic, partition, offset, limit)
    return FetchPage(
        body["messages"], body["next_offset"], body["start_offset"], body["end_offset"]
    )


def read_arrow(
    topic: str, partition: int, offset: int | None = None, limit: int = 10_000
) -> transport.Exchange[ArrowPage]:
    """The same fetch as one Arrow table: the bulk format, several times cheaper to decode."""
    import pyarrow as pa  # optional: only Arrow reads need pyarrow

    content = yield _page_request(topic, partition, offset, limit, ARROW_STREAM)
    table = pa.ipc.open_stream(content).read_all()
    metadata = table.schema.metadata or {}
    return ArrowPage(
        table.replace_schema_metadata(None),
        int(metadata[b"next_offset"]),
        int(metadata[b"start_offset"]),
        int(metadata[b"end_offset"]),
    )


class Reader(transport.Client):
    """Read topics by partition and offset over REST (needs `consume` on the topic).

    Reads are retried on the next URL on connection errors, timeouts and 5xx answers.
    """

    def offsets(self, topic: str, timestamp_ms: int | None = None) -> list[PartitionOffsets]:
        """Every partition's start and end offsets (one request), by partition number."""
        return self._rest.run(read_offsets(topic, timestamp_ms))

    def fetch(
        self, topic: str, partition: int, offset: int | None = None, limit: int = 100
    ) -> FetchPage:
        """At most `limit` messages of a partition from `offset` (default: its start offset)."""
        return self._rest.run(read_page(topic, partition, offset, limit))

    def fetch_arrow(
        self, topic: str, partition: int, offset: int | None = None, limit: int = 10_000
    ) -> ArrowPage:
        """The same fetch as one Arrow table: the bulk format, several times cheaper to decode."""
        return self._rest.run(read_arrow(topic, partition, offset, limit))
