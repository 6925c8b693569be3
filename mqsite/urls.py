"""URLs: the API under /api/v1/, /metrics, the console at / (with /login/, /logout/), admin."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from broker import metrics
from broker.api import api

urlpatterns = [
    path("api/v1/", api.urls),
    path("api/docs", RedirectView.as_view(url="/api/v1/docs", permanent=False)),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    # The console's own sign-in page (templates/registration/login.html); logout is a POST.
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=False), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("dashboard.urls")),
]
