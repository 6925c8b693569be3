"""Retention: delete messages past their topic's time or size limit, forget old client ids.

See docs/semantics.md#producing. Runs in the background (core/periodic.py) in bounded batches,
each under the partition's lock, advancing the start offset; offsets are never reused.
"""

from django.db import transaction

from broker import models
from broker import settings as ferry_settings
from broker.core import log


def apply_retention(batch_size: int = 10_000) -> int:
    """Delete messages past their topic's retention time or size; returns how many went."""
    removed = 0
    cutoff_now = log.now_ms()
    # Not topics marked for deletion: run_topic_deletions owns their rows.
    topics_with_retention = models.Topic.objects.exclude(
        retention_ms__isnull=True, retention_bytes__isnull=True
    ).filter(deleting_since_ms__isnull=True)
    for topic in topics_with_retention:
        for partition_id in topic.partitions.values_list("id", flat=True):
            # Bounded batches keep each lock short; a long backlog takes several rounds.
            while (count := _retain_partition(topic, partition_id, cutoff_now, batch_size)) > 0:
                removed += count
                if count < batch_size:
                    break
    return removed


def _retain_partition(topic: models.Topic, partition_id: int, now: int, batch_size: int) -> int:
    with transaction.atomic(durable=True):
        # Partition lock: retention moves start_offset, which appends and drop_oldest also move.
        p = models.Partition.objects.select_for_update(no_key=True).filter(id=partition_id).first()
        if p is None or p.start_offset == p.next_offset:
            return 0
        new_start = p.start_offset
        if topic.retention_ms is not None:
            kept = log.first_offset_at(p.id, now - topic.retention_ms)
            new_start = p.next_offset if kept is None else max(new_start, kept)
        if topic.retention_bytes is not None and p.bytes_stored > topic.retention_bytes:
            excess = p.bytes_stored - topic.retention_bytes
            sizes = (
                models.Message.objects.filter(partition_id=p.id, offset__gte=p.start_offset)
                .order_by("offset")
                .values_list("offset", "size_bytes")
            )
            for offset, size in sizes.iterator(chunk_size=2000):
                if excess <= 0:
                    break
                excess -= size
                new_start = max(new_start, offset + 1)
        new_start = min(new_start, p.start_offset + batch_size)
        removed = log.truncate(p, new_start)
        if removed:
            p.save(update_fields=["start_offset", "bytes_stored"])
    return removed


def purge_produced_ids() -> int:
    """Forget client message ids older than the dedup window."""
    cutoff_ms = log.now_ms() - ferry_settings.get("DEDUP_WINDOW_SECONDS") * 1000
    with transaction.atomic(durable=True):
        deleted, _ = models.ProducedId.objects.filter(created_ms__lt=cutoff_ms).delete()
    return deleted
