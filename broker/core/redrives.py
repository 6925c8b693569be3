"""Redrive jobs: dead letters sent back to their group in the background, throttled, with
progress (docs/api.md#redrive-jobs, docs/architecture.md#background-jobs).

start_redrive records a job; run_redrive_jobs (a core/periodic.py job) redrives the next chunk
of each running job, at most rate_per_second x FERRY_REDRIVE_INTERVAL_SECONDS letters, in id
order, through retries.redrive_in_transaction: the same redrive as POST .../dlq/redrive.
A chunk and its job's progress commit in one transaction that holds the job's row lock, so two
runners never work one job at once (SKIP LOCKED on PostgreSQL, BEGIN IMMEDIATE on SQLite).
"""

import logging

from django.db import DatabaseError, transaction

from broker import models
from broker import settings as ferry_settings
from broker.core import errors, inflight, keys, log, retries
from broker.core.records import Principal, RedriveJobInfo

logger = logging.getLogger(__name__)

ACTIVE = (models.RedriveJob.State.QUEUED, models.RedriveJob.State.RUNNING)
MAX_ERROR_CHARS = 2000
MAX_LIST = 200


def _info(job: models.RedriveJob) -> RedriveJobInfo:
    return RedriveJobInfo(
        id=job.id,
        group=job.group.name,
        topic_name=job.topic_name,
        reason=job.reason,
        ids_count=None if job.ids is None else len(job.ids),
        rate_per_second=job.rate_per_second,
        total=job.total,
        done=job.done,
        missing=job.missing,
        state=job.state,
        error=job.error,
        created_by=job.created_by,
        created_ms=job.created_ms,
        updated_ms=job.updated_ms,
        finished_ms=job.finished_ms,
    )


def count_redrive(
    principal: Principal,
    group_name: str,
    ids: list[int] | None = None,
    *,
    topic_name: str | None = None,
    reason: str | None = None,
) -> int:
    """The dry run: how many dead letters a redrive of this selection would take."""
    return retries.select_dead_letters(
        principal, group_name, ids, topic_name=topic_name, reason=reason
    ).count()


def start_redrive(
    principal: Principal,
    group_name: str,
    ids: list[int] | None = None,
    *,
    topic_name: str | None = None,
    reason: str | None = None,
    rate_per_second: int = 500,
) -> RedriveJobInfo:
    """Queue a background redrive of a selection (ids, or all matching topic and reason).

    A selection by filter takes the letters dead when the job starts, not those that die while
    it runs (a redriven message that fails again is not redriven again). When the key may not
    consume every topic of the group's queue, the job is given the ids it may see.
    """
    ceiling = int(ferry_settings.get("MAX_REDRIVE_RATE_PER_SECOND"))
    if not 1 <= rate_per_second <= ceiling:
        raise errors.InvalidRequest(
            f"rate_per_second is 1 to {ceiling}.", rate_per_second=rate_per_second
        )
    now = log.now_ms()
    with transaction.atomic(durable=True):
        letters = retries.select_dead_letters(
            principal, group_name, ids, topic_name=topic_name, reason=reason
        )
        total = letters.count()
        group = models.ConsumerGroup.objects.get(name=group_name)
        chosen = sorted(set(ids)) if ids is not None else None
        if chosen is None and not principal.is_system:
            everything = models.DeadLetter.objects.filter(group=group)
            if topic_name is not None:
                everything = everything.filter(topic__name=topic_name)
            if reason is not None:
                everything = everything.filter(reason=reason)
            if everything.count() != total:
                chosen = list(letters.order_by("id").values_list("id", flat=True))
        done = total == 0
        job = models.RedriveJob.objects.create(
            group=group,
            ids=chosen,
            topic_name=topic_name,
            reason=reason,
            rate_per_second=rate_per_second,
            total=total,
            state=models.RedriveJob.State.DONE if done else models.RedriveJob.State.QUEUED,
            created_by=principal.name,
            created_ms=now,
            updated_ms=now,
            finished_ms=now if done else None,
        )
    return _info(job)


def run_redrive_jobs() -> int:
    """Redrive the next chunk of every queued or running job; returns how many letters."""
    handled = 0
    for job_id in (
        models.RedriveJob.objects.filter(state__in=ACTIVE)
        .order_by("id")
        .values_list("id", flat=True)
    ):
        handled += _run_chunk(job_id)
    return handled


def _run_chunk(job_id: int) -> int:
    interval_s = float(ferry_settings.get("REDRIVE_INTERVAL_SECONDS"))
    now = log.now_ms()
    try:
        with transaction.atomic(durable=True):
            # The job row lock serializes the runners of one job; a job another runner holds
            # is skipped (it is the first lock a chunk takes: docs/architecture.md#locks).
            job = (
                models.RedriveJob.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("group")
                .filter(id=job_id, state__in=ACTIVE)
                .first()
            )
            if job is None:
                return 0
            # One chunk per interval, however many runners: the rate holds.
            if job.state == models.RedriveJob.State.RUNNING and (
                now - job.updated_ms < interval_s * 1000 / 2
            ):
                return 0
            handled, topic_ids = _chunk(job, max(1, int(job.rate_per_second * interval_s)), now)
    except DatabaseError:
        raise  # busy or gone: the next round retries
    except Exception as exc:
        logger.exception("redrive job %s failed", job_id)
        with transaction.atomic(durable=True):
            models.RedriveJob.objects.filter(id=job_id, state__in=ACTIVE).update(
                state=models.RedriveJob.State.FAILED,
                error=str(exc)[:MAX_ERROR_CHARS] or type(exc).__name__,
                updated_ms=now,
                finished_ms=now,
            )
        return 0
    for topic_id in topic_ids:
        inflight.wake(topic_id)
    return handled


def _chunk(job: models.RedriveJob, size: int, now: int) -> tuple[int, set[int]]:
    """Redrive up to size letters after the job's cursor; caller holds the job's row lock."""
    letters = models.DeadLetter.objects.filter(group=job.group, id__gt=job.cursor_id)
    named: list[int] = []
    if job.ids is not None:
        named = [i for i in job.ids if i > job.cursor_id][:size]
        letters = letters.filter(id__in=named)
    else:
        letters = letters.filter(dead_ms__lte=job.created_ms)
        if job.topic_name is not None:
            letters = letters.filter(topic__name=job.topic_name)
        if job.reason is not None:
            letters = letters.filter(reason=job.reason)
    chunk = list(letters.select_related("group", "topic").order_by("id")[:size])
    # The job acts for its creator: the trace says who redrove (checked when it started).
    by = Principal(name=job.created_by, is_system=True)
    result, topic_ids = retries.redrive_in_transaction(by, chunk, now)
    found = {letter.id for letter in chunk}
    # Named letters purged meanwhile count as missing, like those retention removed.
    gone = [i for i in named if i not in found]
    job.done += result.redriven
    job.missing += len(result.missing) + len(gone)
    job.cursor_id = max([job.cursor_id, *found, *named])
    job.updated_ms = now
    last = len(named) < size if job.ids is not None else len(chunk) < size
    if last or (job.ids is not None and job.cursor_id >= max(job.ids, default=0)):
        job.state = models.RedriveJob.State.DONE
        job.finished_ms = now
    else:
        job.state = models.RedriveJob.State.RUNNING
    job.save(update_fields=["done", "missing", "cursor_id", "updated_ms", "state", "finished_ms"])
    return result.redriven + len(result.missing) + len(gone), topic_ids


def _visible(principal: Principal, job: models.RedriveJob) -> bool:
    """A job is its creator's, an admin:* key's, or any key's that may consume its topic."""
    if principal.is_system or principal.name == job.created_by:
        return True
    if job.topic_name is not None and keys.allows(principal, job.topic_name, "consume"):
        return True
    try:
        keys.require_superuser(principal)
    except errors.PermissionDenied:
        return False
    return True


def get_redrive(principal: Principal, job_id: int) -> RedriveJobInfo:
    """A redrive job and its progress; RedriveJobNotFound if unknown or not the principal's."""
    job = models.RedriveJob.objects.select_related("group").filter(id=job_id).first()
    if job is None or not _visible(principal, job):
        raise errors.RedriveJobNotFound(id=job_id)
    return _info(job)


def list_redrives(
    principal: Principal, group_name: str | None = None, limit: int = 20
) -> tuple[RedriveJobInfo, ...]:
    """The newest redrive jobs the principal may see, of one group or all."""
    if not 1 <= limit <= MAX_LIST:
        raise errors.InvalidRequest(f"limit is 1 to {MAX_LIST}.", limit=limit)
    jobs = models.RedriveJob.objects.select_related("group").order_by("-id")
    if group_name is not None:
        jobs = jobs.filter(group__name=group_name)
    found: list[RedriveJobInfo] = []
    # Batches, so a key that sees few jobs still gets up to limit of them.
    for job in jobs.iterator(chunk_size=limit * 4):
        if _visible(principal, job):
            found.append(_info(job))
            if len(found) == limit:
                break
    return tuple(found)


def cancel_redrive(principal: Principal, job_id: int) -> RedriveJobInfo:
    """Stop a queued or running job after its current chunk; a finished job is left as it is."""
    now = log.now_ms()
    with transaction.atomic(durable=True):
        # Waits for a chunk in progress: the job row lock is held across each chunk.
        job = (
            models.RedriveJob.objects.select_for_update(of=("self",))
            .select_related("group")
            .filter(id=job_id)
            .first()
        )
        if job is None or not _visible(principal, job):
            raise errors.RedriveJobNotFound(id=job_id)
        if job.state in ACTIVE:
            job.state = models.RedriveJob.State.CANCELLED
            job.updated_ms = job.finished_ms = now
            job.save(update_fields=["state", "updated_ms", "finished_ms"])
    return _info(job)
