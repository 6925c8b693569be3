"""The partitioned log: append (batches, dedup, capacity), read, offsets (retention.py trims).

See docs/architecture.md#life-of-a-message and #locks. Offsets are assigned under the partition
row lock inside the appending transaction, so they are contiguous and never reused.

The package: append.py (check and plan a batch, dedup, assign offsets, insert, truncate; the
clock, now_ms), delayed.py (a delayed message's due time, stored in the schedule with its
batch), purge.py (purge_topic) and read.py (fetch, long-poll, offsets by timestamp). Its public
names are re-exported here: callers use `log.<name>`.
"""

from broker.core.log.append import (
    INSERT_MESSAGES,
    MESSAGE_COLUMNS,
    append_in_transaction,
    append_messages,
    append_planned_in_transaction,
    checked_batch,
    in_partition,
    known_ids,
    message_size,
    met_stored_id,
    now_ms,
    truncate,
    unseen_ids_likely,
)
from broker.core.log.delayed import LEVELS_MS, due_ms
from broker.core.log.purge import purge_topic
from broker.core.log.read import (
    SELECT_MESSAGES,
    SELECT_PARTITION,
    first_offset_at,
    list_offsets,
    offset_for_timestamp,
    read_locked,
    read_messages,
    read_messages_async,
    read_partition,
    read_partition_ahead,
    validate_max_wait,
)

__all__ = [
    "INSERT_MESSAGES",
    "LEVELS_MS",
    "MESSAGE_COLUMNS",
    "SELECT_MESSAGES",
    "SELECT_PARTITION",
    "append_in_transaction",
    "append_messages",
    "append_planned_in_transaction",
    "checked_batch",
    "due_ms",
    "first_offset_at",
    "in_partition",
    "known_ids",
    "list_offsets",
    "message_size",
    "met_stored_id",
    "now_ms",
    "offset_for_timestamp",
    "purge_topic",
    "read_locked",
    "read_messages",
    "read_messages_async",
    "read_partition",
    "read_partition_ahead",
    "truncate",
    "unseen_ids_likely",
    "validate_max_wait",
]
