"""What changed: a cheap fingerprint of the broker's state for the console's live pages.

See docs/console-ui.md#live-updates. Appends publish events, but acks, commits and redrives do
not (they are hot paths), so the live pages compare this fingerprint instead: one read of a
few sums and counts, at most once a second per server process, whatever the number of open
pages.
"""

from dataclasses import dataclass

from django.db import connection

# One statement, so a check costs one round trip. Every figure is an aggregate over a small
# table (partitions, group offsets) or an indexed max/count; no message table is read.
_FINGERPRINT_SQL = """
SELECT
  (SELECT COALESCE(SUM(next_offset), 0) + COALESCE(SUM(start_offset), 0)
     + COALESCE(SUM(bytes_stored), 0) + COUNT(*) FROM broker_partition),
  (SELECT COALESCE(SUM(committed_offset), 0) + COALESCE(SUM(delivered_offset), 0)
     + COUNT(*) FROM broker_groupoffset),
  (SELECT COUNT(*) FROM broker_inflight),
  (SELECT COUNT(*) + COALESCE(MAX(heartbeat_ms) / 5000, 0) FROM broker_groupmember),
  (SELECT COUNT(*) + COALESCE(MAX(id), 0) FROM broker_deadletter),
  (SELECT COUNT(*) + COALESCE(MAX(id), 0) FROM broker_scheduledmessage),
  (SELECT COALESCE(MAX(id), 0) FROM broker_auditentry),
  (SELECT COALESCE(MAX(updated_ms), 0) FROM broker_redrivejob),
  (SELECT COUNT(*) + COALESCE(MAX(id), 0) FROM broker_topic),
  (SELECT COUNT(*) + COALESCE(SUM(message_count), 0) + COALESCE(SUM(checks), 0)
     FROM broker_transaction WHERE state = 'open')
     + (SELECT COALESCE(MAX(id), 0) FROM broker_transaction)
"""

AREAS = (
    "topics",
    "groups",
    "in_flight",
    "members",
    "dead_letters",
    "scheduled",
    "audit",
    "redrives",
    "topic_list",
    "transactions",
)


@dataclass(frozen=True)
class Fingerprint:
    """One number per area of the broker; an area changed when its number did."""

    values: tuple[int, ...]

    def changed_since(self, earlier: "Fingerprint | None") -> tuple[str, ...]:
        if earlier is None:
            return ()
        return tuple(
            area
            for area, now, before in zip(AREAS, self.values, earlier.values, strict=True)
            if now != before
        )


def fingerprint() -> Fingerprint:
    """The broker's state in a few numbers (no permission: it reveals only that things moved)."""
    with connection.cursor() as cursor:
        cursor.execute(_FINGERPRINT_SQL)
        row = cursor.fetchone()
    return Fingerprint(tuple(int(v or 0) for v in row))
