"""REST edge tests for error rendering: one body shape for every error, and request size limits."""

import pytest
from django.test import Client

from broker.core import log, records

JSON = "application/json"
TOPICS = "/api/v1/topics"
PRODUCE = "/api/v1/topics/full/messages"
FETCH = "/api/v1/topics/full/partitions/{}/messages"


def case(status, code, method, path, body=None, permissions="admin:*"):
    """One error a request provokes; permissions=None calls without a key."""
    return pytest.param(permissions, method, path, body, status, code, id=code)


ERRORS = [
    case(401, "unauthenticated", "get", TOPICS, permissions=None),
    case(403, "permission_denied", "post", TOPICS, {"name": "new"}, permissions="consume:*"),
    case(404, "topic_not_found", "get", "/api/v1/topics/nope"),
    case(404, "partition_not_found", "get", FETCH.format(2)),
    case(404, "group_not_found", "get", "/api/v1/groups/nope"),
    case(409, "topic_exists", "post", TOPICS, {"name": "full"}),
    case(409, "topic_full", "post", PRODUCE, {"messages": [{"value": 2, "partition": 0}]}),
    case(409, "offset_out_of_range", "get", FETCH.format(0) + "?offset=9"),
    case(413, "message_too_large", "post", PRODUCE, {"messages": [{"value": "x" * 200}]}),
    case(422, "validation_error", "post", TOPICS, {"name": "new", "partitions": "many"}),
    case(422, "validation_error", "post", TOPICS, {"name": "new", "partitons": 2}),
    case(400, "malformed_json", "post", TOPICS, b"{bad"),
    case(400, "invalid_topic_name", "post", TOPICS, {"name": "bad name!"}),
    case(400, "invalid_partition_count", "patch", "/api/v1/topics/full", {"partitions": 1}),
    case(400, "invalid_request", "get", FETCH.format(0) + "?limit=0"),
]


@pytest.fixture
def full(topic_factory, console):
    """Topic "full": two partitions, capacity 1, 100-byte messages, partition 0 at capacity."""
    topic_factory("full", partitions=2, capacity=1, max_message_bytes=100)
    log.append_messages(console, "full", [records.NewMessage(value=b"1", partition=0)])


def call(client, method, path, body):
    if body is None:
        return getattr(client, method)(path)
    return getattr(client, method)(path, body, content_type=JSON)


@pytest.mark.parametrize(("permissions", "method", "path", "body", "status", "code"), ERRORS)
def test_every_endpoint__error_body_shape(
    full, client_factory, error_of, permissions, method, path, body, status, code
):
    client = client_factory(permissions) if permissions else Client()

    assert error_of(call(client, method, path, body)) == (status, code)


def test_produce__request_too_large(api_client, topic_factory, end_offsets, error_of, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    topic_factory("orders")
    body = {"messages": [{"value": "x" * 600}, {"value": "y" * 600}]}

    response = api_client.post("/api/v1/topics/orders/messages", body, content_type=JSON)

    assert error_of(response) == (413, "request_too_large")
    assert end_offsets("orders") == [0]


def test_unknown_path__json_error(api_client, error_of):
    response = api_client.get("/api/v1/nope")

    assert error_of(response)[0] == 404


def test_list_topics__method_not_allowed(api_client, error_of):
    response = api_client.put(TOPICS, {"name": "orders"}, content_type=JSON)

    assert error_of(response)[0] == 405


@pytest.mark.parametrize(
    ("partition", "query"),
    [
        pytest.param(2**64, {}, id="partition"),
        pytest.param(0, {"offset": 2**64}, id="offset"),
        pytest.param(0, {"offset": -(2**63) - 1}, id="negative-offset"),
        pytest.param(0, {"limit": 2**64}, id="limit"),
        pytest.param(0, {"max_wait_ms": 2**64}, id="max-wait-ms"),
    ],
)
def test_fetch__integer_beyond_64_bits(api_client, full, error_of, partition, query):
    response = api_client.get(FETCH.format(partition), query)

    assert 400 <= error_of(response)[0] < 500


def test_error_response__integer_beyond_64_bits_in_detail():
    from broker.api import error_response

    response = error_response("invalid_request", "too big", {"value": 2**70})

    assert response.status_code == 400
    assert str(2**70) in response.content.decode()
