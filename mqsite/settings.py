"""Django settings for Ferry, from the environment with embedded defaults (docs/architecture.md)."""

import contextlib
import os
import secrets
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


def private_file(path: Path) -> None:
    """Make path readable by its owner only (0600), creating it empty if missing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    with contextlib.suppress(PermissionError):
        path.chmod(0o600)


def data_dir_secret_key(data_dir: Path) -> str:
    """The data directory's own SECRET_KEY: made on first start, kept in secret_key (0600).

    Written to a private temporary file and linked into place, so that processes starting
    together agree on one key and none reads a half-written file.
    """
    if not data_dir.is_dir():
        # Nothing is served from a missing data directory (scripts/run makes it, 0700), and a
        # settings import must not make one: a throwaway key lets the command say what is wrong.
        return secrets.token_urlsafe(50)
    path = data_dir / "secret_key"
    if not path.exists():
        private_file(tmp := data_dir / f".secret_key.{os.getpid()}")
        try:
            tmp.write_text(secrets.token_urlsafe(50))
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink()
    with contextlib.suppress(PermissionError):
        path.chmod(0o600)
    return path.read_text().strip()


DEBUG = env_bool("DJANGO_DEBUG", False)
# A deployment sets its own key; otherwise each data directory has one, never a shared default
# (anyone could forge sessions signed with it).
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or data_dir_secret_key(DATA_DIR)
# Checked on every path, the API and the WebSockets included (mqsite/serving.py): the loopback
# names by default, so a page on another origin cannot reach a local broker by DNS rebinding.
ALLOWED_HOSTS = [
    host.strip()
    for host in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")
    if host.strip()
]
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
    "broker.middleware.OutageErrors",
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


# How long the connection pool keeps retrying one failed connect (see database_config).
RECONNECT_SECONDS = 2.0


def database_config() -> dict[str, Any]:
    """PostgreSQL from DATABASE_URL, else SQLite in WAL mode under FERRY_DATA_DIR."""
    url = os.environ.get("DATABASE_URL")
    if url:
        # conn_max_age=0: Django's ASGI handler runs sync views on a fresh thread per request,
        # so a kept connection would leak; the hot paths keep theirs on broker/core/dbthreads.
        config = dj_database_url.parse(url, conn_max_age=0)
        config.setdefault("TEST", {})["NAME"] = os.environ.get("FERRY_TEST_DATABASE_NAME")
        # Parameters bound by the server, and a statement run FERRY_PG_PREPARE_THRESHOLD times
        # on a connection prepared there: the hot paths repeat a few dozen statements on
        # long-lived connections, and PostgreSQL then skips their parsing and planning
        # (docs/benchmarks.md). 0 turns both off (Django's default: client-side binding), for a
        # transaction-pooling PgBouncer older than 1.21, which cannot keep prepared statements.
        threshold = int(os.environ.get("FERRY_PG_PREPARE_THRESHOLD", "5"))
        if threshold > 0:
            config.setdefault("OPTIONS", {}).update(
                server_side_binding=True, prepare_threshold=threshold
            )
        # A pool per process (psycopg_pool through Django), FERRY_DB_POOL_SIZE connections at
        # most: the database threads hold theirs for good, and a request of the console, the
        # admin or a Celery task borrows one instead of opening a connection (a few ms on
        # PostgreSQL). A connection is checked when borrowed, so one the server ended is
        # replaced; a borrow waits at most FERRY_DB_POOL_TIMEOUT_SECONDS, then fails as the
        # database being away does (503). 0: a connection per request, as Django does.
        pool_size = int(os.environ.get("FERRY_DB_POOL_SIZE", "20"))
        if pool_size > 0:
            config.setdefault("OPTIONS", {})["pool"] = {
                "min_size": min(2, pool_size),
                "max_size": pool_size,
                "timeout": float(os.environ.get("FERRY_DB_POOL_TIMEOUT_SECONDS", "5")),
                # psycopg_pool retries a failed connect after 1, 2, 4, 8 … s: after an outage
                # of a few seconds the pool came back up to 8 s after the database did. An
                # attempt now gives up after this long, and the next borrow starts a new one
                # at once, so a process is back within about a second of the database.
                "reconnect_timeout": RECONNECT_SECONDS,
            }
            config["CONN_HEALTH_CHECKS"] = True
        # dj_database_url's DBConfig TypedDict is a plain dict at run time.
        return cast(dict[str, Any], config)
    synchronous = os.environ.get("FERRY_SQLITE_SYNCHRONOUS", "FULL")
    # Created 0600 before SQLite opens it; SQLite gives its -wal and -shm files the same mode.
    if DATA_DIR.is_dir():
        private_file(DATA_DIR / "ferry.sqlite3")
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
            # channels_redis's layer with a cheaper group_send (docs/decisions/0020).
            "BACKEND": "broker.core.redislayer.ScriptedRedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 10_000, "expiry": 30},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
# `celery worker -B` keeps beat's schedule here rather than in the current directory (a
# checkout); both places are ignored by git.
if DATA_DIR.is_dir():
    CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

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

# Served over HTTPS (a TLS proxy in front of Daphne): FERRY_HTTPS=1 sends session and CSRF
# cookies only over HTTPS and turns on HSTS (docs/architecture.md#settings).
FERRY_HTTPS = env_bool("FERRY_HTTPS", False)
if FERRY_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("FERRY_HSTS_SECONDS", 365 * 24 * 3600))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("FERRY_HSTS_INCLUDE_SUBDOMAINS", False)
    # The proxy tells the scheme the client used; trusted only when Ferry is told it is there.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("FERRY_SSL_REDIRECT", False)

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
