"""Django settings for Ferry, from the environment with embedded defaults (docs/architecture.md)."""

import os
from pathlib import Path
from typing import Any, cast

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("FERRY_DATA_DIR", BASE_DIR / "var")).resolve()


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = env_bool("DJANGO_DEBUG", False)
# The embedded default listens on loopback only; a deployment sets its own key and hosts.
SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "ferry-embedded-insecure-key-set-DJANGO_SECRET_KEY"
)
ALLOWED_HOSTS = os.environ.get(
    "DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver"
).split(",")
CSRF_TRUSTED_ORIGINS = [
    o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # ninja serves Swagger UI's assets itself: the docs page works without internet access.
    "ninja",
    "broker",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "broker.middleware.api_json_errors",
]

ROOT_URLCONF = "mqsite.urls"
ASGI_APPLICATION = "mqsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def database_config() -> dict[str, Any]:
    """PostgreSQL from DATABASE_URL, else SQLite in WAL mode under FERRY_DATA_DIR."""
    url = os.environ.get("DATABASE_URL")
    if url:
        # conn_max_age=0: Django's ASGI handler runs sync views on a fresh thread per request,
        # so a kept connection would leak; the hot paths keep theirs on broker/core/dbthreads.
        config = dj_database_url.parse(url, conn_max_age=0)
        config.setdefault("TEST", {})["NAME"] = os.environ.get("FERRY_TEST_DATABASE_NAME")
        # dj_database_url's DBConfig TypedDict is a plain dict at run time.
        return cast(dict[str, Any], config)
    synchronous = os.environ.get("FERRY_SQLITE_SYNCHRONOUS", "FULL")
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "ferry.sqlite3",
        "OPTIONS": {
            # IMMEDIATE: every transaction takes the write lock at BEGIN, so writers are
            # serialized instead of failing to upgrade a read lock (STYLE.md §3).
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            # WAL lets readers run beside the writer; FULL fsyncs each commit so an
            # acknowledged produce survives power loss, not only a process crash.
            "init_command": (
                f"PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous}; "
                "PRAGMA foreign_keys=ON; PRAGMA cache_size=-65536; PRAGMA mmap_size=1073741824;"
            ),
        },
    }


DATABASES = {"default": database_config()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Every core write opens its own durable transaction (STYLE.md §3).
ATOMIC_REQUESTS = False

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 10_000, "expiry": 30},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves admin, API docs and dashboard assets straight from the apps' static
# folders, so the embedded run needs no collectstatic step and no web server in front.
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# Batches of up to FERRY_MAX_BATCH_MESSAGES messages must fit; see broker/settings.py.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("FERRY_MAX_REQUEST_BYTES", 64 * 1024 * 1024))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("FERRY_LOG_LEVEL", "INFO")},
    "loggers": {"django.server": {"level": "WARNING"}},
}
