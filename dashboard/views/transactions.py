"""Transactions: the open ones with their age, every one by state; commit or roll back one."""

from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from broker.core import log, transactions
from dashboard import access, pages

PAGE_SIZE = 100


def _context(request: HttpRequest) -> dict[str, Any]:
    state = pages.text_param(request, "state") or "open"
    if state not in transactions.STATES:
        state = "open"
    now = log.now_ms()
    rows = transactions.list_transactions(access.principal(request), state, limit=PAGE_SIZE)
    return {
        "state": state,
        "states": transactions.STATES,
        # (transaction, age in ms, past its timeout)
        "items": [(t, now - t.created_ms, now > t.deadline_ms) for t in rows],
        "live_query": request.GET.urlencode(),
    }


@access.console_view
def transaction_list(request: HttpRequest) -> HttpResponse:
    context = _context(request)
    context["section"] = "transactions"
    return pages.render(request, "console/transactions.html", context)


@access.console_view
def transaction_live(request: HttpRequest) -> HttpResponse:
    return pages.render(request, "console/partials/transactions_live.html", _context(request))


def _back(request: HttpRequest) -> HttpResponse:
    state = request.POST.get("state_filter", "")
    return redirect(f"/transactions/?{urlencode({'state': state})}" if state else "/transactions/")


@access.console_operate
def transaction_commit(request: HttpRequest, id: int) -> HttpResponse:
    access.perform(
        request,
        "transaction.commit",
        str(id),
        {"id": id},
        lambda: transactions.commit_transaction(access.principal(request), id),
        lambda r: f"Committed transaction {id}: {r.transaction.messages} messages are visible.",
        lambda r: {"messages": r.transaction.messages},
    )
    return _back(request)


@access.console_operate
def transaction_rollback(request: HttpRequest, id: int) -> HttpResponse:
    access.perform(
        request,
        "transaction.rollback",
        str(id),
        {"id": id},
        lambda: transactions.rollback_transaction(access.principal(request), id),
        lambda t: f"Rolled back transaction {id}: {t.messages} messages discarded.",
        lambda t: {"messages": t.messages},
    )
    return _back(request)
