"""Middleware that keeps every /api/v1/ answer in the JSON error shape (docs/api.md)."""

from collections.abc import Callable

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

from broker import api


@sync_and_async_middleware
def api_json_errors(get_response: Callable) -> Callable:
    """Sync and async, so it adds no thread hop to async views under ASGI."""
    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            response = await get_response(request)
            return api.json_errors_for_api(request, response)

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponse:
        return api.json_errors_for_api(request, get_response(request))

    return middleware
