"""Topics: the list (search, sort, pages, create) and one topic (partitions, chart, settings)."""

from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse

from broker import settings as ferry_settings
from broker.core import console, errors, groups, history, log, membership, topics
from dashboard import access, pages

SORTS = {
    "name": lambda t: t.name,
    "partitions": lambda t: t.partition_count,
    "messages": lambda t: t.message_count,
    "bytes": lambda t: t.bytes_stored,
    "created": lambda t: t.created_at_ms,
}
SORT_CHOICES = [
    ("name", "Name"),
    ("-messages", "Most messages"),
    ("-bytes", "Largest"),
    ("-partitions", "Most partitions"),
    ("-created", "Newest"),
]
CHART_WINDOW_MS = 60 * 60 * 1000
# The topic chart draws the out rate of at most this many reading groups.
CHART_GROUPS = 5


@access.console_view
def topic_list(request: HttpRequest) -> HttpResponse:
    principal = access.principal(request)
    rows = topics.list_topics(principal)
    search = pages.text_param(request, "q")
    if search:
        rows = [t for t in rows if search.lower() in t.name.lower()]
    sort = request.GET.get("sort", "name")
    key = SORTS.get(sort.lstrip("-"), SORTS["name"])
    rows.sort(key=key, reverse=sort.startswith("-"))
    page = pages.paginate(request, rows)
    # Which groups read each topic and how far behind they are (AKHQ shows this; Kafka UI not).
    readers: dict[str, list[tuple[str, int]]] = {}
    for group, offsets in sorted(groups.list_group_totals(principal).items()):
        for t in offsets:
            readers.setdefault(t.topic, []).append((group, t.lag))
    return pages.render(
        request,
        "console/topics.html",
        {
            "section": "topics",
            "page": page,
            "rows": [(t, readers.get(t.name, [])) for t in page.items],
            "q": search or "",
            "sort": sort,
            "sort_choices": SORT_CHOICES,
            # A column heading sorts by it; a second click reverses.
            "sort_next": {c: f"-{c}" if sort == c else c for c in SORTS},
            "overflow_policies": topics.OVERFLOW_POLICIES,
            "deletions": topics.list_topic_deletions(principal),
        },
    )


def _limits(form: Any) -> dict[str, Any]:
    """The optional limits both the create and the settings forms carry."""
    return {
        "retention_ms": pages.optional_int(form.get("retention_ms"), "retention_ms"),
        "retention_bytes": pages.optional_int(form.get("retention_bytes"), "retention_bytes"),
        "capacity": pages.optional_int(form.get("capacity"), "capacity"),
        "message_ttl_ms": pages.optional_int(form.get("message_ttl_ms"), "message_ttl_ms"),
    }


@access.console_operate
def topic_create(request: HttpRequest) -> HttpResponse:
    name = request.POST.get("name", "").strip()
    try:
        params: dict[str, Any] = {
            "partitions": pages.optional_int(request.POST.get("partitions"), "partitions"),
            "max_message_bytes": pages.optional_int(
                request.POST.get("max_message_bytes"), "max_message_bytes"
            ),
            "overflow_policy": request.POST.get("overflow_policy") or "reject",
            "trace": request.POST.get("trace") == "on",
            **_limits(request.POST),
        }
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return redirect("dashboard:topics")
    created = access.perform(
        request,
        "topic.create",
        name,
        params,
        lambda: topics.create_topic(access.principal(request), name, **params),
        lambda t: f"Created topic {t.name} with {t.partition_count} partitions.",
    )
    if created is None:
        return redirect("dashboard:topics")
    return redirect("dashboard:topic", name=created.name)


def _topic_context(request: HttpRequest, name: str) -> dict[str, Any]:
    info = topics.describe_topic(access.principal(request), name)
    return {"topic": info}


@access.console_view
def topic_detail(request: HttpRequest, name: str) -> HttpResponse:
    principal = access.principal(request)
    context = _topic_context(request, name)
    readers = [
        (g, t) for g in console.list_group_summaries(principal) for t in g.topics if t.topic == name
    ]
    group_names = [g.name for g, _ in readers][:CHART_GROUPS]
    context.update(
        chart_query="?" + urlencode([("group", g) for g in group_names]) if group_names else "",
        section="topics",
        readers=readers,
        overflow_policies=topics.OVERFLOW_POLICIES,
        stats=console.pipeline_stats(principal, name),
        stats_topic=ferry_settings.get("STATS_TOPIC"),
    )
    return pages.render(request, "console/topic.html", context)


@access.console_view
def topic_live(request: HttpRequest, name: str) -> HttpResponse:
    return pages.render(
        request, "console/partials/topic_partitions.html", _topic_context(request, name)
    )


@access.console_view
def topic_series(request: HttpRequest, name: str) -> JsonResponse:
    """The in/out chart's data: appended per second, and each reading group's acks per second."""
    principal = access.principal(request)
    since_ms = log.now_ms() - pages.int_param(
        request, "window_ms", CHART_WINDOW_MS, minimum=60_000, maximum=7 * 86_400_000
    )
    points = history.topic_series(principal, name, since_ms)
    x = [p.at_ms for p in points]
    series = [{"label": "in / s", "values": [p.in_per_s for p in points]}]
    for group in pages.text_list(request, "group")[:CHART_GROUPS]:
        out = {g.at_ms: g.out_per_s for g in history.group_series(principal, group, name, since_ms)}
        series.append({"label": f"{group} out / s", "values": [out.get(at) for at in x]})
    return JsonResponse({"x": [at / 1000 for at in x], "series": series})


@access.console_operate
def topic_alter(request: HttpRequest, name: str) -> HttpResponse:
    try:
        params: dict[str, Any] = {
            "partitions": pages.optional_int(request.POST.get("partitions"), "partitions"),
            "max_message_bytes": pages.optional_int(
                request.POST.get("max_message_bytes"), "max_message_bytes"
            ),
            "overflow_policy": request.POST.get("overflow_policy") or None,
            "trace": request.POST.get("trace") == "on",
            **_limits(request.POST),
        }
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return redirect("dashboard:topic", name=name)
    access.perform(
        request,
        "topic.alter",
        name,
        params,
        lambda: membership.alter_topic(access.principal(request), name, **params),
        lambda t: f"Saved the settings of {t.name}.",
    )
    return redirect("dashboard:topic", name=name)


@access.console_operate
def topic_purge(request: HttpRequest, name: str) -> HttpResponse:
    """Purge everything, or with "up_to" (partition=offset, …) only what lies below those."""
    try:
        up_to = pages.partition_offsets(request.POST.get("up_to", "")) or None
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return redirect("dashboard:topic", name=name)
    access.perform(
        request,
        "topic.purge",
        name,
        {"up_to": {str(k): v for k, v in up_to.items()} if up_to else None},
        lambda: log.purge_topic(access.principal(request), name, up_to),
        lambda r: f"Purged {r.removed:,} messages from {name}.",
        lambda r: {"removed": r.removed},
    )
    return redirect("dashboard:topic", name=name)


@access.console_operate
def topic_delete(request: HttpRequest, name: str) -> HttpResponse:
    done = access.perform(
        request,
        "topic.delete",
        name,
        {},
        lambda: _deleted(topics.delete_topic, access.principal(request), name),
        lambda _: f"Deleted topic {name}.",
    )
    if done is None:
        return redirect("dashboard:topic", name=name)
    return redirect(reverse("dashboard:topics"))


def _deleted(delete: Any, *args: Any) -> bool:
    """Run a delete that returns nothing, so perform() can tell done (True) from refused (None)."""
    delete(*args)
    return True
