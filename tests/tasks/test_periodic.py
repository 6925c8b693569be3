"""The periodic table drives both runners: Celery beat and the in-process thread."""

import time
from collections.abc import Callable

import orjson
import pytest
from celery.signals import worker_ready
from channels.db import database_sync_to_async
from django.db.utils import OperationalError

from broker import background, models, tasks
from broker.core import (
    delivery,
    groups,
    keys,
    log,
    membership,
    periodic,
    processes,
    redrives,
    trace,
)
from broker.core.records import NewMessage
from mqsite.celery import app


def test_beat_schedule__one_entry_per_job():
    app.loader.import_default_modules()
    schedule = app.conf.beat_schedule
    assert set(schedule) == {job.name for job in periodic.JOBS}
    for job in periodic.JOBS:
        assert schedule[job.name]["task"] == "broker.run_periodic_job"
        assert schedule[job.name]["args"] == (job.name,)
        # Rounds beat sent while no worker took them do not pile up in Redis (docs/operations.md).
        assert schedule[job.name]["options"] == {"expires": max(1.0, job.interval_seconds)}


def test_run_periodic_job__applies_retention(topic_factory, console):
    topic = topic_factory(retention_ms=1000)
    log.append_messages(console, topic.name, [NewMessage(value=orjson.dumps(i)) for i in range(3)])
    models.Message.objects.update(timestamp_ms=1)
    assert tasks.run_periodic_job.apply(args=("apply_retention",)).get() == 3
    assert tasks.run_periodic_job.apply(args=("apply_retention",)).get() == 0


def test_background_start__off_in_tests(settings):
    settings.FERRY_BACKGROUND_IN_PROCESS = False
    assert background.start() is False


calls: list[int] = []


def record_call() -> int:
    calls.append(1)
    if len(calls) == 2:
        raise RuntimeError("a failing round must not stop the runner")
    return len(calls)


def run_job_until(settings, name: str, function: str, done: Callable[[], bool]) -> None:
    """A Runner of one job every 20 ms, until done() (5 s at most)."""
    settings.FERRY_RETENTION_INTERVAL_SECONDS = 0.02
    job = periodic.Job(name, f"tests.tasks.test_periodic.{function}", "RETENTION_INTERVAL_SECONDS")
    runner = background.Runner((job,))
    runner.start()
    deadline = time.monotonic() + 5
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()


def test_runner__runs_jobs_repeatedly_and_survives_errors(settings, caplog, transactional_db):
    run_job_until(settings, "record", "record_call", lambda: len(calls) >= 4)
    assert len(calls) >= 4
    assert "background job record failed" in caplog.text
    # The overview's Background jobs table: the failure, then the success right after it.
    run = models.JobRun.objects.get(name="record")
    assert run.error == "RuntimeError: a failing round must not stop the runner"
    assert run.ok_ms is not None
    assert run.failed_ms is not None
    assert run.ok_ms >= run.failed_ms
    assert "recording background job" not in caplog.text


def unreachable_database() -> int:
    raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")


def test_runner__a_database_outage_is_one_line_a_round_without_a_traceback(
    settings, caplog, transactional_db
):
    """As a failed request's (docs/operations.md): the operator reads what is down, not a
    traceback every second for as long as it is."""
    run_job_until(
        settings, "away", "unreachable_database", lambda: "background job away" in caplog.text
    )
    lines = [r for r in caplog.records if r.getMessage().startswith("background job away")]
    assert lines
    assert all(r.levelname == "WARNING" and r.exc_info is None for r in lines)
    assert lines[0].getMessage() == (
        "background job away: unavailable (connection to server at 127.0.0.1 failed: "
        "Connection refused); the next round retries"
    )


def test_run_periodic_job__a_database_outage_is_one_line_and_a_bug_raises(monkeypatch, caplog, db):
    """In a Celery worker as in the in-process runner: beat's next run retries."""
    for name, function in (("away", "unreachable_database"), ("buggy", "record_call")):
        job = periodic.Job(
            name, f"tests.tasks.test_periodic.{function}", "RETENTION_INTERVAL_SECONDS"
        )
        monkeypatch.setitem(periodic.BY_NAME, name, job)
    # record_call's second call raises its RuntimeError; the module's list is put back after.
    monkeypatch.setattr("tests.tasks.test_periodic.calls", [1])

    assert tasks.run_periodic_job.apply(args=("away",)).get() is None
    (line,) = [r for r in caplog.records if r.name == "broker.tasks"]
    assert line.levelname == "WARNING"
    assert line.exc_info is None
    assert line.getMessage().startswith("periodic job away: unavailable (connection to server")
    with pytest.raises(RuntimeError):
        tasks.run_periodic_job.apply(args=("buggy",)).get()
    # Both show failing on the console's overview, with what went wrong.
    assert models.JobRun.objects.get(name="away").error.startswith("OperationalError: connection")
    assert models.JobRun.objects.get(name="buggy").error.startswith("RuntimeError")


def test_run_periodic_job__a_worker_records_its_run(db):
    processes._ok_written_ms.clear()  # what earlier tests wrote was rolled back
    tasks.run_periodic_job.apply(args=("apply_retention",)).get()
    run = models.JobRun.objects.get(name="apply_retention")
    assert run.ok_by == processes.process_name()
    assert run.failed_ms is None


@pytest.mark.parametrize("name", [job.name for job in periodic.JOBS])
def test_run_periodic_job__every_job_of_the_table_runs(name, db):
    # On an empty database each job finds nothing to do, and says so with a count.
    assert tasks.run_periodic_job.apply(args=(name,)).get() == 0


def expired_delivery(topic_name):
    """A member's delivery whose ack deadline has passed; returns its receipt."""
    groups.configure_group(keys.CONSOLE, "g", retry_delays_ms=[0])
    membership.join_group(keys.CONSOLE, "g", topic_name, "m")
    [d] = delivery.deliver_messages(keys.CONSOLE, "g", topic_name, "m", 10).deliveries
    in_flight(topic_name).update(deadline_ms=log.now_ms() - 1)
    return d.receipt


def in_flight(topic_name):
    return models.InFlight.objects.filter(partition__topic__name=topic_name)


def test_run_periodic_job__redeliver_expired(topic_factory, console):
    topic = topic_factory()
    log.append_messages(console, topic.name, [NewMessage(b"1")])
    expired_delivery(topic.name)
    assert tasks.run_periodic_job.apply(args=("redeliver_expired",)).get() == 1
    assert tasks.run_periodic_job.apply(args=("redeliver_expired",)).get() == 0
    [again] = delivery.deliver_messages(console, "g", topic.name, "m", 10).deliveries
    assert again.attempt == 2


def test_run_periodic_job__purge_trace(topic_factory, console, settings):
    topic = topic_factory(trace=True)
    log.append_messages(console, topic.name, [NewMessage(b"1"), NewMessage(b"2")])
    assert len(trace.get_trace(console, topic.name, 0, 0)) == 1
    models.TraceEvent.objects.filter(offset=0).update(at_ms=1)
    assert tasks.run_periodic_job.apply(args=("purge_trace",)).get() == 1
    assert trace.get_trace(console, topic.name, 0, 0) == []
    assert len(trace.get_trace(console, topic.name, 0, 1)) == 1


@pytest.mark.django_db(transaction=True)
def test_runner__runs_redeliver_expired(topic_factory, console, settings):
    settings.FERRY_ACK_SWEEP_INTERVAL_SECONDS = 0.02
    topic = topic_factory()
    log.append_messages(console, topic.name, [NewMessage(b"1")])
    expired_delivery(topic.name)
    runner = background.Runner((periodic.BY_NAME["redeliver_expired"],))
    runner.start()
    try:
        deadline = time.monotonic() + 5
        while in_flight(topic.name).filter(state="delivered").exists():
            assert time.monotonic() < deadline, "the runner did not sweep"
            time.sleep(0.01)
    finally:
        runner.stop()
    assert in_flight(topic.name).get().state == models.InFlight.State.RETRY_WAIT


@pytest.mark.django_db(transaction=True)
async def test_runner__redeliver_expired_wakes_a_waiting_long_poll(topic_factory, settings):
    """The sweep runs on the runner's thread; the long poll waits on this event loop."""
    settings.FERRY_ACK_SWEEP_INTERVAL_SECONDS = 0.02
    topic = await database_sync_to_async(topic_factory)()
    await database_sync_to_async(log.append_messages)(keys.CONSOLE, topic.name, [NewMessage(b"1")])
    await database_sync_to_async(groups.configure_group)(
        keys.CONSOLE, "g", ack_deadline_ms=1000, retry_delays_ms=[0]
    )
    await database_sync_to_async(membership.join_group)(keys.CONSOLE, "g", topic.name, "m")
    first = await delivery.deliver_messages_async(keys.CONSOLE, "g", topic.name, "m", 10)
    runner = background.Runner((periodic.BY_NAME["redeliver_expired"],))
    runner.start()
    try:
        started = time.monotonic()
        again = await delivery.deliver_messages_async(
            keys.CONSOLE, "g", topic.name, "m", 10, max_wait_ms=4000
        )
        waited_s = time.monotonic() - started
    finally:
        await database_sync_to_async(runner.stop)()
    assert [d.attempt for d in first.deliveries] == [1]
    assert [d.attempt for d in again.deliveries] == [2]
    # Woken by the sweep soon after the 1 s deadline, not by the 4 s poll timeout.
    assert waited_s < 2, waited_s


def test_run_periodic_job__sample_metrics_then_compact(topic_factory, console):
    topic = topic_factory()
    log.append_messages(console, topic.name, [NewMessage(b"1")])
    assert tasks.run_periodic_job.apply(args=("sample_metrics",)).get() == 1
    models.TopicSample.objects.update(at_ms=1)  # past the retention
    assert tasks.run_periodic_job.apply(args=("compact_samples",)).get() == 1


def test_run_periodic_job__run_redrive_jobs(topic_factory, console):
    topic = topic_factory()
    log.append_messages(console, topic.name, [NewMessage(b"1")])
    receipt = expired_delivery(topic.name)
    delivery.reject_messages(console, "g", [receipt])
    job = redrives.start_redrive(console, "g")
    assert tasks.run_periodic_job.apply(args=("run_redrive_jobs",)).get() == 1
    assert redrives.get_redrive(console, job.id).state == "done"


def test_worker_ready__the_worker_heartbeats_as_a_worker(monkeypatch):
    started: list[str] = []
    monkeypatch.setattr(background, "start_heartbeat", started.append)
    worker_ready.send(sender=None)
    assert started == ["worker"]


def test_worker__keeps_no_messages_unless_told(monkeypatch):
    from broker import settings as ferry_settings
    from mqsite import celery

    # Set first, so that the test's end takes back what keep_no_messages sets.
    monkeypatch.setenv("FERRY_MESSAGE_CACHE_MB", "1")
    monkeypatch.delenv("FERRY_MESSAGE_CACHE_MB")
    celery.keep_no_messages()
    assert ferry_settings.get("MESSAGE_CACHE_MB") == 0
    monkeypatch.setenv("FERRY_MESSAGE_CACHE_MB", "32")
    celery.keep_no_messages()
    assert ferry_settings.get("MESSAGE_CACHE_MB") == 32
