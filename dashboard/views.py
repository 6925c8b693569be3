"""Dashboard views: read through the core, staff only (docs/architecture.md#dashboard)."""

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from broker.core import groups, keys


@staff_member_required
def overview(request: HttpRequest) -> HttpResponse:
    result = groups.overview(keys.CONSOLE)
    return render(request, "dashboard/overview.html", {"overview": result})
