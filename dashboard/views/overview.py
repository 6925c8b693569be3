"""The overview: totals, topics, groups, rates, broker processes and background jobs (live)."""

from typing import Any

from django.http import HttpRequest, HttpResponse

from broker.core import console, groups, history, processes, topics
from dashboard import access, pages

OVERVIEW_ROWS = 15


def _context(request: HttpRequest) -> dict[str, Any]:
    principal = access.principal(request)
    rates = history.rates(principal)
    # The busiest topics and the groups furthest behind; the lists pages hold the rest. Group
    # figures are totals summed in SQL (list_group_totals), not every partition's row.
    busiest = sorted(topics.list_topics(principal), key=lambda t: (-t.message_count, t.name))
    behind = sorted(
        (t for rows in groups.list_group_totals(principal).values() for t in rows),
        key=lambda g: (-g.lag, g.group, g.topic),
    )
    return {
        "summary": console.summary(principal),
        "topics": [
            {"info": t, "in_per_s": rates.in_per_s.get(t.name, 0.0)}
            for t in busiest[:OVERVIEW_ROWS]
        ],
        "more_topics": max(0, len(busiest) - OVERVIEW_ROWS),
        "groups": [
            {"offsets": g, "out_per_s": rates.out_per_s.get((g.group, g.topic), 0.0)}
            for g in behind[:OVERVIEW_ROWS]
        ],
        "more_groups": max(0, len(behind) - OVERVIEW_ROWS),
        "rates": rates,
        "processes": processes.list_processes(principal),
        "jobs": console.job_states(),
    }


@access.console_view
def overview(request: HttpRequest) -> HttpResponse:
    context = _context(request)
    context["section"] = "overview"
    return pages.render(request, "console/overview.html", context)


@access.console_view
def overview_live(request: HttpRequest) -> HttpResponse:
    return pages.render(request, "console/partials/overview_live.html", _context(request))
