"""The console's WebSocket route: /ws/console/, authenticated by the Django session."""

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import URLPattern, path

from dashboard import consumers

websocket_urlpatterns: list[URLPattern] = [
    # The session cookie is ambient, so unlike /ws/v1/ (API keys) this route checks the Origin:
    # a page on another site cannot open it with the operator's cookie.
    path(
        "ws/console/",
        AllowedHostsOriginValidator(AuthMiddlewareStack(consumers.ConsoleConsumer.as_asgi())),
    ),
]
