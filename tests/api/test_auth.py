"""REST edge tests for API keys: authentication and per-topic permissions at the endpoints."""

import pytest
from django.test import Client

from broker.core import keys

JSON = "application/json"
TOPICS = "/api/v1/topics"

UNAUTHENTICATED = pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="no-header"),
        pytest.param("Basic dXNlcjpwYXNz", id="not-bearer"),
        pytest.param("Bearer fry_unknown", id="unknown-key"),
    ],
)


def produce(client, topic):
    body = {"messages": [{"value": "hello"}]}
    return client.post(f"/api/v1/topics/{topic}/messages", body, content_type=JSON)


def fetch(client, topic):
    return client.get(f"/api/v1/topics/{topic}/partitions/0/messages")


def anonymous(authorization):
    return Client(HTTP_AUTHORIZATION=authorization) if authorization else Client()


@pytest.fixture
def shop(topic_factory):
    for name in ("orders.eu", "orders.us", "billing"):
        topic_factory(name)


@UNAUTHENTICATED
def test_list_topics__unauthenticated(shop, error_of, authorization):
    assert error_of(anonymous(authorization).get(TOPICS)) == (401, "unauthenticated")


@UNAUTHENTICATED
def test_fetch__unauthenticated(shop, error_of, authorization):
    # fetch is an async view: Ninja runs its authentication on a different path.
    assert error_of(fetch(anonymous(authorization), "orders.eu")) == (401, "unauthenticated")


def test_list_topics__revoked_key(key_factory, shop, console, error_of):
    _, secret = key_factory("admin:*", name="retired")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get(TOPICS).status_code == 200
    keys.revoke_api_key(console, "retired")

    response = client.get(TOPICS)

    assert error_of(response) == (401, "unauthenticated")


def test_produce__pattern_allows_matching_topic(client_factory, shop, end_offsets):
    response = produce(client_factory("produce:orders.*"), "orders.eu")

    assert response.status_code == 200
    assert end_offsets("orders.eu") == [1]


def test_produce__pattern_denies_other_topic(client_factory, shop, end_offsets, error_of):
    response = produce(client_factory("produce:orders.*"), "billing")

    assert error_of(response) == (403, "permission_denied")
    assert end_offsets("billing") == [0]


def test_fetch__produce_key_denied(client_factory, shop, error_of):
    response = fetch(client_factory("produce:orders.*"), "orders.eu")

    assert error_of(response) == (403, "permission_denied")


def test_create_topic__produce_key_denied(client_factory, shop, error_of):
    client = client_factory("produce:orders.*")

    response = client.post(TOPICS, {"name": "orders.asia"}, content_type=JSON)

    assert error_of(response) == (403, "permission_denied")
    assert "orders.asia" not in [t["name"] for t in client.get(TOPICS).json()]


def test_fetch__consume_key_allowed(client_factory, shop):
    response = fetch(client_factory("consume:*"), "billing")

    assert response.status_code == 200


def test_produce__consume_key_denied(client_factory, shop, end_offsets, error_of):
    response = produce(client_factory("consume:*"), "billing")

    assert error_of(response) == (403, "permission_denied")
    assert end_offsets("billing") == [0]


def test_list_topics__only_visible(client_factory, shop):
    response = client_factory("produce:orders.*").get(TOPICS)

    assert response.status_code == 200
    assert [t["name"] for t in response.json()] == ["orders.eu", "orders.us"]


def test_produce__admin_pattern_implies_produce(client_factory, shop):
    response = produce(client_factory("admin:orders.*"), "orders.us")

    assert response.status_code == 200


def test_fetch__admin_pattern_implies_consume(client_factory, shop):
    response = fetch(client_factory("admin:orders.*"), "orders.us")

    assert response.status_code == 200
