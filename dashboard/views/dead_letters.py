"""Dead letters by group and topic: inspect, redrive (one, selected, or all matching, as a
throttled background job after a dry-run count) and purge."""

from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from broker.core import console, errors, redrives, retries
from dashboard import access, pages

PAGE_SIZE = 50
DEFAULT_RATE_PER_SECOND = 500


def _filters(data: Any) -> dict[str, str | None]:
    return {
        "group": (data.get("group") or "").strip() or None,
        "topic": (data.get("topic") or "").strip() or None,
        "reason": (data.get("reason") or "").strip() or None,
    }


def _query(filters: dict[str, str | None], **extra: Any) -> str:
    return urlencode({k: v for k, v in {**filters, **extra}.items() if v not in (None, "")})


def _context(request: HttpRequest) -> dict[str, Any]:
    principal = access.principal(request)
    filters = _filters(request.GET)
    counts = console.dead_letter_counts(principal)
    group_totals: dict[str, int] = {}
    for c in counts:
        group_totals[c.group] = group_totals.get(c.group, 0) + c.count
    group = filters["group"] or next(iter(group_totals), None)
    filters["group"] = group
    context: dict[str, Any] = {
        "filters": filters,
        "counts": counts,
        "group_totals": sorted(group_totals.items()),
        "topics_of_group": [c for c in counts if c.group == group],
        "reasons": retries.REASONS,
        "items": (),
        "total": 0,
        "jobs": (),
        "live_query": request.GET.urlencode(),
    }
    if group is None:
        return context
    after = request.GET.get("after")
    try:
        page = retries.list_dead_letters(
            principal,
            group,
            topic_name=filters["topic"],
            reason=filters["reason"],
            after_id=pages.optional_int(after, "after") if after else None,
            limit=PAGE_SIZE,
        )
    except errors.GroupNotFound:
        context["missing_group"] = group
        return context
    context.update(
        items=page.items,
        total=page.total,
        jobs=redrives.list_redrives(principal, group, limit=5),
        next_url="?" + _query(filters, after=page.next_after_id) if page.next_after_id else None,
        first_url="?" + _query(filters) if after else None,
    )
    return context


@access.console_view
def dead_letter_list(request: HttpRequest) -> HttpResponse:
    context = _context(request)
    context["section"] = "dead-letters"
    context["default_rate"] = DEFAULT_RATE_PER_SECOND
    return pages.render(request, "console/dead_letters.html", context)


@access.console_view
def dead_letter_live(request: HttpRequest) -> HttpResponse:
    return pages.render(request, "console/partials/dead_letters_live.html", _context(request))


def _ids(request: HttpRequest) -> list[int] | None:
    """The ticked rows, or None for "every dead letter matching the filter"."""
    if request.POST.get("scope") != "selected":
        return None
    try:
        ids = [int(v) for v in request.POST.getlist("ids")]
    except ValueError:
        raise errors.InvalidRequest("The selection is not a list of dead-letter ids.") from None
    if not ids:
        raise errors.InvalidRequest("Tick at least one dead letter first.")
    return ids


@access.console_view
def redrive_count(request: HttpRequest) -> HttpResponse:
    """The dry run: how many dead letters a redrive (or purge) of this selection takes."""
    filters = _filters(request.GET)
    context: dict[str, Any] = {"filters": filters, "default_rate": DEFAULT_RATE_PER_SECOND}
    try:
        if filters["group"] is None:
            raise errors.InvalidRequest("Choose a group first.")
        context["count"] = redrives.count_redrive(
            access.principal(request),
            filters["group"],
            topic_name=filters["topic"],
            reason=filters["reason"],
        )
    except errors.BrokerError as exc:
        context["error"] = exc.message
    return pages.render(request, "console/partials/redrive_count.html", context)


def _back(filters: dict[str, str | None]) -> HttpResponse:
    return redirect("/dead-letters/?" + _query(filters))


@access.console_operate
def redrive_start(request: HttpRequest) -> HttpResponse:
    filters = _filters(request.POST)
    group = filters["group"] or ""
    try:
        ids = _ids(request)
        rate = pages.optional_int(request.POST.get("rate_per_second"), "rate_per_second")
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return _back(filters)
    if request.POST.get("scope") == "one" and request.POST.get("id"):
        one = int(request.POST["id"])
        access.perform(
            request,
            "dlq.redrive",
            group,
            {"ids": [one]},
            lambda: retries.redrive_dead_letters(access.principal(request), group, [one]),
            lambda r: (
                f"Redrove dead letter {one}."
                if r.redriven
                else f"Dead letter {one} was not redriven: retention removed its message, or "
                "the group polls without members and has read past it (reset its offsets)."
            ),
        )
        return _back(filters)
    access.perform(
        request,
        "dlq.redrive",
        group,
        {
            "ids": ids,
            "topic": filters["topic"],
            "reason": filters["reason"],
            "rate_per_second": rate or DEFAULT_RATE_PER_SECOND,
        },
        lambda: redrives.start_redrive(
            access.principal(request),
            group,
            ids,
            topic_name=filters["topic"],
            reason=filters["reason"],
            rate_per_second=rate or DEFAULT_RATE_PER_SECOND,
        ),
        lambda job: (
            f"Redrive job {job.id} started: {job.total:,} dead letters at up to "
            f"{job.rate_per_second:,} a second. Its progress shows below."
        ),
    )
    return _back(filters)


@access.console_operate
def dead_letter_purge(request: HttpRequest) -> HttpResponse:
    filters = _filters(request.POST)
    group = filters["group"] or ""
    try:
        ids = _ids(request)
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return _back(filters)
    access.perform(
        request,
        "dlq.purge",
        group,
        {"ids": ids, "topic": filters["topic"], "reason": filters["reason"]},
        lambda: retries.purge_dead_letters(
            access.principal(request),
            group,
            ids,
            topic_name=filters["topic"],
            reason=filters["reason"],
        ),
        lambda n: f"Purged {n:,} dead letters of {group}.",
        lambda n: {"purged": n},
    )
    return _back(filters)


@access.console_view
def redrive_progress(request: HttpRequest, id: int) -> HttpResponse:
    """One job's row; it polls itself every second while the job is queued or running."""
    job = redrives.get_redrive(access.principal(request), id)
    return pages.render(request, "console/partials/redrive_job.html", {"job": job})


@access.console_operate
def redrive_cancel(request: HttpRequest, id: int) -> HttpResponse:
    job = access.perform(
        request,
        "dlq.redrive_cancel",
        str(id),
        {"id": id},
        lambda: redrives.cancel_redrive(access.principal(request), id),
        lambda j: f"Redrive job {j.id} is {j.state}.",
    )
    return _back({"group": job.group if job else None, "topic": None, "reason": None})
