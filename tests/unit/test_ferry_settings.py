"""broker/settings.py: FERRY_* values from Django's settings, the environment or the defaults,
and the start-up check of the environment's."""

import pytest

from broker import settings as ferry_settings


def test_get__django_setting_then_environment_then_default(settings, monkeypatch):
    monkeypatch.delenv("FERRY_WS_PUSH_BATCH", raising=False)
    assert ferry_settings.get("WS_PUSH_BATCH") == ferry_settings.Defaults.WS_PUSH_BATCH
    monkeypatch.setenv("FERRY_WS_PUSH_BATCH", "7")
    assert ferry_settings.get("WS_PUSH_BATCH") == 7
    settings.FERRY_WS_PUSH_BATCH = 9
    assert ferry_settings.get("WS_PUSH_BATCH") == 9
    del settings.FERRY_WS_PUSH_BATCH
    assert ferry_settings.get("WS_PUSH_BATCH") == 7


def test_get__sees_each_change_of_the_environment(monkeypatch):
    """get() reads os.environ's own dict and keeps a value converted: a variable set, changed,
    set back, cleared and removed is seen at once, each in its setting's kind."""
    monkeypatch.delenv("FERRY_AUTO_CREATE_TOPICS", raising=False)
    seen = []
    for raw in ("yes", "off", "yes", "", None, "1"):
        if raw is None:
            monkeypatch.delenv("FERRY_AUTO_CREATE_TOPICS")
        else:
            monkeypatch.setenv("FERRY_AUTO_CREATE_TOPICS", raw)
        seen.append(ferry_settings.get("AUTO_CREATE_TOPICS"))
    assert seen == [True, False, True, False, ferry_settings.Defaults.AUTO_CREATE_TOPICS, True]
    monkeypatch.setenv("FERRY_GROUP_COMMIT_WAIT_MS", "2.5")
    assert ferry_settings.get("GROUP_COMMIT_WAIT_MS") == 2.5
    monkeypatch.setenv("FERRY_METRICS_AUTH", "open")
    assert ferry_settings.get("METRICS_AUTH") == "open"


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("FERRY_WS_PUSH_BATCH", "12"),
        ("FERRY_GROUP_COMMIT_WAIT_MS", "2.5"),
        ("FERRY_GROUP_COMMIT_WAIT_MS", "-1"),
        ("FERRY_AUTO_CREATE_TOPICS", "Yes"),
        ("FERRY_AUTO_CREATE_TOPICS", "off"),
        ("FERRY_METRICS_AUTH", "anything"),  # a string setting: never wrong
    ],
)
def test_invalid_environment__accepts_each_kind(monkeypatch, name, raw):
    for env_name in ferry_settings._ENV_NAMES.values():
        monkeypatch.delenv(env_name, raising=False)
    monkeypatch.setenv(name, raw)
    assert ferry_settings.invalid_environment() is None


@pytest.mark.parametrize(
    ("name", "raw", "kind"),
    [
        ("FERRY_WS_PUSH_BATCH", "2k", "is not an integer (its default: 2000)"),
        ("FERRY_WS_PUSH_BATCH", "1.5", "is not an integer (its default: 2000)"),
        ("FERRY_GROUP_COMMIT_WAIT_MS", "5ms", "is not a number (its default: -1.0)"),
        (
            "FERRY_AUTO_CREATE_TOPICS",
            "maybe",
            "is not 1, 0, true, false, yes, no, on or off (its default: False)",
        ),
    ],
)
def test_invalid_environment__names_the_first_wrong_one(monkeypatch, name, raw, kind):
    for env_name in ferry_settings._ENV_NAMES.values():
        monkeypatch.delenv(env_name, raising=False)
    monkeypatch.setenv(name, raw)
    assert ferry_settings.invalid_environment() == f"{name}={raw!r} {kind}"
