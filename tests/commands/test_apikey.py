"""Console noun `apikey`."""

import pytest
from django.core.management.base import CommandError

from broker.core import errors, keys


def test_handle_create__secret_on_last_line(ferry):
    out = ferry("apikey", "create", "ci", "--allow=produce:orders.*", "--allow", "consume")
    lines = out.splitlines()
    assert lines[0] == "created API key ci"
    assert "  allow produce:orders.*" in lines
    assert "  allow consume:*" in lines
    principal = keys.authenticate(lines[-1])
    assert principal.name == "ci"
    assert keys.allows(principal, "orders.eu", "produce")
    assert not keys.allows(principal, "audit", "produce")


def test_handle_create__bad_permission(ferry):
    with pytest.raises(CommandError, match=r"^invalid_request: Unknown permission action 'write'"):
        ferry("apikey", "create", "ci", "--allow=write:orders")
    assert keys.list_api_keys(keys.CONSOLE) == []


def test_handle_create__allow_required(ferry):
    with pytest.raises(CommandError, match="--allow"):
        ferry("apikey", "create", "ci")


def test_handle_create__exists(ferry, key_factory):
    key_factory(name="ci")
    with pytest.raises(CommandError, match=r"^api_key_exists: "):
        ferry("apikey", "create", "ci", "--allow=admin")


def test_handle_list__table(ferry, key_factory):
    key_factory("produce:orders.*", "consume:audit", name="ci")
    key_factory(name="ops")
    keys.revoke_api_key(keys.CONSOLE, "ops")
    lines = ferry("apikey", "list").splitlines()
    assert lines[0].split() == [
        "NAME",
        "PREFIX",
        "PERMISSIONS",
        "REVOKED",
        "CREATED",
        "BY",
        "LAST",
        "USED",
    ]
    ci, ops = (line.split() for line in lines[1:])
    assert ci[0] == "ci"
    assert ci[1].startswith(keys.KEY_PREFIX)
    assert ci[2:5] == ["produce:orders.*", "consume:audit", "no"]
    assert ci[5] == "console"
    assert (ops[0], ops[2:4]) == ("ops", ["admin:*", "yes"])


def test_handle_revoke__key_stops_working(ferry, key_factory):
    _, secret = key_factory(name="ci")
    assert ferry("apikey", "revoke", "ci") == "revoked API key ci\n"
    with pytest.raises(errors.Unauthenticated):
        keys.authenticate(secret)


def test_handle_revoke__unknown(ferry):
    with pytest.raises(CommandError, match=r"^api_key_not_found: "):
        ferry("apikey", "revoke", "missing")
