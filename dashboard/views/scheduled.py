"""Scheduled (delayed) messages by due time: filter, histogram, cancel, deliver now, reschedule."""

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from broker.core import errors, scheduling, topics
from dashboard import access, pages

PAGE_SIZE = 50


def _context(request: HttpRequest) -> dict[str, Any]:
    principal = access.principal(request)
    topic = pages.text_param(request, "topic")
    after_id = (
        pages.optional_int(request.GET.get("after"), "after") if request.GET.get("after") else None
    )
    rows = scheduling.list_all_scheduled(principal, topic, limit=PAGE_SIZE + 1, after_id=after_id)
    histogram = scheduling.due_histogram(principal, topic, buckets=24)
    peak = max((n for _, n in histogram), default=0)
    base = {"topic": topic} if topic else {}
    return {
        "topic": topic or "",
        "items": rows[:PAGE_SIZE],
        "total": scheduling.count_scheduled(principal, topic),
        # (bucket start, count, bar height %, start as a duration from the first bucket)
        "histogram": [
            (at, n, round(100 * n / peak) if peak else 0, at - histogram[0][0])
            for at, n in histogram
        ],
        "next_url": "?" + urlencode({**base, "after": rows[PAGE_SIZE - 1].id})
        if len(rows) > PAGE_SIZE
        else None,
        "first_url": "?" + urlencode(base) if after_id is not None else None,
        "live_query": request.GET.urlencode(),
    }


@access.console_view
def scheduled_list(request: HttpRequest) -> HttpResponse:
    context = _context(request)
    context.update(
        section="scheduled",
        topic_names=[t.name for t in topics.list_topics(access.principal(request))],
    )
    return pages.render(request, "console/scheduled.html", context)


@access.console_view
def scheduled_live(request: HttpRequest) -> HttpResponse:
    return pages.render(request, "console/partials/scheduled_live.html", _context(request))


def _back(request: HttpRequest) -> HttpResponse:
    topic = request.POST.get("topic_filter", "")
    return redirect(f"/scheduled/?{urlencode({'topic': topic})}" if topic else "/scheduled/")


@access.console_operate
def scheduled_cancel(request: HttpRequest, id: int) -> HttpResponse:
    access.perform(
        request,
        "scheduled.cancel",
        str(id),
        {"id": id},
        lambda: scheduling.cancel_scheduled(access.principal(request), id),
        lambda s: f"Cancelled scheduled message {s.id} on {s.topic}.",
    )
    return _back(request)


@access.console_operate
def scheduled_deliver(request: HttpRequest, id: int) -> HttpResponse:
    access.perform(
        request,
        "scheduled.deliver_now",
        str(id),
        {"id": id},
        lambda: scheduling.deliver_now(access.principal(request), id),
        lambda s: (
            f"Scheduled message {s.id} on {s.topic} is due now; it is delivered within a second."
        ),
    )
    return _back(request)


@access.console_operate
def scheduled_reschedule(request: HttpRequest, id: int) -> HttpResponse:
    try:
        due_ms = pages.optional_int(request.POST.get("due_ms"), "due_ms")
        if due_ms is None:
            typed = request.POST.get("at", "").strip()
            if not typed:
                raise errors.InvalidRequest("Choose the new due time.")
            moment = dt.datetime.fromisoformat(typed)
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=dt.UTC)
            due_ms = int(moment.timestamp() * 1000)
    except (errors.BrokerError, ValueError) as exc:
        access.flash_error(
            request,
            exc if isinstance(exc, errors.BrokerError) else errors.InvalidRequest("Not a time."),
        )
        return _back(request)
    access.perform(
        request,
        "scheduled.reschedule",
        str(id),
        {"id": id, "due_ms": due_ms},
        lambda: scheduling.reschedule_scheduled(access.principal(request), id, due_ms),
        lambda s: f"Rescheduled message {s.id} on {s.topic}.",
    )
    return _back(request)
