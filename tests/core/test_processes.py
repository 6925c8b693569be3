"""The process table: heartbeats, listing, purge, and the heartbeat thread (core/processes.py)."""

import time
import tomllib
from pathlib import Path

from django.db.utils import OperationalError

import broker
from broker import background, models
from broker.core import console, keys, log, periodic, processes


def test_version__matches_pyproject():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == broker.VERSION


# Live servers of integration tests heartbeat into the test database too: look at own rows.


def mine():
    return models.BrokerProcess.objects.filter(name=processes.process_name())


def test_heartbeat__inserts_then_refreshes(db, console):
    processes.heartbeat()
    row = mine().get()
    assert row.name == processes.process_name()
    assert (row.kind, row.version) == ("server", broker.VERSION)
    mine().update(heartbeat_ms=1)
    processes.heartbeat("worker")
    again = mine().get()
    assert again.heartbeat_ms > 1
    assert again.kind == "worker"
    assert again.started_ms == row.started_ms


def test_list_processes__alive_and_dead(db, console):
    now = log.now_ms()
    models.BrokerProcess.objects.create(
        name="h:1", kind="server", version="0.1.0", started_ms=now, heartbeat_ms=now - 1000
    )
    models.BrokerProcess.objects.create(
        name="h:2", kind="worker", version="0.1.0", started_ms=now, heartbeat_ms=now - 60_000
    )
    listed = [p for p in processes.list_processes(console) if p.name.startswith("h:")]
    assert [(p.name, p.alive) for p in listed] == [("h:1", True), ("h:2", False)]
    assert all(p.alive for p in processes.list_processes(console, alive_within_ms=120_000))


def test_purge_processes__forgets_a_day_dead(db):
    now = log.now_ms()
    for name, beat in (("old", now - processes.DAY_MS - 1), ("new", now)):
        models.BrokerProcess.objects.create(
            name=name, kind="server", version="0.1.0", started_ms=0, heartbeat_ms=beat
        )
    assert processes.purge_processes() == 1
    assert set(models.BrokerProcess.objects.values_list("name", flat=True)) >= {"new"}
    assert not models.BrokerProcess.objects.filter(name="old").exists()


def test_flush_last_used__stores_noted_uses_once(key_factory, django_assert_num_queries):
    keys.flush_last_used()
    principal, _secret = key_factory("consume:*")
    keys.note_used(principal.key_id)
    assert keys.flush_last_used() == 1
    stored = models.ApiKey.objects.get(id=principal.key_id).last_used_ms
    assert stored is not None
    with django_assert_num_queries(0):
        assert keys.flush_last_used() == 0
    # Never backwards: a later use stored by another process stays.
    models.ApiKey.objects.filter(id=principal.key_id).update(last_used_ms=stored + 10**9)
    keys._last_used[principal.key_id] = stored + 1
    keys.flush_last_used()
    assert models.ApiKey.objects.get(id=principal.key_id).last_used_ms == stored + 10**9


def test_authenticate__notes_the_use(key_factory):
    keys.flush_last_used()
    principal, secret = key_factory("consume:*")
    keys.authenticate(secret)
    assert keys.flush_last_used() >= 1
    assert models.ApiKey.objects.get(id=principal.key_id).last_used_ms is not None


def test_start_heartbeat__off_in_tests(settings):
    settings.FERRY_PROCESS_HEARTBEAT = False
    assert background.start_heartbeat() is False


def test_heartbeat_thread__beats_and_flushes(transactional_db, key_factory, settings):
    settings.FERRY_PROCESS_HEARTBEAT_SECONDS = 0.02
    principal, _ = key_factory("consume:*")
    keys.note_used(principal.key_id)
    beat = background.Heartbeat("worker")
    beat.start()
    try:
        deadline = time.monotonic() + 5
        while not mine().exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        beat.stop()
    assert mine().get().kind == "worker"
    assert models.ApiKey.objects.get(id=principal.key_id).last_used_ms is not None


def test_record_job_run__ok_at_most_once_a_heartbeat_failures_at_once(db, settings):
    settings.FERRY_PROCESS_HEARTBEAT_SECONDS = 60
    processes._ok_written_ms.clear()
    models.JobRun.objects.all().delete()
    processes.record_job_run("release_due")
    first = models.JobRun.objects.get(name="release_due")
    assert first.ok_by == processes.process_name()
    assert (first.failed_ms, first.error) == (None, "")
    processes.record_job_run("release_due")  # within the interval: not written again
    assert models.JobRun.objects.get(name="release_due").ok_ms == first.ok_ms

    processes.record_job_run("release_due", OperationalError("gone"))
    failed = models.JobRun.objects.get(name="release_due")
    assert first.ok_ms is not None
    assert failed.failed_ms is not None
    assert failed.failed_ms >= first.ok_ms
    assert failed.error == "OperationalError: gone"
    processes.record_job_run("release_due")  # the first success after a failure: at once
    again = models.JobRun.objects.get(name="release_due").ok_ms
    assert again is not None
    assert again >= failed.failed_ms


def test_job_states__ok_late_failing_and_waiting(db):
    models.BrokerProcess.objects.all().delete()
    models.JobRun.objects.all().delete()
    assert {s.state for s in console.job_states()} == {"waiting"}  # no process, no run yet
    now = log.now_ms()
    hour = 3_600_000
    models.BrokerProcess.objects.create(
        name="h:1", kind="worker", version="0.1.0", started_ms=now - hour, heartbeat_ms=now
    )
    models.JobRun.objects.create(name="release_due", ok_ms=now - 100, ok_by="h:1")
    models.JobRun.objects.create(name="expire_members", ok_ms=now - 600_000, ok_by="h:1")
    models.JobRun.objects.create(
        name="apply_retention", ok_ms=now - 1000, ok_by="h:1", failed_ms=now - 10, error="X: y"
    )

    states = {s.name: s for s in console.job_states()}

    assert (states["release_due"].state, states["release_due"].last_ok_by) == ("ok", "h:1")
    assert states["expire_members"].state == "late"
    assert (states["apply_retention"].state, states["apply_retention"].last_error) == (
        "failing",
        "X: y",
    )
    # Nobody ran it, and a process has been up for longer than three of its rounds.
    assert states["compact_samples"].state == "late"
    assert set(states) == {job.name for job in periodic.JOBS}
