"""Each console action calls the core, flashes its result and writes one audit entry."""

import datetime as dt

import pytest

from broker import models
from broker.core import keys, log, scheduling

# (url, form, audited action, target): every action the console offers.
ACTIONS = [
    ("/topics/create/", {"name": "fresh", "partitions": "2"}, "topic.create", "fresh"),
    ("/topics/orders/settings/", {"retention_ms": "3600000"}, "topic.alter", "orders"),
    ("/topics/orders/purge/", {}, "topic.purge", "orders"),
    ("/topics/orders/delete/", {}, "topic.delete", "orders"),
    (
        "/topics/orders/messages/produce/",
        {"value": '{"a": 1}', "encoding": "json", "key": "k"},
        "message.produce",
        "orders",
    ),
    (
        "/groups/g/reset/",
        {"topic": "orders", "to": "earliest", "force": "on"},
        "group.reset",
        "g/orders",
    ),
    ("/groups/g/settings/", {"max_attempts": "5"}, "group.configure", "g"),
    ("/groups/g/delete/", {"force": "on"}, "group.delete", "g"),
    ("/scheduled/{scheduled}/cancel/", {}, "scheduled.cancel", "{scheduled}"),
    ("/scheduled/{scheduled}/deliver/", {}, "scheduled.deliver_now", "{scheduled}"),
    (
        "/scheduled/{scheduled}/reschedule/",
        {"due_ms": "{due}"},
        "scheduled.reschedule",
        "{scheduled}",
    ),
    ("/dead-letters/redrive/", {"group": "g", "scope": "filter"}, "dlq.redrive", "g"),
    (
        "/dead-letters/redrive/",
        {"group": "g", "scope": "one", "id": "{letter}"},
        "dlq.redrive",
        "g",
    ),
    ("/dead-letters/purge/", {"group": "g", "scope": "filter"}, "dlq.purge", "g"),
    ("/keys/create/", {"name": "svc", "permissions": "produce:orders"}, "key.create", "svc"),
    ("/keys/revoke/", {"name": "{key}"}, "key.revoke", "{key}"),
]


def _fill(value, ids):
    """Put the fixture's ids into "{letter}"-style placeholders (JSON values stay as they are)."""
    for name, found in ids.items():
        value = value.replace("{" + name + "}", str(found))
    return value


@pytest.mark.parametrize(("url", "form", "action", "target"), ACTIONS)
def test_action__calls_the_core_and_is_audited(
    operator, broker_data, key_factory, url, form, action, target
):
    principal, _ = key_factory("produce:*")
    ids = {
        "letter": broker_data["letters"][0],
        "scheduled": broker_data["scheduled"][0],
        "key": next(k.name for k in keys.list_api_keys(keys.CONSOLE) if k.id == principal.key_id),
        "due": log.now_ms() + 7_200_000,
    }
    response = operator.post(_fill(url, ids), {k: _fill(v, ids) for k, v in form.items()})
    assert response.status_code in (200, 302)
    entry = models.AuditEntry.objects.get()
    assert (entry.action, entry.target) == (action, _fill(target, ids))
    assert entry.outcome == "ok", entry.result
    assert (entry.actor, entry.source) == ("user:olga", "dashboard")
    flashes = [str(m) for m in response.wsgi_request._messages]
    assert flashes, "the result is shown as a flash message"


def test_topic_create__effect_and_redirect(operator, db):
    response = operator.post("/topics/create/", {"name": "made", "partitions": "4"})
    assert response["Location"] == "/topics/made/"
    assert models.Topic.objects.get(name="made").partition_count == 4
    page = operator.get("/topics/made/")
    assert b"Created topic made with 4 partitions." in page.content


def test_topic_create__refusal_is_flashed_and_audited(operator, db):
    operator.post("/topics/create/", {"name": "bad name!"})
    entry = models.AuditEntry.objects.get()
    assert entry.outcome == "invalid_topic_name"
    page = operator.get("/topics/")
    assert b'data-testid="flash-error"' in page.content


def test_topic_create__bad_number_is_flashed_without_calling_the_core(operator, db):
    response = operator.post("/topics/create/", {"name": "x", "partitions": "many"})
    assert response.status_code == 302
    assert not models.Topic.objects.exists()
    assert b"partitions must be a whole number" in operator.get("/topics/").content


def test_produce__lands_in_the_log(operator, broker_data):
    before = models.Message.objects.count()
    response = operator.post(
        "/topics/orders/messages/produce/",
        {"value": "aGk=", "encoding": "base64", "partition": "2", "headers": "a: 1\nb: 2"},
    )
    assert models.Message.objects.count() == before + 1
    assert response["Location"].startswith("/topics/orders/messages/2/")
    page = operator.get(response["Location"])
    assert b'data-testid="message-value"' in page.content  # "hi" is valid text


def test_message_detail__binary_shows_hex_and_base64(operator, broker_data):
    row = models.Message.objects.get(key="bin")
    page = operator.get(f"/topics/orders/messages/{row.partition.number}/{row.offset}/")
    assert b'data-testid="message-value-hex"' in page.content
    assert b"AAEC/w==" in page.content


def test_message_detail__missing_is_404(operator, broker_data):
    assert operator.get("/topics/orders/messages/0/999999/").status_code == 404
    assert operator.get("/topics/nope/").status_code == 404


def test_search__by_key_and_id_are_indexed(operator, broker_data):
    page = operator.get("/topics/orders/messages/", {"field": "key", "q": "k1"})
    assert page.context["result"].indexed
    assert [m.key for m in page.context["items"]] == ["k1"]
    page = operator.get("/topics/orders/messages/", {"field": "id", "q": "id-2"})
    assert [m.client_id for m in page.context["items"]] == ["id-2"]


def test_search__tag_scan_reports_what_it_scanned(operator, broker_data):
    page = operator.get("/topics/orders/messages/", {"field": "tag", "q": "t"})
    assert b'data-testid="search-summary"' in page.content
    assert b"after scanning" in page.content


def test_export__streams_json_lines(operator, broker_data):
    response = operator.get("/topics/orders/messages/export/")
    assert response.status_code == 200
    assert response.streaming
    lines = b"".join(response.streaming_content).splitlines()
    assert len(lines) == 6


def test_reset_preview__shows_what_moves_and_writes_nothing(operator, broker_data):
    page = operator.get("/groups/g/reset/preview/", {"topic": "orders", "to": "latest"})
    assert b'data-testid="reset-preview-table"' in page.content
    assert page.context["rows"]
    assert not models.AuditEntry.objects.exists()


def test_reset_preview__explains_a_bad_form(operator, broker_data):
    page = operator.get("/groups/g/reset/preview/", {"topic": "orders", "to": "offsets"})
    assert b'data-testid="reset-preview-error"' in page.content


def test_redrive_count__is_a_dry_run(operator, broker_data):
    page = operator.get("/dead-letters/count/", {"group": "g"})
    assert page.context["count"] == 2
    assert models.DeadLetter.objects.count() == 2
    assert not models.RedriveJob.objects.exists()


def test_redrive_all__starts_a_throttled_job(operator, broker_data):
    operator.post(
        "/dead-letters/redrive/", {"group": "g", "scope": "filter", "rate_per_second": "7"}
    )
    job = models.RedriveJob.objects.get()
    assert (job.total, job.rate_per_second, job.created_by) == (2, 7, "user:olga")
    page = operator.get("/dead-letters/live/", {"group": "g"})
    assert b'data-testid="redrive-job"' in page.content
    assert operator.get(f"/dead-letters/redrives/{job.id}/").status_code == 200


def test_redrive_selected__needs_a_selection(operator, broker_data):
    operator.post("/dead-letters/redrive/", {"group": "g", "scope": "selected"})
    assert not models.RedriveJob.objects.exists()
    assert not models.AuditEntry.objects.exists()


def test_key_create__shows_the_secret_once(operator, db):
    response = operator.post("/keys/create/", {"name": "svc", "permissions": "consume:*"})
    assert response.status_code == 200
    secret = response.context["new_secret"]
    assert keys.authenticate(secret).name == "svc"
    assert response["Cache-Control"] == "no-store"
    assert secret.encode() not in operator.get("/keys/").content
    assert models.ApiKey.objects.get(name="svc").created_by == "user:olga"


def test_scheduled_cancel__removes_it(operator, broker_data):
    sid = broker_data["scheduled"][0]
    operator.post(f"/scheduled/{sid}/cancel/")
    assert scheduling.count_scheduled(keys.CONSOLE) == 0


def test_scheduled_reschedule__from_a_typed_time(operator, broker_data):
    sid = broker_data["scheduled"][0]
    tomorrow = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(days=1)
    operator.post(f"/scheduled/{sid}/reschedule/", {"at": tomorrow.strftime("%Y-%m-%dT%H:%M:%S")})
    assert models.ScheduledMessage.objects.get(id=sid).due_ms == tomorrow.timestamp() * 1000


def test_topic_purge__up_to_offsets(operator, broker_data):
    before = models.Message.objects.filter(partition__number=0).count()
    operator.post("/topics/orders/purge/", {"up_to": "0=1"})
    entry = models.AuditEntry.objects.get()
    assert entry.params == {"up_to": {"0": 1}}
    assert entry.result == {"removed": min(before, 1)}


def test_topic_purge__bad_offsets_are_refused_before_the_core(operator, broker_data):
    operator.post("/topics/orders/purge/", {"up_to": "zero"})
    assert not models.AuditEntry.objects.exists()
    assert b"is not partition=offset" in operator.get("/topics/orders/").content


def test_key_create__audit_never_holds_the_secret(operator, db):
    response = operator.post("/keys/create/", {"name": "svc", "permissions": "consume:*"})
    entry = models.AuditEntry.objects.get()
    assert response.context["new_secret"] not in str(entry.params) + str(entry.result)
    assert entry.result["prefix"]
