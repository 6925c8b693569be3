"""WebSocket routes under /ws/v1/ (docs/websocket.md)."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
