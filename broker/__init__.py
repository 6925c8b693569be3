"""Ferry's broker app: models, the service core (core/) and its edges."""

# The one place the version lives besides pyproject.toml (tests/core/test_processes.py checks
# that they agree); the overview, /metrics and the process table show it.
VERSION = "0.1.0"
