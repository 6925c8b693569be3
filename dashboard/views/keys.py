"""API keys: list with permissions, last use and creator; create (secret shown once), revoke."""

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from broker.core import errors, keys
from dashboard import access, pages


def _page(request: HttpRequest, **extra: Any) -> HttpResponse:
    rows = keys.list_api_keys(access.principal(request))
    rows.reverse()  # newest first
    if request.GET.get("revoked") != "show":
        rows = [k for k in rows if not k.revoked]
    context = {
        "section": "keys",
        "page": pages.paginate(request, rows),
        "show_revoked": request.GET.get("revoked") == "show",
        "actions": keys.ACTIONS,
        **extra,
    }
    return pages.render(request, "console/keys.html", context)


@access.console_view
def key_list(request: HttpRequest) -> HttpResponse:
    return _page(request)


@access.console_operate
def key_create(request: HttpRequest) -> HttpResponse:
    name = request.POST.get("name", "").strip()
    texts = [t.strip() for t in request.POST.get("permissions", "").replace("\n", ",").split(",")]
    try:
        permissions = [keys.parse_permission(t) for t in texts if t]
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return redirect("dashboard:keys")
    created = access.perform(
        request,
        "key.create",
        name,
        {"permissions": [str(p) for p in permissions]},
        lambda: keys.create_api_key(access.principal(request), name, permissions),
        lambda r: f"Created API key {r[0].name}. Copy its secret now: it is not shown again.",
        # The record only: the secret is never written anywhere.
        lambda r: {"id": r[0].id, "prefix": r[0].prefix},
    )
    if created is None:
        return redirect("dashboard:keys")
    # Rendered, not redirected: the secret must not travel through the session or a URL.
    response = _page(request, new_key=created[0], new_secret=created[1])
    response["Cache-Control"] = "no-store"
    return response


@access.console_operate
def key_revoke(request: HttpRequest) -> HttpResponse:
    name = request.POST.get("name", "")
    access.perform(
        request,
        "key.revoke",
        name,
        {},
        lambda: keys.revoke_api_key(access.principal(request), name),
        lambda k: f"Revoked API key {k.name}: every process refuses it within seconds.",
    )
    return redirect("dashboard:keys")
