"""Reads only the console pages need: page-wide counts in a few aggregate queries.

The console shows these on every refresh of the overview and the dead-letter page, over large
tables, so each figure is one aggregate in SQL rather than a walk over rows
(docs/console-ui.md#pages).
"""

from dataclasses import dataclass
from typing import Any

import orjson
from django.db.models import Count, F, Sum

from broker import models
from broker import settings as ferry_settings
from broker.core import browse, errors, groups, keys, log, periodic
from broker.core.records import GroupTopicTotals, Principal


@dataclass(frozen=True)
class ConsoleSummary:
    topics: int
    partitions: int
    # Messages stored now (end minus start offset, summed) and every message ever appended.
    message_count: int
    end_offset_total: int
    bytes_stored: int
    groups: int
    members: int
    dead_letters: int
    scheduled: int


@dataclass(frozen=True)
class GroupSummary:
    """A row of the groups list: offsets per topic, and how many members and dead letters."""

    name: str
    topics: tuple[GroupTopicTotals, ...]
    members: int
    dead_letters: int

    @property
    def lag(self) -> int:
        """Total over the topics' partitions."""
        return sum(t.lag for t in self.topics)

    @property
    def in_flight(self) -> int:
        return sum(t.in_flight for t in self.topics)

    @property
    def retry_waiting(self) -> int:
        return sum(t.retry_waiting for t in self.topics)


@dataclass(frozen=True)
class DeadLetterCount:
    group: str
    topic: str
    count: int


def summary(principal: Principal) -> ConsoleSummary:
    """Totals over the whole broker for the overview's cards."""
    keys.require_superuser(principal)
    partitions = models.Partition.objects.filter(topic__deleting_since_ms__isnull=True).aggregate(
        partitions=Count("id"),
        stored=Sum(F("next_offset") - F("start_offset")),
        ends=Sum("next_offset"),
        size=Sum("bytes_stored"),
    )
    return ConsoleSummary(
        topics=models.Topic.objects.filter(deleting_since_ms__isnull=True).count(),
        partitions=partitions["partitions"] or 0,
        message_count=partitions["stored"] or 0,
        end_offset_total=partitions["ends"] or 0,
        bytes_stored=partitions["size"] or 0,
        groups=models.ConsumerGroup.objects.count(),
        members=models.GroupMember.objects.count(),
        dead_letters=models.DeadLetter.objects.count(),
        scheduled=models.ScheduledMessage.objects.count(),
    )


def dead_letter_counts(principal: Principal) -> list[DeadLetterCount]:
    """How many dead letters each group holds per topic, by group then topic."""
    keys.require_superuser(principal)
    rows = (
        models.DeadLetter.objects.values("group__name", "topic__name")
        .annotate(count=Count("id"))
        .order_by("group__name", "topic__name")
    )
    return [
        DeadLetterCount(group=row["group__name"], topic=row["topic__name"], count=row["count"])
        for row in rows
    ]


def list_group_summaries(principal: Principal) -> list[GroupSummary]:
    """Every group with offsets or members on a visible topic, by name, in a few queries."""
    by_group = groups.list_group_totals(principal)
    members: dict[str, int] = {}
    for name, topic, count in (
        models.GroupMember.objects.values("group__name", "topic__name")
        .annotate(n=Count("id"))
        .values_list("group__name", "topic__name", "n")
    ):
        if keys.allows(principal, topic, "consume"):
            members[name] = members.get(name, 0) + count
            by_group.setdefault(name, [])
    dead: dict[str, int] = {}
    for name, topic, count in (
        models.DeadLetter.objects.values("group__name", "topic__name")
        .annotate(n=Count("id"))
        .values_list("group__name", "topic__name", "n")
    ):
        if keys.allows(principal, topic, "consume"):
            dead[name] = dead.get(name, 0) + count
    return [
        GroupSummary(
            name=name,
            topics=tuple(by_group[name]),
            members=members.get(name, 0),
            dead_letters=dead.get(name, 0),
        )
        for name in sorted(by_group)
    ]


@dataclass(frozen=True)
class MinuteStats:
    """One topic-minute of the Spark stats job (docs/pipeline.md#jobs)."""

    minute: str  # "2026-11-23T14:02Z", UTC
    messages: int
    bytes: int
    distinct_keys: int
    top_keys: tuple[tuple[str, int], ...]
    # Per reading group: (group, consume delay in ms or None, lag), from the broker's history.
    groups: tuple[tuple[str, int | None, int], ...] = ()


def _minute_stats(value: Any) -> MinuteStats | None:
    try:
        return MinuteStats(
            minute=str(value["minute"]),
            messages=int(value["messages"]),
            bytes=int(value["bytes"]),
            distinct_keys=int(value["distinct_keys"]),
            top_keys=tuple((str(t["key"]), int(t["count"])) for t in value.get("top_keys") or ()),
            groups=tuple(
                (
                    str(g["group"]),
                    None if g.get("consume_delay_ms") is None else int(g["consume_delay_ms"]),
                    int(g.get("lag") or 0),
                )
                for g in value.get("groups") or ()
            ),
        )
    except (KeyError, TypeError, ValueError):
        return None


def pipeline_stats(
    principal: Principal, topic_name: str, limit: int = 60
) -> tuple[MinuteStats, ...]:
    """The stats job's per-minute figures for a topic, newest minute first.

    The job writes them to FERRY_STATS_TOPIC keyed by the topic's name, so this is an index
    lookup; a minute written twice (a rerun over grown data) shows its newest figure. Empty
    when the job has not run, or the principal may not read the stats topic.
    """
    stats_topic = ferry_settings.get("STATS_TOPIC")
    if not keys.allows(principal, stats_topic, "consume"):
        return ()
    try:
        found = browse.search_messages(
            principal, stats_topic, key=topic_name, limit=min(browse.MAX_LIMIT, limit * 4)
        )
    except errors.TopicNotFound:
        return ()
    newest: dict[str, MinuteStats] = {}
    # search_messages answers newest first: the first figure seen for a minute is its newest.
    for message in found.items:
        if not message.is_json:
            continue
        figure = _minute_stats(orjson.loads(message.value))
        if figure is not None and figure.minute not in newest:
            newest[figure.minute] = figure
    return tuple(sorted(newest.values(), key=lambda f: f.minute, reverse=True)[:limit])


@dataclass(frozen=True)
class JobState:
    """A background job as the overview shows it: its last runs by any process, and whether it
    runs as often as it should (docs/console-ui.md#what-each-page-shows)."""

    name: str
    interval_s: float
    last_ok_ms: int | None
    last_ok_by: str
    last_failed_ms: int | None
    last_error: str
    # ok | failing (its last run failed) | late (no run for a while) | waiting (none yet)
    state: str


def _late_after_ms(job: periodic.Job) -> float:
    # A process writes a job's successes once a heartbeat interval (processes.record_job_run),
    # so a job is late only when it missed a few rounds beyond that: with a Celery worker or
    # beat stopped, every job turns late.
    heartbeat_s = float(ferry_settings.get("PROCESS_HEARTBEAT_SECONDS"))
    return (3 * job.interval_seconds + 2 * heartbeat_s) * 1000


def job_states() -> tuple[JobState, ...]:
    """Every job of core/periodic.py's table, from the runs the processes recorded."""
    now = log.now_ms()
    runs = {run.name: run for run in models.JobRun.objects.all()}
    # Until some process has been up longer than a job's lateness, no run yet is no news.
    first_start = min(
        models.BrokerProcess.objects.values_list("started_ms", flat=True), default=now
    )
    states = []
    for job in periodic.JOBS:
        run = runs.get(job.name)
        ok_ms = run.ok_ms if run else None
        failed_ms = run.failed_ms if run else None
        late_after = _late_after_ms(job)
        if failed_ms is not None and (ok_ms is None or failed_ms > ok_ms):
            state = "failing"
        elif ok_ms is not None:
            state = "ok" if now - ok_ms <= late_after else "late"
        else:
            state = "late" if now - first_start > late_after else "waiting"
        states.append(
            JobState(
                name=job.name,
                interval_s=job.interval_seconds,
                last_ok_ms=ok_ms,
                last_ok_by=run.ok_by if run else "",
                last_failed_ms=failed_ms,
                last_error=run.error if run else "",
                state=state,
            )
        )
    return tuple(states)
