"""The partitioned log: append (batches, dedup, capacity), read, offsets (retention.py trims).

See docs/architecture.md#life-of-a-message and #locks. Offsets are assigned under the partition
row lock inside the appending transaction, so they are contiguous and never reused.

The package: append.py (check and plan a batch, dedup, assign offsets, insert, truncate; the
clock, now_ms) and read.py (fetch, long-poll, offsets by timestamp). Its public names are
re-exported here: callers use `log.<name>`.
"""

from broker.core.log.append import (
    INSERT_MESSAGES,
    MESSAGE_COLUMNS,
    append_in_transaction,
    append_messages,
    append_planned_in_transaction,
    checked_batch,
    known_ids,
    message_size,
    now_ms,
    truncate,
)
from broker.core.log.read import (
    SELECT_MESSAGES,
    SELECT_PARTITION,
    list_offsets,
    offset_for_timestamp,
    read_messages,
    read_messages_async,
    read_partition,
    validate_max_wait,
)

__all__ = [
    "INSERT_MESSAGES",
    "MESSAGE_COLUMNS",
    "SELECT_MESSAGES",
    "SELECT_PARTITION",
    "append_in_transaction",
    "append_messages",
    "append_planned_in_transaction",
    "checked_batch",
    "known_ids",
    "list_offsets",
    "message_size",
    "now_ms",
    "offset_for_timestamp",
    "read_messages",
    "read_messages_async",
    "read_partition",
    "truncate",
    "validate_max_wait",
]
