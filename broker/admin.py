"""Django admin: a read-only window on the broker's tables; writes go through the core.

Names instead of ids (every list joins what its rows name), times as dates in the viewer's
timezone, stored values shown as pretty JSON, text or hex, filters and search on every list.
Nothing here edits a row: offsets, leases and queues keep their invariants only through the core
(docs/console.md).
"""

import json
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from broker import models

PREVIEW_BYTES = 4096
LIST_PREVIEW_CHARS = 80


def ms_time(ms: int | None) -> datetime | None:
    """An epoch-milliseconds field as an aware datetime (the admin shows it in local time)."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def value_text(value: bytes | memoryview, is_json: bool, limit: int = PREVIEW_BYTES) -> str:
    """A stored value for people: pretty JSON, else UTF-8 text, else hex; cut at limit bytes."""
    raw = bytes(value)
    cut = raw[:limit]
    more = f"\n… ({len(raw):,} bytes)" if len(raw) > limit else ""
    if is_json and not more:
        try:
            return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
        except ValueError:
            pass
    try:
        return cut.decode() + more
    except UnicodeDecodeError:
        return "hex: " + cut.hex(" ") + more


def _time(field: str, description: str) -> Any:
    """A list/detail column showing the *_ms field as a date, sorted by the field."""

    @admin.display(description=description, ordering=field)
    def show(self: admin.ModelAdmin, obj: Any) -> datetime | None:
        return ms_time(getattr(obj, field))

    show.__name__ = f"{field}_time"
    return show


class ReadOnlyAdmin(admin.ModelAdmin):
    # Big tables: no second COUNT(*) over the unfiltered table on every page.
    show_full_result_count = False
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ValueAdmin(ReadOnlyAdmin):
    """For rows that carry a message's value: a preview in the list, the whole on the page."""

    @admin.display(description="value")
    def value_preview(self, obj: Any) -> str:
        text = value_text(obj.value, obj.is_json, LIST_PREVIEW_CHARS)
        text = " ".join(text.split())
        return text[:LIST_PREVIEW_CHARS] + ("…" if len(text) > LIST_PREVIEW_CHARS else "")

    @admin.display(description="value")
    def value_pretty(self, obj: Any) -> str:
        return format_html(
            '<pre style="white-space: pre-wrap; margin: 0">{}</pre>',
            value_text(obj.value, obj.is_json),
        )

    @admin.display(description="headers")
    def headers_pretty(self, obj: Any) -> str:
        return format_html("<pre style='margin: 0'>{}</pre>", json.dumps(obj.headers, indent=2))


@admin.register(models.Topic)
class TopicAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "partition_count",
        "capacity",
        "overflow_policy",
        "retention_ms",
        "message_ttl_ms",
        "trace",
        "created_at",
    )
    list_filter = ("overflow_policy", "trace")
    search_fields = ("name",)


@admin.register(models.Partition)
class PartitionAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "topic", "number", "start_offset", "next_offset", "bytes_stored")
    list_select_related = ("topic",)
    list_filter = ("topic",)
    search_fields = ("topic__name",)


@admin.register(models.Message)
class MessageAdmin(ValueAdmin):
    list_display = (
        "__str__",
        "timestamp",
        "key",
        "tag",
        "client_id",
        "size_bytes",
        "value_preview",
    )
    list_select_related = ("partition__topic",)
    list_filter = ("partition__topic", "is_json")
    search_fields = ("=key", "=client_id", "=tag")
    ordering = ("-id",)
    fields = (
        "partition",
        "offset",
        "timestamp",
        "key",
        "tag",
        "client_id",
        "size_bytes",
        "is_json",
        "headers_pretty",
        "value_pretty",
    )
    readonly_fields = fields
    timestamp = _time("timestamp_ms", "timestamp")


@admin.register(models.ProducedId)
class ProducedIdAdmin(ReadOnlyAdmin):
    list_display = ("client_id", "topic", "partition_number", "offset", "created")
    list_select_related = ("topic",)
    list_filter = ("topic",)
    search_fields = ("=client_id",)
    created = _time("created_ms", "created")


@admin.register(models.ScheduledMessage)
class ScheduledMessageAdmin(ValueAdmin):
    list_display = ("id", "topic", "due", "partition_number", "key", "tag", "value_preview")
    list_select_related = ("topic",)
    list_filter = ("topic",)
    search_fields = ("=key", "=client_id", "=tag")
    ordering = ("due_ms", "id")
    fields = (
        "topic",
        "due",
        "created",
        "partition_number",
        "key",
        "tag",
        "client_id",
        "is_json",
        "headers_pretty",
        "value_pretty",
    )
    readonly_fields = fields
    due = _time("due_ms", "due")
    created = _time("created_ms", "created")


@admin.register(models.ConsumerGroup)
class ConsumerGroupAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "mode",
        "strategy",
        "ordered",
        "ack_deadline_ms",
        "max_attempts",
        "generation",
        "created_at",
    )
    list_filter = ("mode", "strategy", "ordered")
    search_fields = ("name",)


@admin.register(models.GroupMember)
class GroupMemberAdmin(ReadOnlyAdmin):
    list_display = ("member_id", "group", "topic", "joined", "heartbeat")
    list_select_related = ("group", "topic")
    list_filter = ("topic",)
    search_fields = ("member_id", "group__name")
    joined = _time("joined_ms", "joined")
    heartbeat = _time("heartbeat_ms", "last heartbeat")


@admin.register(models.PartitionLease)
class PartitionLeaseAdmin(ReadOnlyAdmin):
    list_display = ("group", "partition", "member_id", "generation")
    list_select_related = ("group", "partition__topic")
    list_filter = ("partition__topic",)
    search_fields = ("group__name", "member_id")


@admin.register(models.GroupOffset)
class GroupOffsetAdmin(ReadOnlyAdmin):
    list_display = (
        "group",
        "partition",
        "subscriber",
        "committed_offset",
        "delivered_offset",
        "filtered_count",
        "updated_at",
    )
    list_select_related = ("group", "partition__topic")
    list_filter = ("partition__topic",)
    search_fields = ("group__name", "subscriber")


@admin.register(models.InFlight)
class InFlightAdmin(ReadOnlyAdmin):
    list_display = (
        "group",
        "partition",
        "offset",
        "last_offset",
        "state",
        "member_id",
        "attempt",
        "deadline",
    )
    list_filter = ("state", "partition__topic")
    list_select_related = ("group", "partition__topic")
    search_fields = ("group__name", "member_id")
    deadline = _time("deadline_ms", "deadline")


@admin.register(models.DeadLetter)
class DeadLetterAdmin(ValueAdmin):
    list_display = (
        "id",
        "group",
        "topic",
        "partition_number",
        "offset",
        "reason",
        "attempts",
        "dead",
        "last_error",
        "value_preview",
    )
    list_filter = ("reason", "topic")
    list_select_related = ("group", "topic")
    search_fields = ("group__name", "=key", "last_error")
    ordering = ("-id",)
    fields = (
        "group",
        "topic",
        "subscriber",
        "partition_number",
        "offset",
        "reason",
        "attempts",
        "last_error",
        "dead",
        "timestamp",
        "key",
        "tag",
        "client_id",
        "is_json",
        "headers_pretty",
        "value_pretty",
    )
    readonly_fields = fields
    dead = _time("dead_ms", "dead at")
    timestamp = _time("timestamp_ms", "timestamp")


@admin.register(models.TraceEvent)
class TraceEventAdmin(ReadOnlyAdmin):
    list_display = (
        "at",
        "topic",
        "partition_number",
        "offset",
        "event",
        "group",
        "member_id",
        "attempt",
    )
    list_filter = ("event", "topic")
    list_select_related = ("topic",)
    search_fields = ("group", "member_id")
    ordering = ("-id",)
    at = _time("at_ms", "at")


@admin.register(models.ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "prefix",
        "permission_list",
        "created_by",
        "created_at",
        "last_used",
        "revoked_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix", "created_by")
    exclude = ("key_hash", "permissions")
    readonly_fields = ("permission_list", "last_used")
    last_used = _time("last_used_ms", "last used")

    @admin.display(description="permissions")
    def permission_list(self, obj: models.ApiKey) -> str:
        return ", ".join(f"{p['action']}:{p['pattern']}" for p in obj.permissions)


@admin.register(models.AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "source", "action", "target", "outcome", "client_ip")
    list_filter = ("source", "outcome", "action")
    search_fields = ("actor", "action", "target")
    ordering = ("-at_ms", "-id")
    at = _time("at_ms", "at")


@admin.register(models.TopicSample)
class TopicSampleAdmin(ReadOnlyAdmin):
    list_display = (
        "topic",
        "at",
        "resolution_s",
        "end_offset_total",
        "message_count",
        "bytes_stored",
    )
    list_select_related = ("topic",)
    list_filter = ("resolution_s", "topic")
    search_fields = ("topic__name",)
    ordering = ("-at_ms", "-id")
    at = _time("at_ms", "at")


@admin.register(models.GroupSample)
class GroupSampleAdmin(ReadOnlyAdmin):
    list_display = (
        "group",
        "topic",
        "at",
        "resolution_s",
        "committed_total",
        "lag",
        "in_flight",
        "oldest_age_ms",
    )
    list_select_related = ("group", "topic")
    list_filter = ("resolution_s", "topic")
    search_fields = ("group__name", "topic__name")
    ordering = ("-at_ms", "-id")
    at = _time("at_ms", "at")


@admin.register(models.BrokerProcess)
class BrokerProcessAdmin(ReadOnlyAdmin):
    list_display = ("name", "kind", "version", "started", "heartbeat")
    list_filter = ("kind", "version")
    search_fields = ("name",)
    ordering = ("-heartbeat_ms",)
    started = _time("started_ms", "started")
    heartbeat = _time("heartbeat_ms", "last heartbeat")


@admin.register(models.RedriveJob)
class RedriveJobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "group",
        "topic_name",
        "reason",
        "state",
        "done",
        "missing",
        "total",
        "rate_per_second",
        "created_by",
        "created",
        "finished",
    )
    list_select_related = ("group",)
    list_filter = ("state",)
    search_fields = ("group__name", "created_by", "topic_name")
    ordering = ("-id",)
    created = _time("created_ms", "created")
    updated = _time("updated_ms", "updated")
    finished = _time("finished_ms", "finished")
