"""Consumer groups: committed offsets, poll, commit, lag and the overview (architecture.md).

A committed offset is the next offset the group reads (Kafka's convention). A group that has
never committed on a partition starts at the partition's start offset: seed 000's "consume the
topic from the beginning" (docs/decisions/0004-new-group-starts-at-earliest.md).

The package: positions.py (committed offsets: poll, commit; delete a group), reset.py (reset
and its preview), info.py (describe, list, overview: offsets, lag, members) and configure.py
(group settings: configure_group). It sits over membership (members, the group lock, leases).
Its public names are re-exported here: callers use `groups.<name>`.
"""

from broker.core.groups.configure import (
    MAX_ATTEMPTS_RANGE,
    MAX_RETRY_LEVELS,
    SESSION_TIMEOUT_MS_RANGE,
    configure_group,
    validate_ack_deadline,
)
from broker.core.groups.info import (
    describe_group,
    list_group_offsets,
    list_group_totals,
    list_groups,
    overview,
    settings_of,
)
from broker.core.groups.positions import (
    check_consume,
    commit_offsets,
    commit_offsets_in_transaction,
    delete_group,
    ensure_offsets,
    poll_messages,
    poll_messages_async,
    topic_for_consume,
)
from broker.core.groups.reset import RESET_TARGETS, preview_reset, reset_offsets

__all__ = [
    "MAX_ATTEMPTS_RANGE",
    "MAX_RETRY_LEVELS",
    "RESET_TARGETS",
    "SESSION_TIMEOUT_MS_RANGE",
    "check_consume",
    "commit_offsets",
    "commit_offsets_in_transaction",
    "configure_group",
    "delete_group",
    "describe_group",
    "ensure_offsets",
    "list_group_offsets",
    "list_group_totals",
    "list_groups",
    "overview",
    "poll_messages",
    "poll_messages_async",
    "preview_reset",
    "reset_offsets",
    "settings_of",
    "topic_for_consume",
    "validate_ack_deadline",
]
