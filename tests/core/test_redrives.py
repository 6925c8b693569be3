"""Redrive jobs: dry run, start, throttled chunks, progress, cancel (core/redrives.py)."""

from collections import Counter

import orjson
import pytest

from broker import models
from broker.core import delivery, errors, keys, log, membership, redrives, retries
from broker.core.records import NewMessage
from tests.concurrency.test_offsets import run_threads

CONSOLE = keys.CONSOLE


def make_dead(topic_name, n, group="g"):
    """n rejected messages of topic_name in group's dead-letter queue; returns their ids."""
    log.append_messages(CONSOLE, topic_name, [NewMessage(orjson.dumps(i)) for i in range(n)])
    # One member per topic: a member id belongs to one topic (issue 9, item 4).
    member = f"m-{topic_name}"
    membership.join_group(CONSOLE, group, topic_name, member)
    receipts: list[str] = []
    while len(receipts) < n:
        result = delivery.deliver_messages(CONSOLE, group, topic_name, member, 1000)
        receipts += [d.receipt for d in result.deliveries]
    delivery.reject_messages(CONSOLE, group, receipts, error="bad")
    return list(
        models.DeadLetter.objects.filter(group__name=group, topic__name=topic_name)
        .order_by("id")
        .values_list("id", flat=True)
    )


def age(job_id):
    """Pretend the job's last chunk ran long ago, so the next run may take another."""
    models.RedriveJob.objects.filter(id=job_id).update(updated_ms=0)


def redriven_events():
    return Counter(
        models.TraceEvent.objects.filter(event="redriven").values_list("offset", flat=True)
    )


def test_count_redrive__same_selection_as_redrive(topic_factory, key_factory):
    topic_factory("a")
    topic_factory("b")
    ids = make_dead("a", 3)
    make_dead("b", 2)
    assert redrives.count_redrive(CONSOLE, "g") == 5
    assert redrives.count_redrive(CONSOLE, "g", topic_name="a") == 3
    assert redrives.count_redrive(CONSOLE, "g", ids[:2]) == 2
    assert redrives.count_redrive(CONSOLE, "g", reason="expired") == 0
    only_a, _ = key_factory("consume:a")
    assert redrives.count_redrive(only_a, "g") == 3
    with pytest.raises(errors.PermissionDenied):
        redrives.count_redrive(only_a, "g", topic_name="b")
    with pytest.raises(errors.DeadLetterNotFound):
        redrives.count_redrive(CONSOLE, "g", [10**9])
    with pytest.raises(errors.GroupNotFound):
        redrives.count_redrive(CONSOLE, "nope")


def test_start_redrive__queues_a_job(topic_factory, key_factory):
    topic_factory("a")
    make_dead("a", 4)
    principal, _ = key_factory("consume:a", name="ops")
    job = redrives.start_redrive(principal, "g", topic_name="a", rate_per_second=10)
    assert (job.state, job.total, job.done, job.progress) == ("queued", 4, 0, 0.0)
    assert (job.group, job.topic_name, job.created_by, job.ids_count) == ("g", "a", "ops", None)
    assert redrives.get_redrive(principal, job.id) == job
    # Nothing moved yet: the job runs in the background.
    assert models.DeadLetter.objects.count() == 4


def test_start_redrive__bad_rate_and_empty(topic_factory):
    topic_factory("a")
    make_dead("a", 1)
    for rate in (0, 10**9):
        with pytest.raises(errors.InvalidRequest):
            redrives.start_redrive(CONSOLE, "g", rate_per_second=rate)
    assert models.RedriveJob.objects.count() == 0
    empty = redrives.start_redrive(CONSOLE, "g", reason="expired")
    assert (empty.state, empty.total, empty.progress) == ("done", 0, 1.0)


def test_start_redrive__restricted_key_gets_the_ids_it_sees(topic_factory, key_factory):
    topic_factory("a")
    topic_factory("b")
    ids = make_dead("a", 2)
    make_dead("b", 2)
    only_a, _ = key_factory("consume:a")
    job = redrives.start_redrive(only_a, "g")
    assert (job.total, job.ids_count) == (2, 2)
    redrives.run_redrive_jobs()
    assert not models.DeadLetter.objects.filter(id__in=ids).exists()
    assert models.DeadLetter.objects.filter(topic__name="b").count() == 2


def test_run_redrive_jobs__throttled_chunks(topic_factory, settings):
    settings.FERRY_REDRIVE_INTERVAL_SECONDS = 1.0
    topic_factory("a")
    make_dead("a", 25)
    job = redrives.start_redrive(CONSOLE, "g", rate_per_second=10)
    assert redrives.run_redrive_jobs() == 10
    info = redrives.get_redrive(CONSOLE, job.id)
    assert (info.state, info.done, info.progress) == ("running", 10, 0.4)
    # Within the interval a second run takes nothing: the rate holds whoever runs it.
    assert redrives.run_redrive_jobs() == 0
    age(job.id)
    assert redrives.run_redrive_jobs() == 10
    age(job.id)
    assert redrives.run_redrive_jobs() == 5
    info = redrives.get_redrive(CONSOLE, job.id)
    assert (info.state, info.done, info.missing, info.progress) == ("done", 25, 0, 1.0)
    assert info.finished_ms is not None
    assert models.DeadLetter.objects.count() == 0
    assert set(redriven_events().values()) == {1}
    # The redriven messages are delivered again.
    again = delivery.deliver_messages(CONSOLE, "g", "a", "m-a", 100)
    assert len(again.deliveries) == 25


def test_run_redrive_jobs__letters_dead_after_the_start_stay(topic_factory):
    topic_factory("a")
    make_dead("a", 2)
    job = redrives.start_redrive(CONSOLE, "g")
    models.DeadLetter.objects.update(dead_ms=job.created_ms + 1)
    redrives.run_redrive_jobs()
    assert models.DeadLetter.objects.count() == 2
    assert redrives.get_redrive(CONSOLE, job.id).state == "done"


def test_run_redrive_jobs__named_ids_purged_meanwhile_are_missing(topic_factory):
    topic_factory("a")
    ids = make_dead("a", 3)
    job = redrives.start_redrive(CONSOLE, "g", ids)
    retries.purge_dead_letters(CONSOLE, "g", [ids[0]])
    assert redrives.run_redrive_jobs() == 3
    info = redrives.get_redrive(CONSOLE, job.id)
    assert (info.state, info.done, info.missing, info.ids_count) == ("done", 2, 1, 3)


def test_run_redrive_jobs__failure_marks_the_job(topic_factory, monkeypatch):
    topic_factory("a")
    make_dead("a", 1)
    job = redrives.start_redrive(CONSOLE, "g")

    def boom(*args, **kwargs):
        raise errors.InvalidRequest("no way")

    monkeypatch.setattr(retries, "redrive_in_transaction", boom)
    assert redrives.run_redrive_jobs() == 0
    info = redrives.get_redrive(CONSOLE, job.id)
    assert (info.state, info.error) == ("failed", "no way")
    assert models.DeadLetter.objects.count() == 1


def test_cancel_redrive__stops_the_job(topic_factory, key_factory):
    topic_factory("a")
    make_dead("a", 30)
    job = redrives.start_redrive(CONSOLE, "g", rate_per_second=10)
    redrives.run_redrive_jobs()
    cancelled = redrives.cancel_redrive(CONSOLE, job.id)
    assert (cancelled.state, cancelled.done) == ("cancelled", 10)
    age(job.id)
    assert redrives.run_redrive_jobs() == 0
    assert models.DeadLetter.objects.count() == 20
    # Cancelling a finished job leaves it as it is.
    assert redrives.cancel_redrive(CONSOLE, job.id).state == "cancelled"
    with pytest.raises(errors.RedriveJobNotFound):
        redrives.cancel_redrive(CONSOLE, 10**9)


def test_get_and_list_redrives__visibility(topic_factory, key_factory):
    topic_factory("a")
    topic_factory("b")
    make_dead("a", 1)
    make_dead("b", 1)
    on_a = redrives.start_redrive(CONSOLE, "g", topic_name="a")
    on_b = redrives.start_redrive(CONSOLE, "g", topic_name="b")
    every = redrives.start_redrive(CONSOLE, "g")
    only_a, _ = key_factory("consume:a")
    admin, _ = key_factory("admin:*")
    assert [j.id for j in redrives.list_redrives(CONSOLE)] == [every.id, on_b.id, on_a.id]
    assert [j.id for j in redrives.list_redrives(only_a, "g")] == [on_a.id]
    assert len(redrives.list_redrives(admin, limit=2)) == 2
    assert redrives.list_redrives(CONSOLE, "other") == ()
    with pytest.raises(errors.RedriveJobNotFound):
        redrives.get_redrive(only_a, on_b.id)
    with pytest.raises(errors.RedriveJobNotFound):
        redrives.cancel_redrive(only_a, every.id)
    with pytest.raises(errors.InvalidRequest):
        redrives.list_redrives(CONSOLE, limit=0)


@pytest.mark.django_db(transaction=True)
def test_run_redrive_jobs__two_runners_never_redrive_a_letter_twice(topic_factory, settings):
    # No interval gate: both runners compete for every chunk.
    settings.FERRY_REDRIVE_INTERVAL_SECONDS = 0.0001
    settings.FERRY_MAX_REDRIVE_RATE_PER_SECOND = 100_000
    topic_factory("a")
    make_dead("a", 200)
    job = redrives.start_redrive(CONSOLE, "g", rate_per_second=100_000)
    # 0.0001 s x 100,000/s: chunks of 10 letters.
    handled = []

    def runner(n):
        while models.RedriveJob.objects.filter(id=job.id, state__in=redrives.ACTIVE).exists():
            handled.append(redrives.run_redrive_jobs())

    run_threads(runner, 2)
    info = redrives.get_redrive(CONSOLE, job.id)
    assert (info.state, info.done, info.missing) == ("done", 200, 0)
    assert sum(handled) == 200
    assert set(redriven_events().values()) == {1}
    assert len(redriven_events()) == 200
    assert models.DeadLetter.objects.count() == 0
