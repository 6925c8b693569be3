"""WebSocket routes under /ws/v1/ (docs/websocket.md)."""

from django.urls import URLPattern, path

from broker import consumers

websocket_urlpatterns: list[URLPattern] = [
    path("ws/v1/", consumers.BrokerConsumer.as_asgi()),  # type: ignore[arg-type]
]
