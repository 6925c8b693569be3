"""The audit log: every action from the console, REST and management commands, filterable."""

from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse

from broker.core import audit
from dashboard import access, pages

PAGE_SIZE = 50
FILTERS = ("actor", "action", "source", "target")


@access.console_view
def audit_list(request: HttpRequest) -> HttpResponse:
    filters = {name: request.GET.get(name, "").strip() for name in FILTERS}
    before = request.GET.get("before", "")
    context: dict[str, Any] = {
        "section": "audit",
        "filters": filters,
        "actions": audit.audit_actions(),
        "sources": audit.SOURCES,
    }
    page = audit.list_audit(
        access.principal(request),
        actor=filters["actor"] or None,
        action=filters["action"] or None,
        source=filters["source"] if filters["source"] in audit.SOURCES else None,
        target_contains=filters["target"] or None,
        before_id=int(before) if before.isdigit() else None,
        limit=PAGE_SIZE,
    )
    base = {k: v for k, v in filters.items() if v}
    context.update(
        items=page.items,
        next_url="?" + urlencode({**base, "before": page.next_before_id})
        if page.next_before_id
        else None,
        first_url="?" + urlencode(base) if before else None,
    )
    return pages.render(request, "console/audit.html", context)
