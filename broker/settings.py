"""Typed FERRY_* settings: the only place broker code reads configuration (docs/architecture.md)."""

import os
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.utils.functional import empty


@dataclass(frozen=True)
class Defaults:
    # Topic defaults (a topic may override them).
    MAX_MESSAGE_BYTES: int = 1024 * 1024
    DEFAULT_PARTITIONS: int = 1
    MAX_PARTITIONS: int = 1024
    # A produce to an unknown topic creates it with the defaults (Kafka's
    # auto.create.topics.enable), the key's produce permission on the name sufficing. Off: 404.
    AUTO_CREATE_TOPICS: bool = False
    # Produce.
    MAX_BATCH_MESSAGES: int = 10_000
    DEDUP_WINDOW_SECONDS: int = 24 * 3600
    # Delayed messages: the longest delay accepted.
    MAX_DELAY_SECONDS: int = 30 * 24 * 3600
    # Fetch and poll.
    MAX_FETCH_MESSAGES: int = 10_000
    MAX_WAIT_MS: int = 30_000
    # How long an authenticated key is remembered per process (0: ask the database every time).
    AUTH_CACHE_SECONDS: float = 1.0
    # Threads that run core calls for async edges; -1 picks 1 on SQLite, 4 on PostgreSQL.
    DB_THREADS: int = -1
    # Threads that run read-only core calls (listings, fetch, health) beside them; -1 picks 4.
    DB_READ_THREADS: int = -1
    # Membership: members heartbeat this often; the session timeout (per group, 45 s) expires them.
    HEARTBEAT_INTERVAL_MS: int = 3000
    MEMBER_EXPIRY_INTERVAL_SECONDS: float = 1.0
    # Background jobs: run inside the server process (the embedded default) unless Celery runs them.
    BACKGROUND_IN_PROCESS: bool = True
    RETENTION_INTERVAL_SECONDS: float = 30.0
    DEDUP_PURGE_INTERVAL_SECONDS: float = 300.0
    # Due delayed messages are appended within this of their time (docs/semantics.md).
    SCHEDULER_INTERVAL_SECONDS: float = 0.2
    # Acknowledged delivery: expired ack deadlines are turned into retries this often.
    ACK_SWEEP_INTERVAL_SECONDS: float = 1.0
    # The longest ack deadline a group or an extend may ask for.
    MAX_ACK_DEADLINE_MS: int = 12 * 3600 * 1000
    # WebSocket: the largest frame (message) the server accepts or sends; a larger client frame
    # gets an error frame and close 4413. Daphne must be started with the same number
    # (--websocket-max-message-size, scripts/run). It also bounds a topic's max_message_bytes
    # (max_message_bytes_ceiling), so that every stored message can be pushed.
    WS_MAX_FRAME_BYTES: int = 16 * 1024 * 1024
    # REST: request bodies being read and parsed at once, in bytes, per process; a request that
    # would go over it waits for none and gets 503 busy with retry_after (docs/api.md#limits).
    # A body without Content-Length counts as FERRY_MAX_REQUEST_BYTES.
    MAX_PARSING_BYTES: int = 256 * 1024 * 1024
    # Group commit (core/groupcommit.py): once commits have held several produce requests, the
    # next waits up to this long for as many (0: never; -1 picks 5 on PostgreSQL, 0 on SQLite).
    GROUP_COMMIT_WAIT_MS: float = -1.0
    # WebSocket push: messages per `messages` frame at most.
    WS_PUSH_BATCH: int = 2000
    # An ack of a subscriber with credit left waits up to this long for the subscription's
    # next push, and is settled with it in one database call (0: each ack settles at once).
    # Long enough for a subscriber fed 50 messages a second or more (docs/benchmarks.md,
    # session 33).
    WS_ACK_HOLD_MS: int = 20
    # A subscriber waiting for the credit its ack frees gets up to this many more messages
    # read for it in the same database call, pushed as its next acks come (0: none; only with
    # FERRY_WS_ACK_HOLD_MS above 0, which settles those acks).
    WS_READ_AHEAD: int = 16
    # A WebSocket push or ack of at most this many messages runs on the event loop's own thread
    # (no hop to a database thread; 0: never): on SQLite when nothing else writes, on
    # PostgreSQL with its waits bounded (docs/decisions/0023).
    WS_LOOP_CALL_MESSAGES: int = 128
    # Messages this process appended lately are kept in memory, up to this many MiB, and
    # deliveries of them read no rows (broker/core/log/recent.py; 0: none are kept).
    MESSAGE_CACHE_MB: float = 64.0
    # Message trace events are kept this long, and purged this often.
    TRACE_RETENTION_SECONDS: int = 7 * 24 * 3600
    TRACE_PURGE_INTERVAL_SECONDS: float = 300.0
    # The topic the Spark stats job writes to and the console's topic page reads.
    STATS_TOPIC: str = "ferry-stats"
    # Console live pages: how often a server process checks whether anything changed.
    CONSOLE_LIVE_INTERVAL_SECONDS: float = 1.0
    # History (core/history.py): sampled this often, downsampled as it ages, kept this long.
    SAMPLE_INTERVAL_SECONDS: float = 10.0
    SAMPLE_RETENTION_SECONDS: int = 7 * 24 * 3600
    SAMPLE_COMPACT_INTERVAL_SECONDS: float = 60.0
    # Broker processes (core/processes.py): every server and worker process heartbeats this
    # often from its own thread; off in the test process, which must not write behind tests.
    PROCESS_HEARTBEAT: bool = True
    PROCESS_HEARTBEAT_SECONDS: float = 5.0
    PROCESS_PURGE_INTERVAL_SECONDS: float = 3600.0
    # Topic deletion (core/topics.py run_topic_deletions): rows per transaction, rounds this often.
    DELETION_CHUNK_ROWS: int = 2000
    DELETION_INTERVAL_SECONDS: float = 1.0
    # Background redrives (core/redrives.py): a chunk per job this often, and the rate ceiling.
    REDRIVE_INTERVAL_SECONDS: float = 1.0
    MAX_REDRIVE_RATE_PER_SECOND: int = 10_000
    # Serving under Daphne (mqsite/serving.py, docs/architecture.md#serving): a connection
    # silent this long is closed; a request's line and headers, then its body, must arrive
    # within these of its first byte (else 408 and the connection closed).
    HTTP_IDLE_TIMEOUT_SECONDS: float = 30.0
    HTTP_HEADER_TIMEOUT_SECONDS: float = 10.0
    HTTP_BODY_TIMEOUT_SECONDS: float = 60.0
    # Shutdown (mqsite/shutdown.py, docs/operations.md#shutdown): on SIGTERM or SIGINT a server
    # stops accepting, then has this long to finish its requests and close its WebSockets.
    SHUTDOWN_TIMEOUT_SECONDS: float = 10.0
    # Outages (docs/operations.md): while the channel layer (Redis) is unreachable, waiting
    # polls and pushes re-read the database this often instead of waiting for a wake-up, and the
    # layer is probed this often until it answers again.
    WAKEUP_POLL_MS: int = 250
    LAYER_PROBE_SECONDS: float = 1.0
    # A 503 `unavailable` (database or disk away) tells the client to retry after this long.
    RETRY_AFTER_SECONDS: int = 1
    # Transactions (core/transactions/, docs/transactions.md): the longest timeout a begin may
    # ask for; how often the check job runs; check-backs of a timed-out transaction: how many
    # unknown or failed answers before it is rolled back, the first retry's wait (doubling up to
    # 60 s) and each callback's own timeout; how long ended transactions stay listed.
    MAX_TRANSACTION_TIMEOUT_MS: int = 3600 * 1000
    TRANSACTION_CHECK_INTERVAL_SECONDS: float = 1.0
    TRANSACTION_MAX_CHECKS: int = 5
    TRANSACTION_CHECK_BACKOFF_MS: int = 1000
    TRANSACTION_CHECK_TIMEOUT_SECONDS: float = 5.0
    TRANSACTION_RETENTION_SECONDS: int = 7 * 24 * 3600
    # Who may read /metrics: loopback | open | key | basic:<user>:<password> (docs/metrics.md).
    METRICS_AUTH: str = "loopback"


_ENV_NAMES = {name: f"FERRY_{name}" for name in Defaults.__dataclass_fields__}
# get() reads the dict behind os.environ (the one its reads and writes use) by encoded name:
# os.environ.get of an unset name raises and catches a KeyError inside, about 1.5 µs, and the
# hot paths ask several settings a message (docs/benchmarks.md). A value is converted once.
_ENVIRON: dict[Any, Any] = os.environ._data  # type: ignore[attr-defined]
_ENV_KEYS = {name: os.environ.encodekey(env) for name, env in _ENV_NAMES.items()}
_converted: dict[tuple[str, Any], Any] = {}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}
_KINDS = {bool: "1, 0, true, false, yes, no, on or off", int: "an integer", float: "a number"}


def _convert(raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        return raw.strip().lower() in _TRUE
    return type(default)(raw)


def invalid_environment() -> str | None:
    """The first FERRY_* environment variable that is not of its setting's kind, said in one
    line; None when all are (start-up checks: a typo fails the start, not each request)."""
    for name, env_name in _ENV_NAMES.items():
        raw = os.environ.get(env_name)
        default = getattr(Defaults, name)
        if raw is None or type(default) not in _KINDS:
            continue
        if isinstance(default, bool):
            valid = raw.strip().lower() in _TRUE | _FALSE
        else:
            try:
                _convert(raw, default)
                valid = True
            except ValueError:
                valid = False
        if not valid:
            return f"{env_name}={raw!r} is not {_KINDS[type(default)]} (its default: {default})"
    return None


_UNSET = object()


def get(name: str) -> Any:
    """A FERRY_<name> value: Django setting, else environment variable, else the default."""
    full_name = _ENV_NAMES[name]
    # Asked of the settings object behind Django's lazy proxy: for a name it does not define,
    # the proxy builds and drops an AttributeError (2.5 µs; several asks per frame on the hot
    # paths). override_settings and assignments to django.conf.settings change that object.
    wrapped: Any = getattr(django_settings, "_wrapped", empty)
    if wrapped is empty:
        value = getattr(django_settings, full_name, _UNSET)  # sets Django's settings up
    else:
        value = getattr(wrapped, full_name, _UNSET)
    if value is not _UNSET:
        return value
    raw = _ENVIRON.get(_ENV_KEYS[name])
    if raw is None:
        return getattr(Defaults, name)
    try:
        return _converted[name, raw]
    except KeyError:
        converted = _convert(os.environ.decodevalue(raw), getattr(Defaults, name))
        if len(_converted) >= 1024:
            _converted.clear()
        _converted[name, raw] = converted
        return converted


# Room in a push frame for everything but a message's value: the frame's envelope, the tag,
# id, key (1024 characters, JSON-escaped), receipt and numbers.
PUSH_FRAME_OVERHEAD_BYTES = 64 * 1024


def max_message_bytes_ceiling() -> int:
    """The largest max_message_bytes a topic may have: such a message fits one push frame.

    A raw value goes out base64-encoded (4 bytes for 3), so the value may take three quarters of
    the frame left after PUSH_FRAME_OVERHEAD_BYTES (docs/websocket.md#limits).
    """
    frame = int(get("WS_MAX_FRAME_BYTES"))
    return max(1, (frame - PUSH_FRAME_OVERHEAD_BYTES) * 3 // 4)
