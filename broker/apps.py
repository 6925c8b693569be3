"""Django app config for the broker (docs/architecture.md)."""

from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "broker"
    verbose_name = "Ferry broker"
