"""Console noun `bootstrap`."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from broker.core import keys


def secret_in(out):
    # No match fails the test with an AttributeError.
    return re.search(r"API key \(shown once\): (\S+)", out).group(1)  # type: ignore[union-attr]


def password_in(out):
    # No match fails the test with an AttributeError.
    return re.search(r"Dashboard login: admin / (\S+)", out).group(1)  # type: ignore[union-attr]


def test_handle__first_start(ferry):
    out = ferry("bootstrap")
    principal = keys.authenticate(secret_in(out))
    assert principal.name == "admin"
    assert keys.allows(principal, "any.topic", "admin")
    user = get_user_model().objects.get(username="admin")
    assert user.is_superuser
    assert user.is_staff
    assert user.check_password(password_in(out))


def test_handle__twice_creates_one_of_each(ferry):
    ferry("bootstrap")
    out = ferry("bootstrap")
    assert out == "Ferry is already set up: an API key and a superuser exist.\n"
    assert len(keys.list_api_keys(keys.CONSOLE)) == 1
    assert get_user_model().objects.filter(is_superuser=True).count() == 1


def test_handle__key_exists_adds_superuser_only(ferry, key_factory):
    key_factory("produce:orders", name="ci")
    out = ferry("bootstrap")
    assert "API key" not in out
    assert get_user_model().objects.get(username="admin").check_password(password_in(out))
    assert [k.name for k in keys.list_api_keys(keys.CONSOLE)] == ["ci"]


def test_handle__superuser_exists_adds_key_only(ferry):
    get_user_model().objects.create_superuser("root", email="", password="x")
    out = ferry("bootstrap")
    assert "Dashboard login" not in out
    assert keys.authenticate(secret_in(out)).name == "admin"
    assert not get_user_model().objects.filter(username="admin").exists()


def test_handle__admin_is_not_a_superuser(ferry):
    get_user_model().objects.create_user("admin", password="x")
    with pytest.raises(CommandError, match="exists but is not a superuser"):
        ferry("bootstrap")
