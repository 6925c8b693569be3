"""The message browser: pages by partition, offset or time; search; one message; export; produce."""

import base64
import binascii
import datetime as dt
import json
from typing import Any
from urllib.parse import urlencode

import orjson
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect

from broker.core import browse, errors, log, topics, trace
from broker.core.records import BrowsedMessage, NewMessage
from dashboard import access, pages

PAGE_SIZE = 50
SEARCH_FIELDS = {"key": "Key", "id": "Message id", "tag": "Tag", "header": "Header (name=value)"}


def _timestamp_ms(request: HttpRequest) -> int | None:
    """The jump-to-time field: epoch ms from the page's script, else the typed time as UTC."""
    raw_ms = request.GET.get("timestamp_ms", "").strip()
    if raw_ms.lstrip("-").isdigit():
        return int(raw_ms)
    typed = request.GET.get("at", "").strip()
    if not typed:
        return None
    try:
        moment = dt.datetime.fromisoformat(typed)
    except ValueError:
        raise errors.InvalidRequest(f"{typed!r} is not a date and time.") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def _search(request: HttpRequest, name: str, partition: int | None) -> Any:
    field = request.GET.get("field", "key")
    text = request.GET.get("q", "")
    if field == "header":
        header_name, _, header_value = text.partition("=")
        conditions: dict[str, Any] = {"header": (header_name.strip(), header_value.strip())}
    else:
        conditions = {
            {"id": "client_id"}.get(field, field if field in SEARCH_FIELDS else "key"): text
        }
    return browse.search_messages(
        access.principal(request), name, partition=partition, limit=PAGE_SIZE, **conditions
    )


def _preview(m: BrowsedMessage) -> str:
    if m.is_json:
        return m.value.decode("utf-8", "replace")[:200]
    try:
        return m.value.decode("utf-8")[:200]
    except UnicodeDecodeError:
        return f"{len(m.value):,} bytes of binary: {m.value[:24].hex(' ')}…"


@access.console_view
def message_list(request: HttpRequest, name: str) -> HttpResponse:
    principal = access.principal(request)
    topic = topics.describe_topic(principal, name)
    context: dict[str, Any] = {
        "section": "topics",
        "topic": topic,
        "search_fields": SEARCH_FIELDS,
        "field": request.GET.get("field", "key"),
        "q": request.GET.get("q", ""),
        "order": request.GET.get("order", "newest"),
        "partition": request.GET.get("partition", ""),
        "offset": request.GET.get("offset", ""),
        "at": request.GET.get("at", ""),
    }
    try:
        partition = pages.optional_int(request.GET.get("partition"), "partition")
        if context["q"]:
            result = _search(request, name, partition)
            context.update(searched=True, result=result, items=result.items)
        else:
            page = browse.browse_messages(
                principal,
                name,
                partition=partition,
                offset=pages.optional_int(request.GET.get("offset"), "offset"),
                timestamp_ms=_timestamp_ms(request),
                newest_first=context["order"] != "oldest",
                limit=PAGE_SIZE,
                cursor=request.GET.get("cursor") or None,
            )
            context.update(items=page.items, **_cursor_links(request, page))
    except errors.BrokerError as exc:
        if isinstance(exc, errors.TopicNotFound):
            raise
        context.update(items=(), error=exc.message)
    context["rows"] = [(m, _preview(m)) for m in context["items"]]
    context["export_query"] = urlencode(
        {k: v for k, v in request.GET.items() if k in ("partition", "field", "q") and v}
    )
    return pages.render(request, "console/messages.html", context)


def _cursor_links(request: HttpRequest, page: Any) -> dict[str, str | None]:
    def link(cursor: str | None) -> str | None:
        if cursor is None:
            return None
        params = request.GET.copy()
        params["cursor"] = cursor
        return "?" + params.urlencode()

    return {
        "next_url": link(page.next_cursor),
        "prev_url": link(page.prev_cursor),
        "first_url": "?"
        + urlencode({k: v for k, v in request.GET.items() if k in ("partition", "order") and v})
        if request.GET.get("cursor")
        else None,
    }


def _shown(m: BrowsedMessage) -> dict[str, Any]:
    """How the page shows a value: pretty JSON, text, or hex and base64 for binary."""
    if m.is_json:
        try:
            return {"kind": "json", "text": json.dumps(orjson.loads(m.value), indent=2)}
        except orjson.JSONDecodeError:
            pass
    try:
        return {"kind": "text", "text": m.value.decode("utf-8")}
    except UnicodeDecodeError:
        return {
            "kind": "binary",
            "hex": m.value[:4096].hex(" ", 2),
            "base64": base64.b64encode(m.value).decode("ascii"),
            "truncated": len(m.value) > 4096,
        }


@access.console_view
def message_detail(request: HttpRequest, name: str, partition: int, offset: int) -> HttpResponse:
    principal = access.principal(request)
    message = browse.get_message(principal, name, partition, offset)
    return pages.render(
        request,
        "console/message.html",
        {
            "section": "topics",
            "topic_name": name,
            "m": message,
            "shown": _shown(message),
            "lifecycle": trace.get_trace(principal, name, partition, offset),
        },
    )


@access.console_view
def message_export(request: HttpRequest, name: str) -> HttpResponseBase:
    """A range (partition, from and to offsets) or a key / id / tag search as JSON lines."""
    field, text = request.GET.get("field", ""), request.GET.get("q", "")
    searched = text if text and field in ("key", "id", "tag") else None
    try:
        lines = browse.export_messages(
            access.principal(request),
            name,
            partition=pages.optional_int(request.GET.get("partition"), "partition"),
            from_offset=pages.optional_int(request.GET.get("from_offset"), "from_offset"),
            to_offset=pages.optional_int(request.GET.get("to_offset"), "to_offset"),
            key=searched if field == "key" else None,
            client_id=searched if field == "id" else None,
            tag=searched if field == "tag" else None,
        )
    except errors.BrokerError as exc:
        if isinstance(exc, errors.TopicNotFound):
            raise
        return HttpResponse(exc.message, status=400, content_type="text/plain")
    response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="{name}.jsonl"'
    return response


def _new_message(form: Any) -> NewMessage:
    headers: dict[str, str] = {}
    for line in form.get("headers", "").splitlines():
        if line.strip():
            header, sep, value = line.partition(":")
            if not sep:
                raise errors.InvalidRequest(f"Header lines are 'name: value', not {line!r}.")
            headers[header.strip()] = value.strip()
    text = form.get("value", "")
    encoding = form.get("encoding", "json")
    if encoding == "json":
        try:
            value, is_json = orjson.dumps(json.loads(text)), True
        except ValueError:
            raise errors.InvalidRequest("The value is not valid JSON; choose text.") from None
    elif encoding == "base64":
        try:
            value, is_json = base64.b64decode(text.strip(), validate=True), False
        except binascii.Error:
            raise errors.InvalidRequest("The value is not valid base64.") from None
    else:
        value, is_json = text.encode("utf-8"), False
    return NewMessage(
        value=value,
        is_json=is_json,
        key=form.get("key") or None,
        tag=form.get("tag") or None,
        headers=headers,
        partition=pages.optional_int(form.get("partition"), "partition"),
        client_id=form.get("client_id") or None,
    )


@access.console_operate
def message_produce(request: HttpRequest, name: str) -> HttpResponse:
    try:
        message = _new_message(request.POST)
    except errors.BrokerError as exc:
        access.flash_error(request, exc)
        return redirect("dashboard:messages", name=name)
    params = {
        "key": message.key,
        "tag": message.tag,
        "partition": message.partition,
        "headers": message.headers,
        "bytes": len(message.value),
    }
    results = access.perform(
        request,
        "message.produce",
        name,
        params,
        lambda: log.append_messages(access.principal(request), name, [message]),
        lambda r: (
            f"Produced a test message to {name}: partition {r[0].partition}, "
            f"offset {r[0].offset}{' (duplicate id)' if r[0].duplicate else ''}."
        ),
    )
    if results and results[0].partition is not None and results[0].offset is not None:
        return redirect(
            "dashboard:message", name=name, partition=results[0].partition, offset=results[0].offset
        )
    return redirect("dashboard:messages", name=name)
