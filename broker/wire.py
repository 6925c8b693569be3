"""JSON shapes of messages that every edge sends: REST responses, console lines, WebSocket frames.

Stored JSON values and headers go out as orjson fragments: spliced in as stored, never parsed
and re-serialised on the fetch hot path (docs/benchmarks.md).
"""

import base64
from collections.abc import Iterable
from typing import Any

import orjson

from broker.core.records import (
    AppendResult,
    DeadLetterInfo,
    Delivery,
    ScheduledInfo,
    StoredMessage,
    TraceInfo,
)

EMPTY_HEADERS = orjson.Fragment("{}")


def value_fields(value: bytes, is_json: bool) -> dict[str, Any]:
    """{"value": <the JSON>} for a JSON message, {"value_b64": "..."} for raw bytes."""
    out: dict[str, Any] = {}
    put_value(out, value, is_json)
    return out


def put_value(out: dict[str, Any], value: bytes, is_json: bool) -> None:
    """value_fields, set in out itself: a push renders one for every message it sends."""
    if is_json:
        out["value"] = orjson.Fragment(value)
    else:
        out["value_b64"] = base64.b64encode(value).decode()


def message_out(m: StoredMessage) -> dict[str, Any]:
    out = {
        "partition": m.partition,
        "offset": m.offset,
        "timestamp_ms": m.timestamp_ms,
        "key": m.key,
        "tag": m.tag,
        "headers": EMPTY_HEADERS if m.headers_json == "{}" else orjson.Fragment(m.headers_json),
        "id": m.client_id,
    }
    put_value(out, m.value, m.is_json)
    return out


def deliveries_out(deliveries: Iterable[Delivery]) -> list[dict[str, Any]]:
    """Messages handed to a member, each with what it needs to settle it: a push's or a poll's
    whole list, which the caller serialises in one call (docs/benchmarks.md, session 25)."""
    out = []
    for m, receipt, attempt, deadline_ms in deliveries:
        item = message_out(m)
        # An auto-acked delivery has nothing left to settle.
        item["receipt"] = receipt or None
        item["attempt"] = attempt
        item["deadline_ms"] = deadline_ms if receipt else None
        out.append(item)
    return out


def dead_letter_out(info: DeadLetterInfo) -> dict[str, Any]:
    """A dead letter with its original coordinates and the message as fetch shows it."""
    return {
        "id": info.id,
        "group": info.group,
        "topic": info.topic,
        # "" is the group's own offsets; broadcast mode names the member it failed for.
        "member": info.subscriber or None,
        "partition": info.partition,
        "offset": info.offset,
        "reason": info.reason,
        "attempts": info.attempts,
        "last_error": info.last_error,
        "dead_ms": info.dead_ms,
        "message": message_out(info.message),
    }


def trace_event_out(info: TraceInfo) -> dict[str, Any]:
    return {
        "at_ms": info.at_ms,
        "event": info.event,
        # Stored as "" when the event has no group (produced) or no member (retry, redrive).
        "group": info.group or None,
        "member_id": info.member_id or None,
        "attempt": info.attempt,
        "detail": info.detail,
    }


def scheduled_out(info: ScheduledInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "topic": info.topic,
        "deliver_at_ms": info.deliver_at_ms,
        "partition": info.partition,
        "key": info.key,
        "tag": info.tag,
        "headers": info.headers,
        # "id" is the scheduled id here; the client's message id goes by another name.
        "message_id": info.client_id,
        **value_fields(info.value, info.is_json),
    }


def append_out(r: AppendResult) -> dict[str, Any]:
    """Where a produced message went: its partition and offset, or, delayed, its scheduled id
    (the partition and offset come when it is released)."""
    if r.partition is not None:
        return {"partition": r.partition, "offset": r.offset, "duplicate": r.duplicate}
    return {
        "scheduled_id": r.scheduled_id,
        "deliver_at_ms": r.deliver_at_ms,
        "duplicate": r.duplicate,
    }
