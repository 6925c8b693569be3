"""Group membership: join, heartbeat, leave, expiry, and the partition leases a rebalance hands out.

See docs/semantics.md#membership. A rebalance runs under the group row's lock, bumps the
group's generation and rewrites the (group, partition) lease rows; a lease row holds one member,
so two members never hold one partition, whichever broker process serves them.

The package: sessions.py (group and member names; join, heartbeat, leave, expiry, what a member
holds) and rebalancing.py (the group lock, rebalances; a topic altered, and its groups
rebalanced when its partitions grow). Its public names are re-exported here: callers use
`membership.<name>`. Group settings (groups.configure_group) and group offsets sit a layer up.
"""

from broker.core.membership.rebalancing import (
    alter_topic,
    locked_group,
    rebalance,
    rebalance_topic,
)
from broker.core.membership.sessions import (
    MEMBER_ID_MAX,
    START_POSITIONS,
    expire_members,
    find_group,
    heartbeat,
    heartbeat_due,
    held_partitions,
    join_group,
    leave_group,
    list_members,
    list_members_by_group,
    touch_member,
    touch_member_of_topic,
    validate_group_name,
)

__all__ = [
    "MEMBER_ID_MAX",
    "START_POSITIONS",
    "alter_topic",
    "expire_members",
    "find_group",
    "heartbeat",
    "heartbeat_due",
    "held_partitions",
    "join_group",
    "leave_group",
    "list_members",
    "list_members_by_group",
    "locked_group",
    "rebalance",
    "rebalance_topic",
    "touch_member",
    "touch_member_of_topic",
    "validate_group_name",
]
