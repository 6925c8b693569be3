"""/metrics in the Prometheus text format: the broker's figures at scrape time, and the REST
API's request latencies (docs/metrics.md).

An edge: it authenticates the scraper by FERRY_METRICS_AUTH, reads core/figures.py and renders
with prometheus-client. Request latencies are this process's own (each server process keeps its
histogram; a scrape sees the process that answered it).
"""

import base64
import binascii
import hmac
import time
from collections.abc import Callable, Iterator

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import broker
from broker import api
from broker import settings as ferry_settings
from broker.core import dbthreads, errors, figures, keys
from broker.core.log import recent
from broker.core.records import Principal

LOOPBACK = {"127.0.0.1", "::1"}

REQUEST_SECONDS = Histogram(
    "ferry_api_request_duration_seconds",
    "REST API requests by route template, method and status, in seconds (this process).",
    ["method", "route", "status"],
    registry=None,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


def _route(request: HttpRequest) -> str:
    # The URL pattern, not the path: one series per endpoint, however many topics there are.
    match = getattr(request, "resolver_match", None)
    return "/" + match.route if match is not None else "unmatched"


def _observe(request: HttpRequest, response: HttpResponse, started: float) -> None:
    REQUEST_SECONDS.labels(
        request.method or "", _route(request), str(response.status_code)
    ).observe(time.perf_counter() - started)


@sync_and_async_middleware
def api_request_timing(get_response: Callable) -> Callable:
    """Time every /api/v1/ request (mqsite/asgi.py API_MIDDLEWARE); sync and async, no hop."""
    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            started = time.perf_counter()
            response = await get_response(request)
            _observe(request, response, started)
            return response

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = get_response(request)
        _observe(request, response, started)
        return response

    return middleware


class BrokerCollector(Collector):
    """The broker's figures, read through the core when scraped, for one principal."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: the names are fixed below

    def collect(self) -> Iterator[Metric]:
        f = figures.read_figures(self.principal)
        info = GaugeMetricFamily("ferry_info", "Ferry's version.", labels=["version"])
        info.add_metric([broker.VERSION], 1)
        yield info
        messages_in = CounterMetricFamily(
            "ferry_topic_messages_in",
            "Messages ever appended to a topic: the sum of its partitions' end offsets.",
            labels=["topic"],
        )
        totals: dict[str, int] = {}
        for p in f.partitions:
            totals[p.topic] = totals.get(p.topic, 0) + p.end_offset
        for topic, total in totals.items():
            messages_in.add_metric([topic], total)
        yield messages_in
        part_labels = ["topic", "partition"]
        end = GaugeMetricFamily(
            "ferry_partition_end_offset", "The offset the next message gets.", labels=part_labels
        )
        stored = GaugeMetricFamily(
            "ferry_partition_messages_stored",
            "Messages stored: end offset minus start offset.",
            labels=part_labels,
        )
        size = GaugeMetricFamily(
            "ferry_partition_bytes_stored", "Bytes of the stored messages.", labels=part_labels
        )
        for p in f.partitions:
            labels = [p.topic, str(p.partition)]
            end.add_metric(labels, p.end_offset)
            stored.add_metric(labels, p.end_offset - p.start_offset)
            size.add_metric(labels, p.bytes_stored)
        yield from (end, stored, size)
        group_labels = ["group", "topic", "partition"]
        committed = GaugeMetricFamily(
            "ferry_group_committed_offset",
            "A group's committed offset (broadcast groups: the sum over members).",
            labels=group_labels,
        )
        lag = GaugeMetricFamily(
            "ferry_group_lag",
            "Messages the group has not consumed: end offset minus committed offset.",
            labels=group_labels,
        )
        in_flight = GaugeMetricFamily(
            "ferry_group_in_flight", "Delivered, not yet settled.", labels=group_labels
        )
        retry = GaugeMetricFamily(
            "ferry_group_retry_waiting", "Waiting for their redelivery.", labels=group_labels
        )
        for g in f.groups:
            labels = [g.group, g.topic, str(g.partition)]
            committed.add_metric(labels, g.committed_offset)
            lag.add_metric(labels, g.lag)
            in_flight.add_metric(labels, g.in_flight)
            retry.add_metric(labels, g.retry_waiting)
        yield from (committed, lag, in_flight, retry)
        dead = GaugeMetricFamily(
            "ferry_dead_letters", "Dead letters in a group's queue.", labels=["group", "topic"]
        )
        for (group, topic), n in sorted(f.dead_letters.items()):
            dead.add_metric([group, topic], n)
        yield dead
        scheduled = GaugeMetricFamily(
            "ferry_scheduled_messages", "Delayed messages not yet due.", labels=["topic"]
        )
        for topic, n in sorted(f.scheduled.items()):
            scheduled.add_metric([topic], n)
        yield scheduled
        processes = GaugeMetricFamily(
            "ferry_broker_processes_alive",
            "Broker processes that heartbeat within 30 s, by kind.",
            labels=["kind"],
        )
        for kind in ("server", "worker"):
            processes.add_metric([kind], f.processes_alive.get(kind, 0))
        yield processes


class DatabaseThreadsCollector(Collector):
    """This process's database threads: calls run, time busy, time queued (core/dbthreads.py).

    A scrape sees the process that answered it, as REQUEST_SECONDS does.
    """

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ["pool", "call"]
        calls = CounterMetricFamily(
            "ferry_database_calls",
            "Core calls this process's database threads ran, by pool and call.",
            labels=labels,
        )
        busy = CounterMetricFamily(
            "ferry_database_call_seconds",
            "Seconds this process's database threads spent running them.",
            labels=labels,
        )
        queued = CounterMetricFamily(
            "ferry_database_call_queued_seconds",
            "Seconds they waited for the calls before them and a free thread before they ran.",
            labels=labels,
        )
        for (pool, call), f in sorted(dbthreads.call_figures().items()):
            calls.add_metric([pool, call], f.calls)
            busy.add_metric([pool, call], f.busy_s)
            queued.add_metric([pool, call], f.queued_s)
        yield from (calls, busy, queued)


class MessageCacheCollector(Collector):
    """What this process keeps of its own appends for deliveries (core/log/recent.py)."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        reads = CounterMetricFamily(
            "ferry_message_cache_reads",
            "Deliveries' reads of messages this process appended: kept in memory, or read.",
            labels=["result"],
        )
        for result, count in sorted(recent.reads().items()):
            reads.add_metric([result], count)
        yield reads
        yield GaugeMetricFamily(
            "ferry_message_cache_bytes",
            "What the messages kept in memory cost, against FERRY_MESSAGE_CACHE_MB.",
            value=recent.kept_bytes(),
        )


def _scraper(request: HttpRequest) -> Principal:
    """Who is scraping, by FERRY_METRICS_AUTH: loopback (default), open, key or basic."""
    mode = str(ferry_settings.get("METRICS_AUTH"))
    if mode == "open":
        return keys.CONSOLE
    if mode == "loopback":
        if request.META.get("REMOTE_ADDR") in LOOPBACK:
            return keys.CONSOLE
        raise errors.PermissionDenied("/metrics answers loopback requests only.")
    header = request.headers.get("Authorization", "")
    scheme, _, credentials = header.partition(" ")
    if mode == "key":
        if scheme.lower() != "bearer":
            raise errors.Unauthenticated()
        principal = keys.authenticate(credentials.strip())
        if not principal.is_system and not any(p.action == "admin" for p in principal.permissions):
            raise errors.PermissionDenied("/metrics needs a key with admin on a topic.")
        return principal
    if mode.startswith("basic:"):
        _, user, password = mode.split(":", 2)
        try:
            given = base64.b64decode(credentials, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            given = ""
        expected = f"{user}:{password}"
        if scheme.lower() == "basic" and hmac.compare_digest(given.encode(), expected.encode()):
            return keys.CONSOLE
        raise errors.Unauthenticated(
            "/metrics needs the user and password FERRY_METRICS_AUTH names."
        )
    raise errors.BrokerError(f"FERRY_METRICS_AUTH {mode!r} is not loopback, open, key or basic.")


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics: authenticate the scraper, read the figures, render the text format."""
    try:
        principal = _scraper(request)
    except errors.BrokerError as exc:
        response = api.error_response(exc.code, exc.message, exc.detail)
        if exc.code == "unauthenticated" and str(ferry_settings.get("METRICS_AUTH")).startswith(
            "basic:"
        ):
            response["WWW-Authenticate"] = 'Basic realm="ferry metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(principal))
    registry.register(REQUEST_SECONDS)
    registry.register(DatabaseThreadsCollector())
    registry.register(MessageCacheCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
