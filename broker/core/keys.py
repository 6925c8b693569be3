"""API keys: hashing, authentication and the one permission check (docs/architecture.md#auth)."""

import fnmatch
import hashlib
import secrets
import threading
import time
from collections.abc import Iterable

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from broker import models
from broker import settings as ferry_settings
from broker.core import errors
from broker.core.records import ApiKeyInfo, Permission, Principal

ACTIONS = ("produce", "consume", "admin")
# admin on a pattern implies produce and consume on it.
_IMPLIED_BY = {"produce": {"produce", "admin"}, "consume": {"consume", "admin"}, "admin": {"admin"}}
KEY_PREFIX = "fry_"

CONSOLE = Principal(name="console", is_system=True)

# key hash -> (expires at, monotonic clock; principal): see cached_principal().
_cache: dict[str, tuple[float, Principal]] = {}
_cache_lock = threading.Lock()

# key id -> when it last authenticated (ms), since the last flush_last_used(): kept in memory
# so authenticating never writes; the per-process heartbeat flushes it.
_last_used: dict[int, int] = {}
_last_used_lock = threading.Lock()


def parse_permission(text: str) -> Permission:
    """Parse 'action:pattern', e.g. 'produce:orders.*'; a bare action means every topic."""
    action, _, pattern = text.partition(":")
    action = action.strip()
    pattern = pattern.strip() or "*"
    if action not in ACTIONS:
        raise errors.InvalidRequest(
            f"Unknown permission action {action!r}; use one of {', '.join(ACTIONS)}.",
            permission=text,
        )
    return Permission(action=action, pattern=pattern)


def allows(principal: Principal, topic: str, action: str) -> bool:
    """Whether principal may do action on the topic named topic."""
    if principal.is_system:
        return True
    granting = _IMPLIED_BY[action]
    return any(
        p.action in granting and fnmatch.fnmatchcase(topic, p.pattern)
        for p in principal.permissions
    )


def _pattern_regex(pattern: str) -> str | None:
    """An anchored regex, the same in Python and PostgreSQL, matching what fnmatchcase matches.

    None for a pattern with a character class ("[...]"): callers then match in Python.
    """
    if "[" in pattern:
        return None
    parts = []
    for char in pattern:
        if char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        elif char.isalnum() and char.isascii():
            parts.append(char)
        elif char in "\\^]":
            parts.append("\\" + char)
        else:
            # A bracket holds any other character literally, in both regex dialects.
            parts.append(f"[{char}]")
    return "^" + "".join(parts) + "$"


def topic_filter(principal: Principal, actions: Iterable[str] = ACTIONS, field: str = "name") -> Q:
    """The topics (by the name in `field`) principal may do one of actions on, as a query filter.

    Listings filter in SQL with it instead of loading every row; it may let through more than
    allows() (a pattern with a character class is not translated), never less, so callers that
    need exactness check allows() on what comes back.
    """
    if principal.is_system:
        return Q()
    granting = set().union(*(_IMPLIED_BY[a] for a in actions))
    found = Q(pk__in=[])
    for p in principal.permissions:
        if p.action not in granting:
            continue
        if p.pattern == "*":
            return Q()
        if not any(c in p.pattern for c in "*?["):
            found |= Q(**{field: p.pattern})
            continue
        regex = _pattern_regex(p.pattern)
        if regex is None:
            return Q()
        found |= Q(**{f"{field}__regex": regex})
    return found


def require(principal: Principal, topic: str, action: str) -> None:
    """Raise PermissionDenied unless principal may do action on topic."""
    if not allows(principal, topic, action):
        raise errors.PermissionDenied(
            f"This API key may not {action} on topic {topic!r}.", topic=topic, action=action
        )


def require_superuser(principal: Principal) -> None:
    """Managing keys and groups needs admin on every topic ('admin:*') or the console."""
    if principal.is_system or any(
        p.action == "admin" and p.pattern == "*" for p in principal.permissions
    ):
        return
    raise errors.PermissionDenied("Only an 'admin:*' key may manage API keys and groups.")


def actor_name(principal: Principal) -> str:
    """How the audit log and created_by name a principal: "key:<name>" for an API key."""
    return f"key:{principal.name}" if principal.key_id is not None else principal.name


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def authenticate(secret: str | None) -> Principal:
    """The principal for a bearer key; Unauthenticated for a missing, unknown or revoked key."""
    if not secret:
        raise errors.Unauthenticated()
    row = (
        models.ApiKey.objects.filter(key_hash=hash_key(secret), revoked_at__isnull=True)
        .values("id", "name", "permissions")
        .first()
    )
    if row is None:
        raise errors.Unauthenticated("The API key is unknown or revoked.")
    principal = Principal(
        name=row["name"],
        permissions=tuple(Permission(**p) for p in row["permissions"]),
        key_id=row["id"],
    )
    note_used(row["id"])
    ttl = ferry_settings.get("AUTH_CACHE_SECONDS")
    if ttl > 0:
        with _cache_lock:
            _cache[hash_key(secret)] = (time.monotonic() + ttl, principal)
    return principal


def cached_principal(secret: str | None) -> Principal | None:
    """The principal authenticate() returned for this key less than AUTH_CACHE_SECONDS ago.

    No database access, so async edges may call it on the event loop and skip a thread hop.
    A revocation in this process takes effect at once; in another, within AUTH_CACHE_SECONDS.
    """
    if not secret:
        return None
    entry = _cache.get(hash_key(secret))
    if entry is None or entry[0] < time.monotonic():
        return None
    if entry[1].key_id is not None:
        note_used(entry[1].key_id)
    return entry[1]


def note_used(key_id: int) -> None:
    """Remember that a key authenticated now; flush_last_used() writes it (no database here)."""
    now = int(time.time() * 1000)
    with _last_used_lock:
        _last_used[key_id] = now


def flush_last_used() -> int:
    """Write the remembered last-use times, at most one UPDATE per key; returns keys written."""
    with _last_used_lock:
        pending = dict(_last_used)
        _last_used.clear()
    if not pending:
        return 0
    written = 0
    with transaction.atomic(durable=True):
        for key_id, used_ms in sorted(pending.items()):
            # Never move it back: another process may have flushed a later use.
            written += (
                models.ApiKey.objects.filter(id=key_id)
                .filter(Q(last_used_ms__isnull=True) | Q(last_used_ms__lt=used_ms))
                .update(last_used_ms=used_ms)
            )
    return written


def _info(row: models.ApiKey) -> ApiKeyInfo:
    return ApiKeyInfo(
        id=row.id,
        name=row.name,
        prefix=row.prefix,
        permissions=tuple(Permission(**p) for p in row.permissions),
        created_at_ms=int(row.created_at.timestamp() * 1000),
        revoked=row.revoked_at is not None,
        created_by=row.created_by,
        last_used_ms=row.last_used_ms,
    )


def create_api_key(
    principal: Principal, name: str, permissions: Iterable[Permission]
) -> tuple[ApiKeyInfo, str]:
    """Create a key; returns its record and the secret, which is never stored nor shown again.

    created_by is actor_name(principal): "key:<name>" for an API key, else the principal's name
    ("console", or "user:<username>" for a dashboard principal named so).
    """
    require_superuser(principal)
    perms = list(permissions)
    if not name or len(name) > 200:
        raise errors.InvalidRequest("API key names are 1 to 200 characters.")
    if not perms:
        raise errors.InvalidRequest("An API key needs at least one permission.")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    try:
        with transaction.atomic(durable=True):
            row = models.ApiKey.objects.create(
                name=name,
                key_hash=hash_key(secret),
                prefix=secret[: len(KEY_PREFIX) + 6],
                permissions=[{"action": p.action, "pattern": p.pattern} for p in perms],
                created_by=actor_name(principal)[:200],
            )
    except IntegrityError:
        raise errors.ApiKeyExists(name=name) from None
    return _info(row), secret


def list_api_keys(principal: Principal) -> list[ApiKeyInfo]:
    """Every key, revoked ones included, oldest first."""
    require_superuser(principal)
    return [_info(row) for row in models.ApiKey.objects.order_by("id")]


def revoke_api_key(principal: Principal, name: str) -> ApiKeyInfo:
    """Revoke a key by name; every process refuses it within AUTH_CACHE_SECONDS."""
    require_superuser(principal)
    with transaction.atomic(durable=True):
        row = models.ApiKey.objects.select_for_update().filter(name=name).first()
        if row is None:
            raise errors.ApiKeyNotFound(name=name)
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
        with _cache_lock:
            _cache.clear()
    return _info(row)
