"""Fixtures for the REST edge tests: the error body check and the stored end offsets."""

from collections.abc import Callable

import pytest
from django.http import HttpResponse

from broker.core import keys, topics


@pytest.fixture
def error_of() -> Callable[[HttpResponse], tuple[int, str]]:
    """Check that a response carries exactly {"error": {"code", "message", "detail"}}.

    Returns (status, code), so a test reads `assert error_of(r) == (404, "topic_not_found")`.
    """

    def check(response: HttpResponse) -> tuple[int, str]:
        assert response["Content-Type"].startswith("application/json")
        body = response.json()  # type: ignore[attr-defined]  # the test client adds json()
        assert set(body) == {"error"}
        error = body["error"]
        assert set(error) == {"code", "message", "detail"}
        assert isinstance(error["message"], str)
        assert error["message"]
        assert isinstance(error["detail"], dict)
        return response.status_code, error["code"]

    return check


@pytest.fixture
def end_offsets(db: None) -> Callable[[str], list[int]]:
    """The end offset of each partition of a topic, read from the core (not through the API)."""

    def read(topic_name: str) -> list[int]:
        return [p.end_offset for p in topics.get_topic(keys.CONSOLE, topic_name).partitions]

    return read
