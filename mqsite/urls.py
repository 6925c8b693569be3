"""URLs: the API under /api/v1/, /metrics, the dashboard at /, Django admin at /admin/."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from broker import metrics
from broker.api import api

urlpatterns = [
    path("api/v1/", api.urls),
    path("api/docs", RedirectView.as_view(url="/api/v1/docs", permanent=False)),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("", include("dashboard.urls")),
]
