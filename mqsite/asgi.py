"""ASGI entry point: HTTP through Django, WebSocket through Channels, plus the embedded jobs.

/api/v1/ is served by a handler with only the API's own middleware: the bearer-token API uses
no sessions, CSRF, messages or static files, and each sync middleware would cost a thread hop
per request on the hot paths (docs/benchmarks.md).
"""

import gc
import os
from typing import Any

from django.core.asgi import get_asgi_application
from django.db.backends.signals import connection_created

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mqsite.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from broker import background, consumers, middleware, routing, startup  # noqa: E402
from dashboard import routing as dashboard_routing  # noqa: E402
from mqsite import api_handler, serving, shutdown  # noqa: E402

API_PREFIX = "/api/v1/"
api_asgi_app = api_handler.ApiHandler()
connection_created.connect(api_handler.keep_api_thread_connection)


# Bodies being parsed at once are bounded (503 busy beyond FERRY_MAX_PARSING_BYTES).
budgeted_api_app = middleware.parsing_budget(api_asgi_app)


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    app = budgeted_api_app if scope["path"].startswith(API_PREFIX) else django_asgi_app
    await app(scope, receive, send)


websocket_urlpatterns = [*routing.websocket_urlpatterns, *dashboard_routing.websocket_urlpatterns]

application = serving.allowed_hosts(
    ProtocolTypeRouter(
        {
            "http": http_app,
            # No origin check for /ws/v1/: it authenticates by API key, never by an ambient cookie,
            # so a page on another origin can do nothing its key could not do over REST. Routes
            # that use the session (the console's /ws/console/) wrap themselves in
            # AllowedHostsOriginValidator.
            # channels-stubs wants its stub-only _ExtendedURLPattern, which path() never returns.
            "websocket": URLRouter(websocket_urlpatterns),  # type: ignore[arg-type]
        }
    )
)


# A server starts only on a reachable, migrated database (and Redis when configured): else one
# line and exit status 1 (docs/operations.md#start-up-checks). Not when a test imports this.
if serving.started_by_daphne():
    startup.check_or_exit()
background.start()
consumers.hook_daphne()
serving.hook_daphne()
# SIGTERM or SIGINT: stop accepting, drain, WebSockets closed with 4503 (docs/operations.md).
shutdown.hook_daphne()

# The server's long-lived objects (Django, Ninja, pydantic schemas) are moved out of the
# collector's reach, and young collections run less often: a produce batch allocates thousands
# of short-lived objects, and each collection walked the whole heap (docs/benchmarks.md).
gc.freeze()
gc.set_threshold(50_000, 20, 100)
