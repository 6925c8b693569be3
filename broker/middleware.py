"""Middleware: the JSON error shape, outages outside the API, and the budget of bodies being
parsed (docs/api.md)."""

import gc
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware
from django.utils.deprecation import MiddlewareMixin

from broker import api
from broker import settings as ferry_settings
from broker.core import outages

logger = logging.getLogger(__name__)


@sync_and_async_middleware
def api_json_errors(get_response: Callable) -> Callable:
    """Sync and async, so it adds no thread hop to async views under ASGI."""
    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            response = await get_response(request)
            if _run_again(request):
                response = await get_response(request)
            return api.json_errors_for_api(request, response)

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponse:
        response = get_response(request)
        if _run_again(request):
            response = get_response(request)
        return api.json_errors_for_api(request, response)

    return middleware


class OutageErrors(MiddlewareMixin):
    """Pages outside the API (the console, the admin, /metrics) answer an outage as the API does.

    A database that cannot be reached is 503 `unavailable`, a full disk 507
    `insufficient_storage`, as JSON with Retry-After (docs/operations.md): never Django's HTML
    500 page, and one log line instead of a traceback a request. The console shows the message
    above the page (static/console/console.js). Only process_exception: MiddlewareMixin then
    adds no thread hop to the API's async views.
    """

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        outage = outages.classify(exception)
        if outage is None:
            return None
        logger.warning("%s %s: %s (%s)", request.method, request.path, outage.code, exception)
        outages.drop_if_broken()
        return api.on_broker_error(request, outage)


def _run_again(request: HttpRequest) -> bool:
    """Once: the database ended the view's connection before anything of it committed.

    api.on_unexpected_error decides (broker/core/outages.py): the view runs again on a new
    connection instead of answering 503 (docs/decisions/0014-outages.md).
    """
    if not getattr(request, "ferry_run_again", False):
        return False
    request.ferry_run_again = False  # type: ignore[attr-defined]
    request.ferry_ran_again = True  # type: ignore[attr-defined]
    return True


# Bytes of request bodies being read and parsed now, in this process (the event loop's only).
_parsing_bytes = 0
# After a request body this large, collect garbage at once (see parsing_budget).
COLLECT_AFTER_BYTES = 8 * 1024 * 1024
RETRY_AFTER_S = 1
BODY_METHODS = {b"POST", b"PUT", b"PATCH"}

AsgiApp = Callable[[Any, Any, Any], Coroutine[Any, Any, None]]


def _body_size(scope: dict[str, Any]) -> int:
    """What a request's body will take: its Content-Length, else the most a body may be."""
    length = None
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                length = max(0, int(value))
            except ValueError:
                length = None
    if length is not None:
        return length
    if scope.get("method", "").encode() in BODY_METHODS:
        return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    return 0


def parsing_budget(app: AsgiApp) -> AsgiApp:
    """Bound the bytes of request bodies being read and parsed at once (FERRY_MAX_PARSING_BYTES).

    Django reads a whole body before any view or middleware runs, so the bound is kept here, at
    the ASGI level. A request that would go over it is answered at once, 503 `busy` with
    `retry_after`, its body unread; one request alone is always let in, so a body as large as
    FERRY_MAX_REQUEST_BYTES is never refused for the budget's sake.
    """

    async def budgeted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        global _parsing_bytes
        size = _body_size(scope) if scope["type"] == "http" else 0
        if size == 0:
            await app(scope, receive, send)
            return
        budget = ferry_settings.get("MAX_PARSING_BYTES")
        if _parsing_bytes and _parsing_bytes + size > budget:
            await _busy(send, budget)
            return
        _parsing_bytes += size
        try:
            await app(scope, receive, send)
        finally:
            _parsing_bytes -= size
            if size >= COLLECT_AFTER_BYTES:
                # A request's objects sit in reference cycles (request, handler, frames) that
                # only the cyclic collector frees, and the server collects rarely (mqsite/asgi.py
                # raises the thresholds): without this, the bodies of back-to-back big produces
                # piled up to 1.3 GB at a 64 MiB budget. A collection costs 10-60 ms, after a
                # body of 8 MiB or more (docs/benchmarks.md#memory).
                gc.collect()

    return budgeted


async def _busy(send: Any, budget: int) -> None:
    body = orjson.dumps(
        {
            "error": {
                "code": "busy",
                "message": "The broker is reading as many request bodies as it may at once; "
                f"retry after {RETRY_AFTER_S} s.",
                "detail": {"retry_after": RETRY_AFTER_S, "max_parsing_bytes": budget},
            }
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"retry-after", str(RETRY_AFTER_S).encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
