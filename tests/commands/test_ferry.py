"""The ferry command itself: dispatch and error mapping."""

import pytest
from django.core.management.base import CommandError


def test_handle__no_noun(ferry):
    with pytest.raises(CommandError, match="noun"):
        ferry()


def test_handle__unknown_noun(ferry):
    with pytest.raises(CommandError, match="invalid choice"):
        ferry("queues", "list")


def test_handle__broker_error_becomes_code_and_message(ferry):
    with pytest.raises(CommandError) as caught:
        ferry("topics", "describe", "missing")
    assert str(caught.value) == "topic_not_found: No topic named 'missing'."
