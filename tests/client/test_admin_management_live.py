"""Admin's management calls against a real Daphne: lookup, scheduled, audit."""

import pytest

from ferry_client import FerryError, Producer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_admin__lookup_scheduled_audit(broker_url, secret, admin, topic_factory):
    topic = topic_factory(partitions=2).name
    with Producer(broker_url, secret) as producer:
        producer.send(topic, {"n": 1}, key="k", id="m-1")
        scheduled = producer.send(topic, "later", delay_ms=60_000)
    found = admin.lookup_messages(topic, key="k")
    assert [m["id"] for m in found["messages"]] == ["m-1"]
    assert admin.lookup_messages(topic, id="m-1")["indexed"] is True
    sid = scheduled.scheduled_id
    assert sid is not None
    assert admin.reschedule(sid, 1)["deliver_at_ms"] == 1
    with pytest.raises(FerryError) as gone:
        admin.deliver_now(sid + 1000)
    assert gone.value.code == "scheduled_not_found"
    purged = admin.purge_topic(topic, {0: 0})
    assert purged["removed"] == 0
    actions = [e["action"] for e in admin.audit()["items"]]
    assert actions == ["topic.purge", "scheduled.deliver_now", "scheduled.reschedule"]
    assert admin.audit(action="topic.purge", limit=1)["items"][0]["outcome"] == "ok"
