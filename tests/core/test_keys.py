import pytest

from broker import models
from broker.core import errors, keys


def test_create_api_key__hashed_and_authenticates(db, console):
    info, secret = keys.create_api_key(console, "svc", [keys.parse_permission("produce:orders.*")])
    row = models.ApiKey.objects.get(name="svc")
    assert secret.startswith("fry_")
    assert secret not in (row.key_hash, row.prefix)
    principal = keys.authenticate(secret)
    assert (principal.name, principal.key_id) == ("svc", info.id)


def test_authenticate__unknown_revoked_missing(db, console):
    _, secret = keys.create_api_key(console, "svc", [keys.parse_permission("consume")])
    keys.revoke_api_key(console, "svc")
    for token in (secret, "fry_nope", "", None):
        with pytest.raises(errors.Unauthenticated):
            keys.authenticate(token)


def test_parse_permission__forms():
    assert str(keys.parse_permission("produce:orders.*")) == "produce:orders.*"
    assert str(keys.parse_permission("consume")) == "consume:*"
    with pytest.raises(errors.InvalidRequest):
        keys.parse_permission("write:*")


def test_allows__patterns_and_admin(db, key_factory):
    principal, _ = key_factory("produce:orders.*", "admin:team-a.*")
    assert keys.allows(principal, "orders.eu", "produce")
    assert not keys.allows(principal, "orders.eu", "consume")
    assert not keys.allows(principal, "billing", "produce")
    assert keys.allows(principal, "team-a.x", "consume")
    assert keys.allows(keys.CONSOLE, "anything", "admin")


def test_create_api_key__only_superuser_keys(db, key_factory):
    limited, _ = key_factory("admin:orders.*")
    with pytest.raises(errors.PermissionDenied):
        keys.create_api_key(limited, "x", [keys.parse_permission("consume")])
    root, _ = key_factory("admin:*")
    keys.create_api_key(root, "x", [keys.parse_permission("consume")])
    with pytest.raises(errors.ApiKeyExists):
        keys.create_api_key(root, "x", [keys.parse_permission("consume")])
    with pytest.raises(errors.InvalidRequest):
        keys.create_api_key(root, "y", [])
    with pytest.raises(errors.ApiKeyNotFound):
        keys.revoke_api_key(root, "missing")


def test_cached_principal__remembers_then_forgets(db, console, settings, monkeypatch):
    settings.FERRY_AUTH_CACHE_SECONDS = 5
    _, secret = keys.create_api_key(console, "svc", [keys.parse_permission("consume")])
    assert keys.cached_principal(secret) is None
    principal = keys.authenticate(secret)
    assert keys.cached_principal(secret) == principal
    # keys' own `time` import, which strict broker/core does not re-export.
    now = keys.time.monotonic()  # type: ignore[attr-defined]
    monkeypatch.setattr(keys.time, "monotonic", lambda: now + 6)  # type: ignore[attr-defined]
    assert keys.cached_principal(secret) is None


def test_revoke_api_key__clears_this_process_cache(db, console, settings):
    settings.FERRY_AUTH_CACHE_SECONDS = 60
    _, secret = keys.create_api_key(console, "svc", [keys.parse_permission("consume")])
    keys.authenticate(secret)
    keys.revoke_api_key(console, "svc")
    assert keys.cached_principal(secret) is None
    with pytest.raises(errors.Unauthenticated):
        keys.authenticate(secret)


def test_create_api_key__records_creator(db, console, key_factory):
    info, _ = keys.create_api_key(console, "by-console", [keys.parse_permission("produce:*")])
    assert (info.created_by, info.last_used_ms) == ("console", None)
    admin, _ = key_factory("admin:*", name="root")
    info, _ = keys.create_api_key(admin, "by-key", [keys.parse_permission("produce:*")])
    assert info.created_by == "key:root"


def test_flush_last_used__written_once_per_key(db, console, settings, django_assert_num_queries):
    settings.FERRY_AUTH_CACHE_SECONDS = 60
    keys.flush_last_used()
    _, secret = keys.create_api_key(console, "k", [keys.parse_permission("produce:*")])
    keys.authenticate(secret)
    assert keys.cached_principal(secret) is not None
    assert models.ApiKey.objects.get().last_used_ms is None  # nothing written on the hot path
    with django_assert_num_queries(3):  # savepoint, one UPDATE, release
        assert keys.flush_last_used() == 1
    used = models.ApiKey.objects.get().last_used_ms
    assert used is not None
    assert keys.list_api_keys(console)[0].last_used_ms == used
    assert keys.flush_last_used() == 0
