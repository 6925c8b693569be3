import pytest

from broker import models
from broker.core import audit, errors, topics
from broker.core.records import Actor

ACTOR = Actor(name="user:ada", source="dashboard", client_ip="127.0.0.1", user_agent="pytest")


def test_audited__ok_records_entry_with_summary(db, console):
    info = audit.audited(
        ACTOR,
        "topic.create",
        "orders",
        {"partitions": 2},
        lambda: topics.create_topic(console, "orders", 2),
        lambda t: {"partitions": t.partition_count},
    )
    assert info.name == "orders"
    entry = models.AuditEntry.objects.get()
    assert (entry.actor, entry.source, entry.action, entry.target) == (
        "user:ada",
        "dashboard",
        "topic.create",
        "orders",
    )
    assert (entry.params, entry.outcome, entry.result) == (
        {"partitions": 2},
        "ok",
        {"partitions": 2},
    )
    assert (entry.client_ip, entry.user_agent) == ("127.0.0.1", "pytest")


def test_audited__broker_error_recorded_and_reraised(db, console, topic_factory):
    topic_factory(name="orders")
    with pytest.raises(errors.TopicExists):
        audit.audited(
            ACTOR, "topic.create", "orders", {}, lambda: topics.create_topic(console, "orders")
        )
    entry = models.AuditEntry.objects.get()
    assert entry.outcome == "topic_exists"
    assert "already exists" in entry.result["message"]


def test_audited__other_error_recorded_as_error(db):
    def boom() -> None:
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        audit.audited(ACTOR, "topic.delete", "t", {}, boom)
    assert models.AuditEntry.objects.get().outcome == "error"


def _entries(n: int) -> None:
    for i in range(n):
        audit.audited(
            Actor(name=f"key:k{i % 2}", source="api" if i % 2 else "console"),
            "topic.delete" if i % 3 else "group.reset",
            f"target-{i}",
            {"i": i},
            lambda: None,
        )


def test_list_audit__newest_first_and_pages(db, console):
    _entries(5)
    page = audit.list_audit(console, limit=2)
    assert [e.target for e in page.items] == ["target-4", "target-3"]
    page2 = audit.list_audit(console, limit=2, before_id=page.next_before_id)
    assert [e.target for e in page2.items] == ["target-2", "target-1"]
    page3 = audit.list_audit(console, limit=2, before_id=page2.next_before_id)
    assert ([e.target for e in page3.items], page3.next_before_id) == (["target-0"], None)


def test_list_audit__filters(db, console):
    _entries(6)
    assert {e.action for e in audit.list_audit(console, action="group.reset").items} == {
        "group.reset"
    }
    assert {e.actor for e in audit.list_audit(console, actor="key:k1").items} == {"key:k1"}
    assert {e.source for e in audit.list_audit(console, source="api").items} == {"api"}
    assert [e.target for e in audit.list_audit(console, target_contains="-5").items] == ["target-5"]
    assert audit.audit_actions() == ["group.reset", "topic.delete"]


def test_list_audit__needs_superuser(key_factory):
    principal, _ = key_factory("admin:orders")
    with pytest.raises(errors.PermissionDenied):
        audit.list_audit(principal)


@pytest.mark.parametrize(("kwargs"), [{"limit": 0}, {"limit": 501}, {"source": "web"}])
def test_list_audit__bad_arguments(db, console, kwargs):
    with pytest.raises(errors.InvalidRequest):
        audit.list_audit(console, **kwargs)
