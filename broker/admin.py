"""Django admin: a read-only window on the broker's tables; writes go through the core."""

from django.contrib import admin

from broker import models


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(models.Topic)
class TopicAdmin(ReadOnlyAdmin):
    list_display = ("name", "partition_count", "capacity", "overflow_policy", "retention_ms")
    search_fields = ("name",)


@admin.register(models.Partition)
class PartitionAdmin(ReadOnlyAdmin):
    list_display = ("topic", "number", "start_offset", "next_offset", "bytes_stored")
    list_select_related = ("topic",)


@admin.register(models.ConsumerGroup)
class ConsumerGroupAdmin(ReadOnlyAdmin):
    list_display = ("name", "mode", "strategy", "ordered", "generation", "created_at")


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


@admin.register(models.InFlight)
class InFlightAdmin(ReadOnlyAdmin):
    list_display = ("group", "partition", "offset", "state", "member_id", "attempt", "deadline_ms")
    list_filter = ("state",)
    list_select_related = ("group", "partition__topic")


@admin.register(models.DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ("group", "topic", "partition_number", "offset", "reason", "attempts", "dead_ms")
    list_filter = ("reason",)
    list_select_related = ("group", "topic")
    exclude = ("value",)


@admin.register(models.TraceEvent)
class TraceEventAdmin(ReadOnlyAdmin):
    list_display = ("topic", "partition_number", "offset", "event", "group", "member_id", "at_ms")
    list_filter = ("event",)
    list_select_related = ("topic",)


@admin.register(models.ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    list_display = ("name", "prefix", "created_at", "revoked_at")
    exclude = ("key_hash",)
