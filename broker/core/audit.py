"""The audit log: who changed what, when, with which parameters and result (architecture.md#audit).

Every edge that changes data on an operator's behalf (dashboard, REST management endpoints,
console) wraps its one core call in `audited(...)`. The action runs in its own transaction, as
always; the entry is written afterwards in a short transaction of its own, so a refused action
is recorded too (with its error code) and the action's locks are never held for the log.
"""

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import transaction

from broker import models
from broker.core import errors, keys, log
from broker.core.records import Actor, AuditInfo, AuditPage, Principal

logger = logging.getLogger(__name__)

T = TypeVar("T")

SOURCES = ("dashboard", "api", "console")
MAX_PAGE = 500

# The model's column widths: longer text is cut rather than refused, the action already ran.
_WIDTHS = {"actor": 200, "target": 400, "client_ip": 64, "user_agent": 300}


def audited(
    actor: Actor,
    action: str,
    target: str,
    params: dict[str, Any],
    call: Callable[[], T],
    summarize: Callable[[T], dict[str, Any]] | None = None,
) -> T:
    """Run call() and record it: outcome "ok" (result from summarize) or the error's code."""
    try:
        value = call()
    except errors.BrokerError as exc:
        _record(actor, action, target, params, exc.code, {"message": exc.message})
        raise
    except Exception as exc:
        _record(actor, action, target, params, "error", {"message": type(exc).__name__})
        raise
    _record(actor, action, target, params, "ok", summarize(value) if summarize else {})
    return value


def _record(
    actor: Actor,
    action: str,
    target: str,
    params: dict[str, Any],
    outcome: str,
    result: dict[str, Any],
) -> None:
    try:
        with transaction.atomic(durable=True):
            models.AuditEntry.objects.create(
                at_ms=log.now_ms(),
                actor=actor.name[: _WIDTHS["actor"]],
                source=actor.source,
                action=action,
                target=target[: _WIDTHS["target"]],
                params=params,
                outcome=outcome,
                result=result,
                client_ip=actor.client_ip[: _WIDTHS["client_ip"]],
                user_agent=actor.user_agent[: _WIDTHS["user_agent"]],
            )
    except Exception:
        # The action has committed (or failed) already; losing its entry must not turn its
        # answer into an error, but it must be visible.
        logger.exception("could not write the audit entry for %s %s", action, target)


def _info(row: models.AuditEntry) -> AuditInfo:
    return AuditInfo(
        id=row.id,
        at_ms=row.at_ms,
        actor=row.actor,
        source=row.source,
        action=row.action,
        target=row.target,
        params=row.params,
        outcome=row.outcome,
        result=row.result,
        client_ip=row.client_ip,
        user_agent=row.user_agent,
    )


def list_audit(
    principal: Principal,
    *,
    actor: str | None = None,
    action: str | None = None,
    source: str | None = None,
    target_contains: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> AuditPage:
    """Audit entries, newest first, filtered; page with before_id."""
    keys.require_superuser(principal)
    if not 1 <= limit <= MAX_PAGE:
        raise errors.InvalidRequest(f"limit must be between 1 and {MAX_PAGE}.", limit=limit)
    if source is not None and source not in SOURCES:
        raise errors.InvalidRequest(f"source is one of {', '.join(SOURCES)}.", source=source)
    rows = models.AuditEntry.objects.order_by("-id")
    if actor:
        rows = rows.filter(actor=actor)
    if action:
        rows = rows.filter(action=action)
    if source:
        rows = rows.filter(source=source)
    if target_contains:
        rows = rows.filter(target__contains=target_contains)
    if before_id is not None:
        rows = rows.filter(id__lt=before_id)
    found = list(rows[: limit + 1])
    items = tuple(_info(row) for row in found[:limit])
    return AuditPage(items=items, next_before_id=items[-1].id if len(found) > limit else None)


def audit_actions() -> list[str]:
    """Every action name the log holds, sorted (for a filter's choices)."""
    return list(
        models.AuditEntry.objects.order_by("action").values_list("action", flat=True).distinct()
    )
