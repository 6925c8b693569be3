"""Group settings: check and change how a group assigns partitions and delivers messages.

It sits over membership (a new strategy rebalances the members under the group lock) and
answers with the group's description (info.describe_group).
"""

from django.db import transaction

from broker import models
from broker import settings as ferry_settings
from broker.core import assignment, errors, keys, membership
from broker.core.groups import info
from broker.core.records import GroupInfo, Principal

SESSION_TIMEOUT_MS_RANGE = (1_000, 3_600_000)
MAX_ATTEMPTS_RANGE = (1, 1000)
MAX_RETRY_LEVELS = 100


def _validate_settings(
    strategy: str | None,
    session_timeout_ms: int | None,
    mode: str | None,
    ack_deadline_ms: int | None,
    max_attempts: int | None,
    retry_delays_ms: list[int] | None,
) -> None:
    if strategy is not None and strategy not in assignment.STRATEGIES:
        raise errors.InvalidRequest(
            f"strategy is one of {', '.join(assignment.STRATEGIES)}.", strategy=strategy
        )
    if mode is not None and mode not in models.ConsumerGroup.Mode.values:
        modes = ", ".join(models.ConsumerGroup.Mode.values)
        raise errors.InvalidRequest(f"mode is one of {modes}.", mode=mode)
    low, high = SESSION_TIMEOUT_MS_RANGE
    if session_timeout_ms is not None and not low <= session_timeout_ms <= high:
        raise errors.InvalidRequest(
            f"session_timeout_ms is {low} to {high}.", session_timeout_ms=session_timeout_ms
        )
    if ack_deadline_ms is not None:
        validate_ack_deadline(ack_deadline_ms)
    low, high = MAX_ATTEMPTS_RANGE
    if max_attempts is not None and not low <= max_attempts <= high:
        raise errors.InvalidRequest(f"max_attempts is {low} to {high}.", max_attempts=max_attempts)
    if retry_delays_ms is not None:
        longest = ferry_settings.get("MAX_DELAY_SECONDS") * 1000
        if len(retry_delays_ms) > MAX_RETRY_LEVELS or not all(
            0 <= d <= longest for d in retry_delays_ms
        ):
            raise errors.InvalidRequest(
                f"retry_delays_ms is up to {MAX_RETRY_LEVELS} delays of 0 to {longest} ms "
                "(empty: RocketMQ's levels).",
            )


def configure_group(
    principal: Principal,
    group_name: str,
    *,
    strategy: str | None = None,
    session_timeout_ms: int | None = None,
    mode: str | None = None,
    ordered: bool | None = None,
    ack_deadline_ms: int | None = None,
    max_attempts: int | None = None,
    retry_delays_ms: list[int] | None = None,
) -> GroupInfo:
    """Change how a group assigns and delivers; a field left out (None) keeps its value.

    A new strategy rebalances at once; the mode changes only while the group has no members.
    An operator's action: it needs an 'admin:*' key (or the console), like managing keys.
    """
    keys.require_superuser(principal)
    membership.validate_group_name(group_name)
    _validate_settings(
        strategy, session_timeout_ms, mode, ack_deadline_ms, max_attempts, retry_delays_ms
    )
    given = {
        "strategy": strategy,
        "session_timeout_ms": session_timeout_ms,
        "mode": mode,
        "ordered": ordered,
        "ack_deadline_ms": ack_deadline_ms,
        "max_attempts": max_attempts,
        "retry_delays_ms": retry_delays_ms,
    }
    with transaction.atomic(durable=True):
        group = membership.locked_group(group_name)
        member_topics = set(
            models.GroupMember.objects.filter(group=group).values_list("topic_id", flat=True)
        )
        changed = [
            name
            for name, value in given.items()
            if value is not None and value != getattr(group, name)
        ]
        if "mode" in changed and member_topics:
            raise errors.GroupHasMembers(
                f"Group {group_name!r} has members: the mode changes only while it has none.",
                group=group_name,
            )
        for name in changed:
            setattr(group, name, given[name])
        if changed:
            group.save(update_fields=changed)
        if "strategy" in changed:
            for topic_id in sorted(member_topics):
                membership.rebalance(group, topic_id)
    return info.describe_group(principal, group_name)


def validate_ack_deadline(value_ms: int, name: str = "ack_deadline_ms") -> None:
    high = ferry_settings.get("MAX_ACK_DEADLINE_MS")
    if not 1000 <= value_ms <= high:
        raise errors.InvalidRequest(f"{name} is 1000 to {high}.", **{name: value_ms})
