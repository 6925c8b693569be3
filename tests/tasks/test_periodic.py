"""The periodic table drives both runners: Celery beat and the in-process thread."""

import time

import orjson

from broker import background, models, tasks
from broker.core import log, periodic
from broker.core.records import NewMessage
from mqsite.celery import app


def test_beat_schedule__one_entry_per_job():
    app.loader.import_default_modules()
    schedule = app.conf.beat_schedule
    assert set(schedule) == {job.name for job in periodic.JOBS}
    for job in periodic.JOBS:
        assert schedule[job.name]["task"] == "broker.run_periodic_job"
        assert schedule[job.name]["args"] == (job.name,)


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


def test_runner__runs_jobs_repeatedly_and_survives_errors(settings, caplog):
    settings.FERRY_RETENTION_INTERVAL_SECONDS = 0.02
    job = periodic.Job(
        "record", "tests.tasks.test_periodic.record_call", "RETENTION_INTERVAL_SECONDS"
    )
    runner = background.Runner((job,))
    runner.start()
    deadline = time.monotonic() + 5
    while len(calls) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    assert len(calls) >= 4
    assert "background job record failed" in caplog.text
