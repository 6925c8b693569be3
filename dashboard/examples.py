"""Example pages that use the browser client (static/ferry.js); see docs/browser.md.

They need no login: the page itself holds nothing, and the browser talks to the broker with
the API key the visitor types in (or passes in the fragment, #token=, which never reaches the
server or its access log).
"""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def subscribe(request: HttpRequest) -> HttpResponse:
    return render(request, "examples/subscribe.html")
