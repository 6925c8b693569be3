"""The REST API under /api/v1/: authenticate, parse, one core call, render (docs/api.md)."""

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.signals import request_started
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Path, Query, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.renderers import BaseRenderer
from ninja.security import HttpBearer

from broker import arrow, schemas, wire
from broker.core import (
    audit,
    browse,
    dbthreads,
    delivery,
    errors,
    events,
    groupcommit,
    groups,
    history,
    keys,
    log,
    membership,
    outages,
    redrives,
    retries,
    scheduling,
    topics,
    trace,
    transactions,
)
from broker.core.records import (
    Actor,
    ApiKeyInfo,
    AuditInfo,
    BrowsedMessage,
    GroupInfo,
    GroupTopicOffsets,
    MemberInfo,
    NewMessage,
    PartitionInfo,
    Principal,
    RedriveJobInfo,
    SettleResult,
    TopicInfo,
    TransactionInfo,
    TransactionResult,
)

logger = logging.getLogger(__name__)

# Bounds for integer parameters: beyond them a value cannot be an offset or a partition.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# The one table from error code to HTTP status; unknown codes are the client's fault (400).
STATUS_BY_CODE = {
    "unauthenticated": 401,
    "permission_denied": 403,
    "topic_not_found": 404,
    "partition_not_found": 404,
    "group_not_found": 404,
    "api_key_not_found": 404,
    "scheduled_not_found": 404,
    "message_not_found": 404,
    "member_not_found": 404,
    "dead_letter_not_found": 404,
    "redrive_job_not_found": 404,
    "transaction_not_found": 404,
    "fenced": 409,
    "transaction_not_open": 409,
    "transaction_aborted": 409,
    "stale_generation": 409,
    "group_has_members": 409,
    "member_id_taken": 409,
    "topic_exists": 409,
    "api_key_exists": 409,
    "topic_full": 409,
    "offset_out_of_range": 409,
    "message_too_large": 413,
    "batch_too_large": 413,
    "request_too_large": 413,
    "not_found": 404,
    "method_not_allowed": 405,
    "validation_error": 422,
    "broker_error": 503,
    "busy": 503,
    "unavailable": 503,
    "insufficient_storage": 507,
    "internal_error": 500,
}


class OrjsonParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        try:
            return orjson.loads(request.body)
        except orjson.JSONDecodeError as exc:
            raise errors.MalformedJson(f"The request body is not valid JSON: {exc}") from None


class OrjsonRenderer(BaseRenderer):
    media_type = "application/json"

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> bytes:
        return orjson.dumps(data)


class ApiKeyAuth(HttpBearer):
    async def authenticate(self, request: HttpRequest, token: str) -> Principal:
        cached = keys.cached_principal(token)
        if cached is not None:
            return cached
        return await dbthreads.run(keys.authenticate, token)


class AuthedRequest(HttpRequest):
    """A request that passed ApiKeyAuth: Ninja sets `auth` to what authenticate() returned."""

    auth: Principal


# Path parameters that are names, as the core checks them (topics.NAME_RE; dots alone refused).
NAME_PATTERN = "^[A-Za-z0-9._-]{1,200}$"
NAME_PARAMETERS = {"name", "group", "topic", "member_id"}


class FerryApi(NinjaAPI):
    """NinjaAPI whose OpenAPI schema also documents every error response and name pattern."""

    def get_openapi_schema(self, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(**kwargs)
        error_schema = schemas.ErrorOut.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(error_schema.pop("$defs", {}))
        components["ErrorOut"] = error_schema
        for path in schema["paths"].values():
            for operation in path.values():
                # Ninja keys its own responses by int; JSON has string keys only.
                operation["responses"] = {str(k): v for k, v in operation["responses"].items()}
                authed = bool(operation.get("security"))
                for status, codes in sorted(error_codes_by_status().items()):
                    if status in (401, 403) and not authed:
                        continue
                    operation["responses"].setdefault(
                        str(status),
                        {
                            "description": "Error: " + ", ".join(f"`{c}`" for c in codes),
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/ErrorOut"}
                                }
                            },
                        },
                    )
                for parameter in operation.get("parameters", ()):
                    if parameter["in"] == "path" and parameter["name"] in NAME_PARAMETERS:
                        parameter["schema"]["pattern"] = NAME_PATTERN
                        parameter["description"] = (
                            "1 to 200 characters from A-Z a-z 0-9 . _ - (member ids: 100), "
                            "not dots alone."
                        )
        return schema


def error_codes_by_status() -> dict[int, list[str]]:
    """STATUS_BY_CODE turned around, plus the codes no table maps (400 is the default)."""
    by_status: dict[int, list[str]] = {
        400: [
            "invalid_request",
            "malformed_json",
            "invalid_topic_name",
            "invalid_partition_count",
            "invalid_message",
            "invalid_filter",
        ]
    }
    for code, status in STATUS_BY_CODE.items():
        by_status.setdefault(status, []).append(code)
    return by_status


api = FerryApi(
    title="Ferry",
    version="1",
    description="Durable message broker: topics, partitions, offsets and consumer groups.",
    urls_namespace="api-v1",
    auth=ApiKeyAuth(),
    parser=OrjsonParser(),
    renderer=OrjsonRenderer(),
    docs_url="/docs",
)


def error_response(
    code: str, message: str, detail: dict[str, Any] | None = None, status: int | None = None
) -> HttpResponse:
    body = {"error": {"code": code, "message": message, "detail": detail or {}}}
    try:
        content = orjson.dumps(body, default=str)
    except TypeError:
        # orjson refuses integers past 64 bits, which a client may well have sent us.
        content = json.dumps(body, default=str).encode()
    return HttpResponse(
        content,
        status=status or STATUS_BY_CODE.get(code, 400),
        content_type="application/json",
    )


@api.exception_handler(errors.BrokerError)
def on_broker_error(request: HttpRequest, exc: errors.BrokerError) -> HttpResponse:
    response = error_response(exc.code, exc.message, exc.detail)
    if "retry_after" in exc.detail:
        response["Retry-After"] = str(exc.detail["retry_after"])
    return response


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # Ninja wraps our parser's MalformedJson in an HttpError(400); unwrap it.
    if isinstance(exc.__cause__, errors.BrokerError):
        return on_broker_error(request, exc.__cause__)
    return error_response("invalid_request", exc.message, status=exc.status_code)


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    # Ninja prefixes body fields with ("body", "body"); the client only knows its own fields.
    found = [
        {**e, "loc": [part for part in e.get("loc", ()) if part != "body"]} for e in exc.errors
    ]
    first = found[0] if found else {}
    where = ".".join(str(part) for part in first.get("loc", ()))
    what = first.get("msg", "The request is not valid.")
    message = f"{where}: {what}" if where else what
    return error_response("validation_error", message, {"errors": found})


@api.exception_handler(AuthenticationError)
def on_authentication_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response("unauthenticated", errors.Unauthenticated().message)


def json_errors_for_api(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """Django's HTML 404 and 500 and Ninja's text 405 under /api/v1/ become JSON errors."""
    if not request.path.startswith("/api/v1/") or response.status_code not in (404, 405, 500):
        return response
    if response.get("Content-Type", "").startswith("application/json"):
        return response
    if response.status_code == 500:
        return internal_error()
    if response.status_code == 404:
        return error_response("not_found", f"No API endpoint at {request.path}.")
    allowed = response.get("Allow", "")
    return error_response(
        "method_not_allowed",
        f"{request.method} is not allowed here; use {allowed}.",
        {"allowed": [m.strip() for m in allowed.split(",") if m.strip()]},
    )


@api.exception_handler(Exception)
def on_unexpected_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A bug or a failed database: the documented JSON error body, never Django's HTML page.

    A database that cannot be reached is 503 `unavailable`, a full disk 507
    `insufficient_storage` (docs/operations.md). A sync view whose connection the database ended
    before anything committed is run once more on a new one (broker/middleware.py).
    """
    outage = outages.classify(exc)
    if outage is None:
        logger.exception("%s %s failed", request.method, request.path)
        return internal_error()
    logger.warning("%s %s: %s (%s)", request.method, request.path, outage.code, exc)
    if _on_request_thread():
        lost = outages.is_lost_connection(exc)
        clean = outages.nothing_committed_in_request()
        outages.drop_if_broken()
        if lost and clean and not getattr(request, "ferry_ran_again", False):
            request.ferry_run_again = True  # type: ignore[attr-defined]
    return on_broker_error(request, outage)


def _mark_request(sender: Any, **kwargs: Any) -> None:
    # On the thread sync views run on (signals' sync receivers run there too): what committed
    # before this request, for on_unexpected_error's run-again decision.
    outages.mark_request()


request_started.connect(_mark_request, dispatch_uid="ferry.api.mark_request")


def _on_request_thread() -> bool:
    """Whether this handler runs on a sync view's thread (whose connection it may drop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


def internal_error() -> HttpResponse:
    return error_response(
        "internal_error",
        "The broker failed to answer this request; it has been logged. Try again.",
        status=500,
    )


@api.exception_handler(RequestDataTooBig)
def on_request_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return error_response(
        "request_too_large",
        f"The request body is larger than the {limit} bytes the broker accepts.",
        {"max_request_bytes": limit},
    )


def topic_out(info: TopicInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "partitions": info.partition_count,
        "retention_ms": info.retention_ms,
        "retention_bytes": info.retention_bytes,
        "max_message_bytes": info.max_message_bytes,
        "capacity": info.capacity,
        "overflow_policy": info.overflow_policy,
        "message_ttl_ms": info.message_ttl_ms,
        "trace": info.trace,
        "created_at_ms": info.created_at_ms,
        "partition_offsets": [partition_out(p) for p in info.partitions],
        "message_count": info.message_count,
        "bytes_stored": info.bytes_stored,
    }


def partition_out(p: PartitionInfo) -> dict[str, Any]:
    return {
        "partition": p.number,
        "start_offset": p.start_offset,
        "end_offset": p.end_offset,
        "message_count": p.message_count,
        "bytes_stored": p.bytes_stored,
    }


def actor_of(request: AuthedRequest) -> Actor:
    """The audit log's actor for a REST call: the key, and where the request came from."""
    return Actor(
        name=keys.actor_name(request.auth),
        source="api",
        client_ip=request.META.get("REMOTE_ADDR", "") or "",
        user_agent=request.headers.get("User-Agent", ""),
    )


def group_topic_out(offsets: GroupTopicOffsets) -> dict[str, Any]:
    return {
        "group": offsets.group,
        "topic": offsets.topic,
        # Broadcast mode: each member has offsets of its own; "" is the group's.
        "member": offsets.subscriber or None,
        "capacity": offsets.capacity,
        # Deprecated: max_offset is one partition's figure; committed_offset and end_offset
        # are the totals' old names. Every other figure here is a total over the partitions.
        "max_offset": offsets.max_offset,
        "committed_offset": offsets.committed_total,
        "end_offset": offsets.end_total,
        "end_total": offsets.end_total,
        "committed_total": offsets.committed_total,
        "lag": offsets.lag,
        "in_flight": offsets.in_flight,
        "retry_waiting": offsets.retry_waiting,
        "partitions": [
            {
                "partition": p.partition,
                "committed_offset": p.committed_offset,
                "start_offset": p.start_offset,
                "end_offset": p.end_offset,
                "lag": p.lag,
                "in_flight": p.in_flight,
                "retry_waiting": p.retry_waiting,
                "filtered": p.filtered,
                "skipped_by_retention": p.skipped_by_retention,
            }
            for p in offsets.partitions
        ],
    }


def group_out(info: GroupInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "created_at_ms": info.created_at_ms,
        "generation": info.generation,
        "strategy": info.strategy,
        "topics": [group_topic_out(t) for t in info.topics],
        # The member records' fields are the wire's fields.
        "members": [dataclasses.asdict(m) for m in info.members],
        "settings": dataclasses.asdict(info.settings),
        "dead_letters": info.dead_letters,
    }


def member_out(info: MemberInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


def json_response(body: dict[str, Any], status: int = 200) -> HttpResponse:
    """Render directly, bypassing response validation, for the bulk message paths."""
    return HttpResponse(orjson.dumps(body), status=status, content_type="application/json")


@api.get("/health", auth=None, response=schemas.HealthOut, tags=["health"])
async def health(request: HttpRequest) -> dict[str, str]:
    """503 `unavailable` naming the database when it cannot be reached; a Redis that cannot be
    reached only makes the broker `degraded` (wake-ups by a database poll, docs/operations.md).

    On a reader thread: a slow listing or a long write never holds the health check back.
    """
    vendor = await dbthreads.read(outages.check_database)
    redis = "not used"
    if events.layer_is_redis():
        redis = "ok" if await events.check_layer() else "degraded"
    status = "degraded" if redis == "degraded" else "ok"
    return {"status": status, "database": vendor, "redis": redis}


async def rendered_on_reader(answer: Callable[[], bytes]) -> HttpResponse:
    """Run a listing's core call and its rendering on a reader thread, and send the JSON.

    Rendering a large listing takes as long as reading it; on the event loop it would hold up
    every other request of the process (health included), so it is done on the thread too.
    """
    return HttpResponse(await dbthreads.read(answer), content_type="application/json")


# Listings answer pages (docs/api.md#pages): limit entries named after `after`.
ListLimit = Query(None, ge=0, le=INT32_MAX, description="At most this many, 1..1000.")
ListAfter = Query(None, max_length=200, description="Start after this name (the last one seen).")


@api.get("/topics", response=list[schemas.TopicOut], tags=["topics"])
async def list_topics(
    request: AuthedRequest, limit: int | None = ListLimit, after: str | None = ListAfter
) -> HttpResponse:
    def answer() -> bytes:
        found = topics.list_topics(request.auth, limit=limit, after=after)
        return orjson.dumps([topic_out(t) for t in found])

    return await rendered_on_reader(answer)


@api.post("/topics", response={201: schemas.TopicOut}, tags=["topics"])
async def create_topic(request: AuthedRequest, body: schemas.TopicIn) -> Status[dict[str, Any]]:
    # Async because GET /topics is (Ninja keeps one kind per path); the write is the writer's.
    info = await dbthreads.run(
        audit.audited,
        actor_of(request),
        "topic.create",
        body.name,
        body.model_dump(exclude={"name"}),
        lambda: topics.create_topic(
            request.auth,
            body.name,
            body.partitions,
            retention_ms=body.retention_ms,
            retention_bytes=body.retention_bytes,
            max_message_bytes=body.max_message_bytes,
            capacity=body.capacity,
            overflow_policy=body.overflow_policy,
            message_ttl_ms=body.message_ttl_ms,
            trace=body.trace,
        ),
    )
    return Status(201, topic_out(info))


@api.get("/topics/{name}", response=schemas.TopicOut, tags=["topics"])
def get_topic(request: AuthedRequest, name: str) -> dict[str, Any]:
    return topic_out(topics.describe_topic(request.auth, name))


@api.patch("/topics/{name}", response=schemas.TopicOut, tags=["topics"])
def alter_topic(request: AuthedRequest, name: str, body: schemas.TopicPatch) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True)
    info = audit.audited(
        actor_of(request),
        "topic.alter",
        name,
        changes,
        lambda: membership.alter_topic(request.auth, name, **changes),
    )
    return topic_out(info)


@api.delete("/topics/{name}", response={204: None}, tags=["topics"])
def delete_topic(request: AuthedRequest, name: str) -> Status[None]:
    # Marks it and answers at once; its rows are deleted in the background (docs/api.md).
    audit.audited(
        actor_of(request),
        "topic.delete",
        name,
        {},
        lambda: topics.delete_topic(request.auth, name),
        lambda d: {"messages": d.messages, "deleting": True},
    )
    return Status(204, None)


@api.post("/topics/{name}/purge", response=schemas.PurgeTopicOut, tags=["topics"])
def purge_topic(
    request: AuthedRequest, name: str, body: schemas.PurgeTopicIn | None = None
) -> dict[str, Any]:
    up_to = body.up_to if body is not None else None
    result = audit.audited(
        actor_of(request),
        "topic.purge",
        name,
        {"up_to": {str(p): o for p, o in up_to.items()} if up_to is not None else None},
        lambda: log.purge_topic(request.auth, name, up_to),
        lambda r: {"removed": r.removed},
    )
    return {
        "removed": result.removed,
        "partition_offsets": [partition_out(p) for p in result.partitions],
    }


@api.post("/topics/{name}/messages", response=schemas.ProduceOut, tags=["messages"])
async def produce(request: AuthedRequest, name: str, body: schemas.ProduceIn) -> HttpResponse:
    return await appended(request, name, body.to_new_messages())


async def appended(request: AuthedRequest, name: str, messages: list[NewMessage]) -> HttpResponse:
    """Both produce endpoints' append (a group commit) and answer."""
    results = await groupcommit.append_messages(request.auth, name, messages)
    return json_response({"results": [wire.append_out(r) for r in results]})


@api.post(
    "/topics/{name}/partitions/{partition}/messages",
    response=schemas.ProduceOut,
    tags=["messages"],
)
async def produce_to_partition(
    request: AuthedRequest,
    name: str,
    body: schemas.ProduceIn,
    partition: int = Path(..., ge=0, le=INT32_MAX),
) -> HttpResponse:
    # Its own URL so that a load balancer can send one partition's produces to one process
    # (scripts/haproxy): its appends then never wait for another's partition lock.
    return await appended(request, name, log.in_partition(body.to_new_messages(), partition))


def browsed_out(m: BrowsedMessage) -> dict[str, Any]:
    return {
        "partition": m.partition,
        "offset": m.offset,
        "timestamp_ms": m.timestamp_ms,
        "key": m.key,
        "tag": m.tag,
        "headers": m.headers,
        "id": m.client_id,
        "size_bytes": m.size_bytes,
        **wire.value_fields(m.value, m.is_json),
    }


@api.get("/topics/{name}/messages", response=schemas.MessageLookupOut, tags=["messages"])
async def lookup_messages(
    request: AuthedRequest,
    name: str,
    key: str | None = Query(None, max_length=1024),
    id: str | None = Query(None, max_length=200),
    partition: int | None = Query(None, ge=0, le=INT32_MAX),
    limit: int = Query(50, ge=0, le=INT32_MAX),
) -> HttpResponse:
    # Async like produce on this path (Ninja cannot mix sync and async operations on a path).
    result = await dbthreads.read(
        lambda: browse.search_messages(
            request.auth, name, key=key, client_id=id, partition=partition, limit=limit
        )
    )
    return json_response(
        {
            "messages": [browsed_out(m) for m in result.items],
            "indexed": result.indexed,
            "scanned": result.scanned,
            "complete": result.complete,
        }
    )


@api.get(
    "/topics/{name}/partitions/{partition}/messages",
    response=schemas.FetchOut,
    tags=["messages"],
    # The bulk format (broker/arrow.py) is chosen by the Accept header; errors stay JSON.
    openapi_extra={
        "responses": {
            200: {"content": {arrow.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}
        }
    },
)
async def fetch(
    request: AuthedRequest,
    name: str,
    partition: int = Path(..., ge=0, le=INT32_MAX),
    offset: int | None = Query(None, ge=0, le=INT64_MAX),
    limit: int = Query(100, ge=0, le=INT32_MAX),
    max_wait_ms: int = Query(0, ge=0, le=INT32_MAX),
) -> HttpResponse:
    result = await log.read_messages_async(
        request.auth, name, partition, offset, limit, max_wait_ms
    )
    if arrow.accepts_arrow(request.headers.get("Accept", "")):
        return HttpResponse(arrow.fetch_stream(result), content_type=arrow.MEDIA_TYPE)
    return json_response(
        {
            "messages": [wire.message_out(m) for m in result.messages],
            "next_offset": result.next_offset,
            "start_offset": result.start_offset,
            "end_offset": result.end_offset,
        }
    )


@api.get("/topics/{name}/offsets", response=schemas.OffsetsOut, tags=["messages"])
def offsets(
    request: AuthedRequest, name: str, timestamp: int | None = Query(None, ge=0, le=INT64_MAX)
) -> dict[str, Any]:
    lookups = log.list_offsets(request.auth, name, timestamp)
    return {
        "topic": name,
        "partitions": [
            {
                "partition": o.partition,
                "start_offset": o.start_offset,
                "end_offset": o.end_offset,
                "offset_for_timestamp": o.offset_for_timestamp,
            }
            for o in lookups
        ],
    }


@api.get("/topics/{name}/scheduled", response=schemas.ScheduledPageOut, tags=["scheduled"])
def list_scheduled(
    request: AuthedRequest,
    name: str,
    limit: int = Query(100, ge=0, le=INT32_MAX),
    after: int | None = Query(None, ge=0, le=INT64_MAX),
) -> HttpResponse:
    found = scheduling.list_scheduled(request.auth, name, limit, after)
    return json_response(
        {
            "scheduled": [wire.scheduled_out(s) for s in found],
            "next_after": found[-1].id if found else None,
        }
    )


@api.delete("/scheduled/{scheduled_id}", response=schemas.ScheduledOut, tags=["scheduled"])
def cancel_scheduled(
    request: AuthedRequest, scheduled_id: int = Path(..., ge=0, le=INT64_MAX)
) -> HttpResponse:
    info = audit.audited(
        actor_of(request),
        "scheduled.cancel",
        str(scheduled_id),
        {},
        lambda: scheduling.cancel_scheduled(request.auth, scheduled_id),
        lambda i: {"topic": i.topic},
    )
    return json_response(wire.scheduled_out(info))


@api.post(
    "/scheduled/{scheduled_id}/deliver_now", response=schemas.ScheduledOut, tags=["scheduled"]
)
def deliver_now(
    request: AuthedRequest, scheduled_id: int = Path(..., ge=0, le=INT64_MAX)
) -> HttpResponse:
    info = audit.audited(
        actor_of(request),
        "scheduled.deliver_now",
        str(scheduled_id),
        {},
        lambda: scheduling.deliver_now(request.auth, scheduled_id),
        lambda i: {"topic": i.topic, "deliver_at_ms": i.deliver_at_ms},
    )
    return json_response(wire.scheduled_out(info))


@api.post("/scheduled/{scheduled_id}/reschedule", response=schemas.ScheduledOut, tags=["scheduled"])
def reschedule_scheduled(
    request: AuthedRequest,
    body: schemas.RescheduleIn,
    scheduled_id: int = Path(..., ge=0, le=INT64_MAX),
) -> HttpResponse:
    info = audit.audited(
        actor_of(request),
        "scheduled.reschedule",
        str(scheduled_id),
        {"deliver_at_ms": body.deliver_at_ms},
        lambda: scheduling.reschedule_scheduled(request.auth, scheduled_id, body.deliver_at_ms),
        lambda i: {"topic": i.topic},
    )
    return json_response(wire.scheduled_out(info))


@api.post("/groups/{group}/poll", response=schemas.PollOut, tags=["groups"])
async def poll(request: AuthedRequest, group: str, body: schemas.PollIn) -> HttpResponse:
    if body.member_id is not None:
        delivered = await delivery.deliver_messages_async(
            request.auth,
            group,
            body.topic,
            body.member_id,
            body.max_messages,
            auto_ack=body.auto_commit,
            max_wait_ms=body.max_wait_ms,
        )
        return json_response(
            {
                "group": delivered.group,
                "topic": delivered.topic,
                "messages": wire.deliveries_out(delivered.deliveries),
                "next_offsets": [],
                "committed": body.auto_commit,
                "member_id": delivered.member_id,
                "generation": delivered.generation,
                "filtered": delivered.filtered,
                "expired": delivered.expired,
            }
        )
    result = await groups.poll_messages_async(
        request.auth, group, body.topic, body.max_messages, body.auto_commit, body.max_wait_ms
    )
    return json_response(
        {
            "group": result.group,
            "topic": result.topic,
            "messages": [wire.message_out(m) for m in result.messages],
            "next_offsets": [
                {"partition": p, "offset": o} for p, o in sorted(result.next_offsets.items())
            ],
            "committed": result.committed,
            "expired": result.expired,
        }
    )


@api.post("/groups/{group}/commit", response=schemas.GroupTopicOut, tags=["groups"])
def commit(request: AuthedRequest, group: str, body: schemas.CommitIn) -> dict[str, Any]:
    offsets = {o.partition: o.offset for o in body.offsets}
    result = groups.commit_offsets(
        request.auth,
        group,
        body.topic,
        offsets,
        member_id=body.member_id,
        generation=body.generation,
    )
    return group_topic_out(result)


def settle_out(result: SettleResult) -> dict[str, Any]:
    return {
        "settled": result.settled,
        "stale": list(result.stale),
        "dead_lettered": result.dead_lettered,
    }


# Settling is on every consumer's hot path, so these run on the database threads (async edge).


@api.post("/groups/{group}/ack", response=schemas.SettleOut, tags=["delivery"])
async def ack(request: AuthedRequest, group: str, body: schemas.AckIn) -> dict[str, Any]:
    result = await dbthreads.run(delivery.ack_messages, request.auth, group, body.receipts)
    return settle_out(result)


@api.post("/groups/{group}/nack", response=schemas.SettleOut, tags=["delivery"])
async def nack(request: AuthedRequest, group: str, body: schemas.NackIn) -> dict[str, Any]:
    result = await dbthreads.run(
        delivery.nack_messages,
        request.auth,
        group,
        body.receipts,
        error=body.error,
        delay_ms=body.delay_ms,
    )
    return settle_out(result)


@api.post("/groups/{group}/reject", response=schemas.SettleOut, tags=["delivery"])
async def reject(request: AuthedRequest, group: str, body: schemas.RejectIn) -> dict[str, Any]:
    result = await dbthreads.run(
        delivery.reject_messages, request.auth, group, body.receipts, error=body.error
    )
    return settle_out(result)


@api.post("/groups/{group}/extend", response=schemas.SettleOut, tags=["delivery"])
async def extend(request: AuthedRequest, group: str, body: schemas.ExtendIn) -> dict[str, Any]:
    result = await dbthreads.run(
        delivery.extend_deadlines, request.auth, group, body.receipts, body.extend_ms
    )
    return settle_out(result)


@api.get("/groups/{group}/dlq", response=schemas.DeadLetterPageOut, tags=["dead letters"])
def list_dead_letters(
    request: AuthedRequest,
    group: str,
    topic: str | None = None,
    reason: schemas.DeadLetterReason | None = None,
    after_id: int | None = Query(None, ge=0, le=INT64_MAX),
    limit: int = Query(100, ge=0, le=INT32_MAX),
) -> HttpResponse:
    page = retries.list_dead_letters(
        request.auth, group, topic_name=topic, reason=reason, after_id=after_id, limit=limit
    )
    # Rendered directly: the stored values go out as orjson fragments (broker/wire.py).
    return json_response(
        {
            "items": [wire.dead_letter_out(d) for d in page.items],
            "total": page.total,
            "next_after_id": page.next_after_id,
        }
    )


@api.post("/groups/{group}/dlq/redrive", response=schemas.RedriveOut, tags=["dead letters"])
def redrive_dead_letters(
    request: AuthedRequest, group: str, body: schemas.DeadLetterSelectionIn
) -> dict[str, Any]:
    # ids is None exactly when the body selects all (the schema's rule).
    result = audit.audited(
        actor_of(request),
        "dlq.redrive",
        group,
        body.model_dump(),
        lambda: retries.redrive_dead_letters(
            request.auth, group, body.ids, topic_name=body.topic, reason=body.reason
        ),
        lambda r: {"redriven": r.redriven, "missing": len(r.missing)},
    )
    return {"redriven": result.redriven, "missing": list(result.missing)}


@api.post("/groups/{group}/dlq/purge", response=schemas.PurgeOut, tags=["dead letters"])
def purge_dead_letters(
    request: AuthedRequest, group: str, body: schemas.DeadLetterSelectionIn
) -> dict[str, Any]:
    purged = audit.audited(
        actor_of(request),
        "dlq.purge",
        group,
        body.model_dump(),
        lambda: retries.purge_dead_letters(
            request.auth, group, body.ids, topic_name=body.topic, reason=body.reason
        ),
        lambda n: {"purged": n},
    )
    return {"purged": purged}


# Redrive jobs: the throttled background redrive (core/redrives.py, docs/api.md#redrive-jobs).


def redrive_job_out(job: RedriveJobInfo) -> dict[str, Any]:
    out = dataclasses.asdict(job)
    out["topic"] = out.pop("topic_name")
    out["progress"] = job.progress
    return out


@api.post(
    "/groups/{group}/dlq/redrive-jobs",
    response={202: schemas.RedriveJobOut, 200: schemas.RedriveCountOut},
    tags=["dead letters"],
)
def start_redrive(
    request: AuthedRequest, group: str, body: schemas.RedriveJobIn
) -> Status[dict[str, Any]]:
    if body.dry_run:
        count = redrives.count_redrive(
            request.auth, group, body.ids, topic_name=body.topic, reason=body.reason
        )
        return Status(200, {"count": count})
    job = redrives.start_redrive(
        request.auth,
        group,
        body.ids,
        topic_name=body.topic,
        reason=body.reason,
        rate_per_second=body.rate_per_second,
    )
    return Status(202, redrive_job_out(job))


@api.get("/redrive-jobs/{job_id}", response=schemas.RedriveJobOut, tags=["dead letters"])
def get_redrive(
    request: AuthedRequest, job_id: int = Path(..., ge=0, le=INT64_MAX)
) -> dict[str, Any]:
    return redrive_job_out(redrives.get_redrive(request.auth, job_id))


@api.delete("/redrive-jobs/{job_id}", response=schemas.RedriveJobOut, tags=["dead letters"])
def cancel_redrive(
    request: AuthedRequest, job_id: int = Path(..., ge=0, le=INT64_MAX)
) -> dict[str, Any]:
    return redrive_job_out(redrives.cancel_redrive(request.auth, job_id))


@api.get(
    "/topics/{name}/partitions/{partition}/messages/{offset}/trace",
    response=schemas.TraceOut,
    tags=["messages"],
)
def get_trace(
    request: AuthedRequest,
    name: str,
    partition: int = Path(..., ge=0, le=INT32_MAX),
    offset: int = Path(..., ge=0, le=INT64_MAX),
) -> dict[str, Any]:
    events = trace.get_trace(request.auth, name, partition, offset)
    return {
        "topic": name,
        "partition": partition,
        "offset": offset,
        "events": [wire.trace_event_out(e) for e in events],
    }


@api.post("/groups/{group}/members", response={201: schemas.MemberOut}, tags=["groups"])
def join_group(request: AuthedRequest, group: str, body: schemas.JoinIn) -> Status[dict[str, Any]]:
    info = membership.join_group(
        request.auth,
        group,
        body.topic,
        body.member_id,
        filter=body.filter_spec(),
        start=body.start,
        start_timestamp_ms=body.start_timestamp_ms,
        client=body.client or "",
        host=f"rest {request.META.get('REMOTE_ADDR') or ''}".strip(),
    )
    return Status(201, member_out(info))


@api.post(
    "/groups/{group}/members/{member_id}/heartbeat", response=schemas.MemberOut, tags=["groups"]
)
def heartbeat(request: AuthedRequest, group: str, member_id: str) -> dict[str, Any]:
    return member_out(membership.heartbeat(request.auth, group, member_id))


@api.delete("/groups/{group}/members/{member_id}", response={204: None}, tags=["groups"])
def leave_group(request: AuthedRequest, group: str, member_id: str) -> Status[None]:
    membership.leave_group(request.auth, group, member_id)
    return Status(204, None)


@api.patch("/groups/{group}", response=schemas.GroupOut, tags=["groups"])
async def configure_group(
    request: AuthedRequest, group: str, body: schemas.GroupPatch
) -> dict[str, Any]:
    # Async because GET /groups/{group} is (one kind per path): the write is the writer's.
    info = await dbthreads.run(
        audit.audited,
        actor_of(request),
        "group.configure",
        group,
        body.model_dump(exclude_unset=True),
        lambda: groups.configure_group(
            request.auth,
            group,
            strategy=body.strategy,
            session_timeout_ms=body.session_timeout_ms,
            mode=body.mode,
            ordered=body.ordered,
            ack_deadline_ms=body.ack_deadline_ms,
            max_attempts=body.max_attempts,
            retry_delays_ms=body.retry_delays_ms,
        ),
    )
    return group_out(info)


@api.delete("/groups/{group}", response={204: None}, tags=["groups"])
async def delete_group(request: AuthedRequest, group: str, force: bool = False) -> Status[None]:
    await dbthreads.run(
        audit.audited,
        actor_of(request),
        "group.delete",
        group,
        {"force": force},
        lambda: groups.delete_group(request.auth, group, force=force),
    )
    return Status(204, None)


@api.post(
    "/groups/{group}/reset",
    response=schemas.GroupTopicOut | schemas.ResetPreviewOut,
    tags=["groups"],
)
def reset(request: AuthedRequest, group: str, body: schemas.ResetIn) -> dict[str, Any]:
    offsets = {o.partition: o.offset for o in body.offsets or []}
    if body.dry_run:
        # A preview changes nothing, so it is not audited.
        preview = groups.preview_reset(
            request.auth,
            group,
            body.topic,
            body.to,
            timestamp_ms=body.timestamp_ms,
            offsets=offsets,
            shift_by=body.shift_by,
        )
        return {
            "group": group,
            "topic": body.topic,
            "dry_run": True,
            "partitions": [dataclasses.asdict(row) for row in preview],
        }
    result = audit.audited(
        actor_of(request),
        "group.reset",
        f"{group}/{body.topic}",
        body.model_dump(exclude={"dry_run"}),
        lambda: groups.reset_offsets(
            request.auth,
            group,
            body.topic,
            body.to,
            timestamp_ms=body.timestamp_ms,
            offsets=offsets,
            shift_by=body.shift_by,
            force=body.force,
        ),
        lambda r: {"committed_total": r.committed_total, "lag": r.lag},
    )
    return group_topic_out(result)


@api.get("/groups", response=list[schemas.GroupOut], tags=["groups"])
async def list_groups(
    request: AuthedRequest, limit: int | None = ListLimit, after: str | None = ListAfter
) -> HttpResponse:
    def answer() -> bytes:
        found = groups.list_groups(request.auth, limit=limit, after=after)
        return orjson.dumps([group_out(g) for g in found])

    return await rendered_on_reader(answer)


@api.get("/groups/{group}", response=schemas.GroupOut, tags=["groups"])
async def describe_group(request: AuthedRequest, group: str) -> HttpResponse:
    return await rendered_on_reader(
        lambda: orjson.dumps(group_out(groups.describe_group(request.auth, group)))
    )


# History answers the last hour unless asked for another window (docs/metrics.md#history).
HISTORY_DEFAULT_MS = 3_600_000


@api.get("/topics/{name}/history", response=schemas.TopicHistoryOut, tags=["history"])
def topic_history(
    request: AuthedRequest,
    name: str,
    since_ms: int | None = Query(None, ge=0, le=INT64_MAX),
    until_ms: int | None = Query(None, ge=0, le=INT64_MAX),
) -> dict[str, Any]:
    since = log.now_ms() - HISTORY_DEFAULT_MS if since_ms is None else since_ms
    points = history.topic_series(request.auth, name, since, until_ms)
    return {"topic": name, "points": [dataclasses.asdict(p) for p in points]}


@api.get("/groups/{group}/history", response=schemas.GroupHistoryOut, tags=["history"])
def group_history(
    request: AuthedRequest,
    group: str,
    topic: str | None = None,
    since_ms: int | None = Query(None, ge=0, le=INT64_MAX),
    until_ms: int | None = Query(None, ge=0, le=INT64_MAX),
) -> dict[str, Any]:
    since = log.now_ms() - HISTORY_DEFAULT_MS if since_ms is None else since_ms
    points = history.group_series(request.auth, group, topic, since, until_ms)
    return {"group": group, "points": [dataclasses.asdict(p) for p in points]}


@api.get("/overview", response=schemas.OverviewOut, tags=["overview"])
async def overview(
    request: AuthedRequest,
    limit: int | None = ListLimit,
    topics_after: str | None = ListAfter,
    groups_after: str | None = ListAfter,
) -> HttpResponse:
    def answer() -> bytes:
        result = groups.overview(
            request.auth, limit=limit, topics_after=topics_after, groups_after=groups_after
        )
        return orjson.dumps(
            {
                "topics": [topic_out(t) for t in result.topics],
                "groups": [group_topic_out(g) for g in result.groups],
                "next_topics_after": result.next_topics_after,
                "next_groups_after": result.next_groups_after,
            }
        )

    return await rendered_on_reader(answer)


def api_key_out(info: ApiKeyInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "prefix": info.prefix,
        "permissions": [str(p) for p in info.permissions],
        "created_at_ms": info.created_at_ms,
        "created_by": info.created_by,
        "last_used_ms": info.last_used_ms,
        "revoked": info.revoked,
    }


@api.get("/keys", response=list[schemas.ApiKeyOut], tags=["keys"])
def list_api_keys(request: AuthedRequest) -> list[dict[str, Any]]:
    return [api_key_out(k) for k in keys.list_api_keys(request.auth)]


@api.post("/keys", response={201: schemas.ApiKeyCreatedOut}, tags=["keys"])
def create_api_key(request: AuthedRequest, body: schemas.ApiKeyIn) -> Status[dict[str, Any]]:
    def create() -> tuple[ApiKeyInfo, str]:
        permissions = [keys.parse_permission(text) for text in body.permissions]
        return keys.create_api_key(request.auth, body.name, permissions)

    info, secret = audit.audited(
        actor_of(request),
        "key.create",
        body.name,
        {"permissions": body.permissions},
        create,
        lambda created: {"prefix": created[0].prefix},
    )
    return Status(201, {**api_key_out(info), "secret": secret})


@api.delete("/keys/{name}", response=schemas.ApiKeyOut, tags=["keys"])
def revoke_api_key(request: AuthedRequest, name: str) -> dict[str, Any]:
    info = audit.audited(
        actor_of(request),
        "key.revoke",
        name,
        {},
        lambda: keys.revoke_api_key(request.auth, name),
    )
    return api_key_out(info)


def audit_out(info: AuditInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


@api.get("/audit", response=schemas.AuditPageOut, tags=["audit"])
def list_audit(
    request: AuthedRequest,
    actor: str | None = None,
    action: str | None = None,
    source: str | None = None,
    target: str | None = None,
    before_id: int | None = Query(None, ge=0, le=INT64_MAX),
    limit: int = Query(50, ge=0, le=INT32_MAX),
) -> dict[str, Any]:
    page = audit.list_audit(
        request.auth,
        actor=actor,
        action=action,
        source=source,
        target_contains=target,
        before_id=before_id,
        limit=limit,
    )
    return {"items": [audit_out(e) for e in page.items], "next_before_id": page.next_before_id}


def transaction_out(info: TransactionInfo) -> dict[str, Any]:
    body = dataclasses.asdict(info)
    body["topics"] = list(info.topics)
    body["check_url"] = info.check_url or None
    return body


def transaction_result_out(result: TransactionResult) -> dict[str, Any]:
    body = transaction_out(result.transaction)
    body["results"] = [{"topic": topic, **wire.append_out(r)} for topic, r in result.results]
    return body


@api.post("/transactions", response={201: schemas.TransactionOut}, tags=["transactions"])
async def begin_transaction(
    request: AuthedRequest, body: schemas.TransactionIn
) -> Status[dict[str, Any]]:
    # Begin, add and commit are a transactional producer's hot path: database threads, as ack.
    info = await transactions.call_async(
        transactions.begin_transaction,
        request.auth,
        body.producer_id,
        body.timeout_ms,
        body.check_url,
        body.topic,
        body.to_new_messages(),
    )
    return Status(201, transaction_out(info))


@api.get("/transactions", response=list[schemas.TransactionOut], tags=["transactions"])
def list_transactions(
    request: AuthedRequest,
    state: str | None = None,
    producer_id: str | None = None,
    limit: int = Query(100, ge=1, le=1000),
) -> list[dict[str, Any]]:
    found = transactions.list_transactions(request.auth, state, producer_id, limit)
    return [transaction_out(t) for t in found]


@api.get("/transactions/{transaction_id}", response=schemas.TransactionOut, tags=["transactions"])
def get_transaction(
    request: AuthedRequest, transaction_id: int = Path(..., ge=1, le=INT64_MAX)
) -> dict[str, Any]:
    return transaction_out(transactions.get_transaction(request.auth, transaction_id))


@api.post(
    "/transactions/{transaction_id}/messages",
    response=schemas.TransactionOut,
    tags=["transactions"],
)
async def add_transaction_messages(
    request: AuthedRequest,
    body: schemas.TransactionMessagesIn,
    transaction_id: int = Path(..., ge=1, le=INT64_MAX),
) -> dict[str, Any]:
    info = await transactions.call_async(
        transactions.add_messages,
        request.auth,
        transaction_id,
        body.topic,
        body.to_new_messages(),
    )
    return transaction_out(info)


@api.post(
    "/transactions/{transaction_id}/offsets", response=schemas.TransactionOut, tags=["transactions"]
)
def add_transaction_offsets(
    request: AuthedRequest,
    body: schemas.TransactionOffsetsIn,
    transaction_id: int = Path(..., ge=1, le=INT64_MAX),
) -> dict[str, Any]:
    offsets = {o.partition: o.offset for o in body.offsets}
    info = transactions.add_offsets(request.auth, transaction_id, body.group, body.topic, offsets)
    return transaction_out(info)


@api.post(
    "/transactions/{transaction_id}/acks", response=schemas.TransactionOut, tags=["transactions"]
)
def add_transaction_acks(
    request: AuthedRequest,
    body: schemas.TransactionAcksIn,
    transaction_id: int = Path(..., ge=1, le=INT64_MAX),
) -> dict[str, Any]:
    info = transactions.add_acks(request.auth, transaction_id, body.group, body.receipts)
    return transaction_out(info)


@api.post(
    "/transactions/{transaction_id}/commit",
    response=schemas.TransactionCommitOut,
    tags=["transactions"],
)
async def commit_transaction(
    request: AuthedRequest,
    transaction_id: int = Path(..., ge=1, le=INT64_MAX),
) -> HttpResponse:
    # Rendered directly, as produce's results are: a delayed message's fields only where set.
    result = await transactions.call_async(
        transactions.commit_transaction, request.auth, transaction_id
    )
    return json_response(transaction_result_out(result))


@api.post(
    "/transactions/{transaction_id}/rollback",
    response=schemas.TransactionOut,
    tags=["transactions"],
)
def rollback_transaction(
    request: AuthedRequest,
    transaction_id: int = Path(..., ge=1, le=INT64_MAX),
) -> dict[str, Any]:
    return transaction_out(transactions.rollback_transaction(request.auth, transaction_id))
