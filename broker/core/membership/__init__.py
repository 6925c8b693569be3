"""Group membership: join, heartbeat, leave, expiry, and the partition leases a rebalance hands out.

See docs/semantics.md#membership. A rebalance runs under the group row's lock, bumps the
group's generation and rewrites the (group, partition) lease rows; a lease row holds one member,
so two members never hold one partition, whichever broker process serves them.

The package: sessions.py (join, heartbeat, leave, expiry, what a member holds), rebalancing.py
(the group lock, rebalances) and configure.py (configure_group). Its public names are
re-exported here: callers use `membership.<name>`.
"""

from broker.core.membership.configure import (
    MAX_ATTEMPTS_RANGE,
    MAX_RETRY_LEVELS,
    SESSION_TIMEOUT_MS_RANGE,
    configure_group,
)
from broker.core.membership.rebalancing import locked_group, rebalance, rebalance_topic
from broker.core.membership.sessions import (
    MEMBER_ID_MAX,
    START_POSITIONS,
    expire_members,
    find_group,
    heartbeat,
    held_partitions,
    join_group,
    leave_group,
    list_members,
    touch_member,
)

__all__ = [
    "MAX_ATTEMPTS_RANGE",
    "MAX_RETRY_LEVELS",
    "MEMBER_ID_MAX",
    "SESSION_TIMEOUT_MS_RANGE",
    "START_POSITIONS",
    "configure_group",
    "expire_members",
    "find_group",
    "heartbeat",
    "held_partitions",
    "join_group",
    "leave_group",
    "list_members",
    "locked_group",
    "rebalance",
    "rebalance_topic",
    "touch_member",
]
