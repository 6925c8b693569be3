"""Django app config for the dashboard."""

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
