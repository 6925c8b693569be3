"""Consumer groups: the list with lag; one group: partitions, lag chart, reset, settings."""

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import redirect

from broker.core import assignment, console, errors, groups, history, log
from dashboard import access, pages

CHART_WINDOW_MS = 60 * 60 * 1000
SORTS = {
    "name": lambda row: row["info"].name,
    "lag": lambda row: row["lag"],
    "members": lambda row: row["info"].members,
}


@access.console_view
def group_list(request: HttpRequest) -> HttpResponse:
    principal = access.principal(request)
    search = pages.text_param(request, "q")
    rows = [
        {"info": g, "lag": g.lag}
        for g in console.list_group_summaries(principal)
        if not search or search.lower() in g.name.lower()
    ]
    sort = request.GET.get("sort", "name")
    rows.sort(key=SORTS.get(sort.lstrip("-"), SORTS["name"]), reverse=sort.startswith("-"))
    page = pages.paginate(request, rows)
    # Time-based lag only for the groups on this page: one estimate read per group.
    for row in page.items:
        estimates = history.lag_estimates(principal, row["info"].name)
        behind = [e.seconds_behind for e in estimates.values() if e.seconds_behind is not None]
        drains = [e.time_to_drain_s for e in estimates.values()]
        row["seconds_behind"] = max(behind) if behind else None
        row["time_to_drain_s"] = (
            None if not drains or any(d is None for d in drains) else max(d or 0 for d in drains)
        )
    return pages.render(
        request,
        "console/groups.html",
        {
            "section": "groups",
            "page": page,
            "q": search or "",
            "sort": sort,
            "sort_next": {c: f"-{c}" if sort == c else c for c in SORTS},
        },
    )


def _group_context(request: HttpRequest, name: str) -> dict[str, Any]:
    principal = access.principal(request)
    return {
        "group": groups.describe_group(principal, name),
        "estimates": history.lag_estimates(principal, name),
    }


@access.console_view
def group_detail(request: HttpRequest, name: str) -> HttpResponse:
    context = _group_context(request, name)
    context.update(
        section="groups",
        reset_targets=groups.RESET_TARGETS,
        strategies=assignment.STRATEGIES,
    )
    return pages.render(request, "console/group.html", context)


@access.console_view
def group_live(request: HttpRequest, name: str) -> HttpResponse:
    return pages.render(
        request, "console/partials/group_partitions.html", _group_context(request, name)
    )


@access.console_view
def group_series(request: HttpRequest, name: str) -> JsonResponse:
    """The lag history chart: total lag per topic the group reads, over the last hour."""
    since_ms = log.now_ms() - pages.int_param(
        request, "window_ms", CHART_WINDOW_MS, minimum=60_000, maximum=7 * 86_400_000
    )
    points = history.group_series(access.principal(request), name, None, since_ms)
    x = sorted({p.at_ms for p in points})
    by_topic: dict[str, dict[int, int]] = {}
    for p in points:
        by_topic.setdefault(p.topic, {})[p.at_ms] = p.lag
    series = [
        {"label": f"{topic} lag", "values": [lags.get(at) for at in x]}
        for topic, lags in sorted(by_topic.items())
    ]
    return JsonResponse({"x": [at / 1000 for at in x], "series": series})


def _reset_args(form: QueryDict) -> dict[str, Any]:
    """The reset form: a target and what it needs (a time, offsets per partition, a shift)."""
    to = form.get("to", "")
    args: dict[str, Any] = {"to": to}
    if to == "timestamp":
        args["timestamp_ms"] = pages.optional_int(form.get("timestamp_ms"), "timestamp_ms")
        if args["timestamp_ms"] is None:
            raise errors.InvalidRequest("Choose a time to reset to.")
    elif to == "offsets":
        args["offsets"] = pages.partition_offsets(form.get("offsets", ""))
        if not args["offsets"]:
            raise errors.InvalidRequest("Give at least one partition=offset.")
    elif to == "shift":
        args["shift_by"] = pages.optional_int(form.get("shift_by"), "shift_by")
        if args["shift_by"] is None:
            raise errors.InvalidRequest("Give the number of messages to shift by.")
    return args


@access.console_view
def reset_preview(request: HttpRequest, name: str) -> HttpResponse:
    """The dry run: per partition, where the committed offset is and where it would go."""
    topic = request.GET.get("topic", "")
    context: dict[str, Any] = {"group_name": name, "topic": topic}
    try:
        args = _reset_args(request.GET)
        context["rows"] = groups.preview_reset(access.principal(request), name, topic, **args)
        context["args"] = args
        context["force"] = request.GET.get("force") == "on"
        context["offsets_text"] = request.GET.get("offsets", "")
        context["moved"] = sum(abs(r.delta) for r in context["rows"])
    except errors.BrokerError as exc:
        context["error"] = exc.message
    return pages.render(request, "console/partials/reset_preview.html", context)


@access.console_operate
def group_reset(request: HttpRequest, name: str) -> HttpResponse:
    topic = request.POST.get("topic", "")
    try:
        args = _reset_args(request.POST)
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return redirect("dashboard:group", name=name)
    force = request.POST.get("force") == "on"
    access.perform(
        request,
        "group.reset",
        f"{name}/{topic}",
        {
            **args,
            "offsets": {str(k): v for k, v in args.get("offsets", {}).items()},
            "force": force,
        },
        lambda: groups.reset_offsets(access.principal(request), name, topic, force=force, **args),
        lambda r: f"Reset {name} on {topic}: committed total {r.committed_total:,}, lag {r.lag:,}.",
        lambda r: {"committed_total": r.committed_total, "lag": r.lag},
    )
    return redirect("dashboard:group", name=name)


@access.console_operate
def group_configure(request: HttpRequest, name: str) -> HttpResponse:
    try:
        delays_text = request.POST.get("retry_delays_ms", "").strip()
        params: dict[str, Any] = {
            "strategy": request.POST.get("strategy") or None,
            "session_timeout_ms": pages.optional_int(
                request.POST.get("session_timeout_ms"), "session_timeout_ms"
            ),
            "ack_deadline_ms": pages.optional_int(
                request.POST.get("ack_deadline_ms"), "ack_deadline_ms"
            ),
            "max_attempts": pages.optional_int(request.POST.get("max_attempts"), "max_attempts"),
            "ordered": request.POST.get("ordered") == "on",
            "retry_delays_ms": [
                int(pages.optional_int(d, "retry_delays_ms") or 0)
                for d in delays_text.split(",")
                if d.strip()
            ],
        }
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return redirect("dashboard:group", name=name)
    access.perform(
        request,
        "group.configure",
        name,
        params,
        lambda: groups.configure_group(access.principal(request), name, **params),
        lambda g: f"Saved the settings of {g.name}.",
    )
    return redirect("dashboard:group", name=name)


@access.console_operate
def group_delete(request: HttpRequest, name: str) -> HttpResponse:
    force = request.POST.get("force") == "on"
    done = access.perform(
        request,
        "group.delete",
        name,
        {"force": force},
        lambda: _deleted(access.principal(request), name, force),
        lambda _: f"Deleted group {name}.",
    )
    if done is None:
        return redirect("dashboard:group", name=name)
    return redirect("dashboard:groups")


def _deleted(principal: Any, name: str, force: bool) -> bool:
    """delete_group returns nothing; True lets perform() tell done from refused (None)."""
    groups.delete_group(principal, name, force=force)
    return True
