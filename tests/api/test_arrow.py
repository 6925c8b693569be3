"""The fetch endpoint's Arrow IPC answer (broker/arrow.py) against its JSON answer."""

import base64

import orjson
import pyarrow as pa

from broker import arrow

JSON = "application/json"


def produce(client, topic, *messages):
    response = client.post(
        f"/api/v1/topics/{topic}/messages", {"messages": messages}, content_type=JSON
    )
    assert response.status_code == 200


def fetch(client, topic, partition=0, accept=JSON, **params):
    return client.get(
        f"/api/v1/topics/{topic}/partitions/{partition}/messages", params, HTTP_ACCEPT=accept
    )


def as_json_messages(table: pa.Table) -> list[dict]:
    """The Arrow rows in the JSON answer's shape."""
    out = []
    for row in table.to_pylist():
        value = row.pop("value")
        if row.pop("is_json"):
            row["value"] = orjson.loads(value)
        else:
            row["value_b64"] = base64.b64encode(value).decode()
        row["headers"] = dict(row["headers"])
        out.append(row)
    return out


def test_fetch__arrow_equals_json(api_client, topic_factory):
    topic_factory("mixed", partitions=2)
    produce(
        api_client,
        "mixed",
        {"value": {"order": 1, "ü": [1.5, None]}, "key": "k", "tag": "t", "partition": 1},
        {"value_b64": base64.b64encode(b"\x00\xff").decode(), "partition": 1, "id": "m-2"},
        {"value": "text", "headers": {"a": "1", "b": "2"}, "partition": 1},
        {"value": 3, "partition": 1},
    )

    as_json = fetch(api_client, "mixed", 1, offset=1, limit=10).json()
    response = fetch(api_client, "mixed", 1, accept=arrow.MEDIA_TYPE, offset=1, limit=10)

    assert response.status_code == 200
    assert response["Content-Type"] == arrow.MEDIA_TYPE
    table = pa.ipc.open_stream(response.content).read_all()
    assert table.schema.equals(arrow.MESSAGE_SCHEMA)
    assert as_json_messages(table) == as_json["messages"]
    metadata = table.schema.metadata
    assert {k.decode(): int(v) for k, v in metadata.items()} == {
        "next_offset": as_json["next_offset"],
        "start_offset": as_json["start_offset"],
        "end_offset": as_json["end_offset"],
    }


def test_fetch__arrow_at_end_is_empty(api_client, topic_factory):
    topic_factory("quiet")

    response = fetch(api_client, "quiet", accept=arrow.MEDIA_TYPE)

    table = pa.ipc.open_stream(response.content).read_all()
    assert table.num_rows == 0
    assert table.schema.metadata[b"next_offset"] == b"0"


def test_fetch__arrow_errors_stay_json(api_client, topic_factory, error_of):
    topic_factory("orders")

    response = fetch(api_client, "orders", 3, accept=arrow.MEDIA_TYPE)

    assert error_of(response) == (404, "partition_not_found")


def test_fetch__json_unless_asked(api_client, topic_factory):
    topic_factory("orders")

    response = fetch(api_client, "orders", accept="*/*")

    assert response["Content-Type"].startswith(JSON)
