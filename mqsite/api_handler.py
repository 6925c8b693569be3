"""The ASGI handler of /api/v1/: Django's, without the thread hops an API request does not need.

Django's ASGIHandler sends `request_started` and closes the response (which sends
`request_finished`) through sync_to_async: two hops to a sync thread and back for every
request, a sixth of a single-message produce's server time (docs/benchmarks.md). Their
receivers look after the connection of the thread sync views run on, so an async view (produce,
fetch, polls: their core calls run on broker/core/dbthreads.py) has nothing for them to do.
Here they run on that thread only for a sync view, in the same hop as the view itself; the
response is closed on the event loop.
"""

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import SyncToAsync, iscoroutinefunction
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import close_old_connections
from django.http import HttpResponseBase
from django.urls import set_script_prefix

# Timing first, so a latency covers the error rendering too (/metrics, docs/metrics.md).
API_MIDDLEWARE = ["broker.metrics.api_request_timing", "broker.middleware.api_json_errors"]


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with API_MIDDLEWARE instead of settings.MIDDLEWARE, and no hops."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Without Django's per-request ThreadSensitiveContext, the sync views of API requests
        # share asgiref's one sync thread instead of starting a thread per request; core calls
        # already run on broker/core/dbthreads.py.
        await self.handle(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        # BaseHandler reads settings.MIDDLEWARE; swap it while this handler is built, once, at
        # import, before any request is served.
        saved = settings.MIDDLEWARE
        settings.MIDDLEWARE = API_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = saved

    def make_view_atomic(self, view: Callable[..., Any]) -> Callable[..., Any]:
        view = super().make_view_atomic(view)
        if iscoroutinefunction(view):
            return view

        @functools.wraps(view)
        def on_sync_thread(request: Any, *args: Any, **kwargs: Any) -> Any:
            # What Django's handler does around every request, here only around a sync view,
            # on the thread the view and its connection use: request_started's receivers (the
            # connection checked, what it committed noted for broker/middleware.py's run-again),
            # and a connection an error left unusable closed afterwards.
            signals.request_started.send(sender=self.__class__, scope=None)
            try:
                return view(request, *args, **kwargs)
            finally:
                close_old_connections()

        return on_sync_thread

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django 5.2's ASGIHandler.handle without the two sync_to_async calls (see above)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            if error_response is not None:
                await self.send_response(error_response, send)
                error_response.close()
            return

        async def process_request() -> HttpResponseBase:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client went away
                await self.send_response(response, send)
            return response

        # The disconnect listener first: it is cancelled last, as in Django.
        tasks: list[asyncio.Task[Any]] = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request()),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass  # the client disconnected
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            signals.request_finished.send(sender=self.__class__)
        else:
            # On the event loop: its resource closers (none blocks in the API) and
            # request_finished, whose receivers find no connection on this thread (async views'
            # core calls use dbthreads) and reset the URLconf of this context.
            response.close()
        body_file.close()


def keep_api_thread_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Keep the database connection of the one thread the API's sync views run on.

    With CONN_MAX_AGE=0 (see mqsite/settings.py) Django closes a request's connection when it
    ends, so each sync API call (health, topic metadata, management) opened a new one and
    started with a cold page cache: most of its cost (docs/benchmarks.md). This thread lives as
    long as the process, so its connection is kept, and still closed after a view when an error
    left it unusable (close_old_connections above).
    """
    # The thread of asgiref's single-thread executor: ApiHandler enters no
    # ThreadSensitiveContext, so sync code of API requests runs there (and only there).
    if threading.current_thread() in SyncToAsync.single_thread_executor._threads:
        connection.close_at = None
