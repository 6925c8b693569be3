"""Producers against a real Daphne: durable sends, batches, delays, dedup and failover."""

import asyncio

import httpx
import pytest

from ferry_client import AsyncProducer, FerryError, Message, Producer, SendHooks
from tests.integration.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def end_offsets(admin, topic):
    return [p["end_offset"] for p in admin.describe_topic(topic)["partition_offsets"]]


def test_send__stored_with_its_id(broker_url, secret, topic_factory, admin):
    topic = topic_factory(partitions=2).name
    with Producer(broker_url, secret) as producer:
        first = producer.send(topic, {"order": 1}, key="alice", tag="created", headers={"a": "b"})
        again = producer.send(topic, b"\x00\xff", partition=1, id="fixed")
    assert (first.topic, first.offset, first.duplicate, first.scheduled) == (topic, 0, False, False)
    assert first.id is not None
    assert len(first.id) == 32
    assert (again.partition, again.offset, again.id) == (
        1,
        0 if first.partition == 0 else 1,
        "fixed",
    )
    assert sum(end_offsets(admin, topic)) == 2


def test_send_batch__all_or_nothing(broker_url, secret, topic_factory, admin):
    topic = topic_factory().name
    with Producer(broker_url, secret) as producer:
        results = producer.send_batch(topic, [1, Message(2, key="k"), Message(3, tag="t")])
        assert [r.offset for r in results] == [0, 1, 2]
        assert len({r.id for r in results}) == 3
        with pytest.raises(FerryError) as refused:
            producer.send_batch(topic, [4, Message(5, partition=7)])
    assert (refused.value.code, refused.value.status) == ("partition_not_found", 404)
    assert refused.value.detail["index"] == 1
    assert end_offsets(admin, topic) == [3]


def test_send__delayed_is_scheduled(broker_url, secret, topic_factory, admin):
    topic = topic_factory().name
    with Producer(broker_url, secret) as producer:
        result = producer.send(topic, "later", delay_ms=60_000, id="reminder-1")
    assert result.scheduled
    assert result.offset is None
    assert result.scheduled_id is not None
    waiting = admin.list_scheduled(topic)["scheduled"]
    assert [(s["id"], s["message_id"]) for s in waiting] == [(result.scheduled_id, "reminder-1")]
    assert admin.cancel_scheduled(result.scheduled_id)["value"] == "later"
    assert end_offsets(admin, topic) == [0]


class LoseFirstAnswer(httpx.HTTPTransport):
    """Delivers the request, then loses the answer once: the broker stored it, we timed out."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def handle_request(self, request):
        response = super().handle_request(request)
        self.calls += 1
        if self.calls == 1:
            response.read()
            raise httpx.ReadTimeout("answer lost", request=request)
        return response


def test_send__retry_after_a_lost_answer_is_deduplicated(broker_url, secret, topic_factory, admin):
    topic = topic_factory().name
    lossy = LoseFirstAnswer()
    with Producer(broker_url, secret, http_transport=lossy, backoff_ms=1) as producer:
        result = producer.send(topic, "once")
    assert lossy.calls == 2
    assert (result.offset, result.duplicate) == (0, True)
    assert end_offsets(admin, topic) == [1]


def test_send__fails_over_from_a_dead_url(broker_url, secret, topic_factory, admin):
    topic = topic_factory().name
    dead = f"http://127.0.0.1:{free_port()}"
    with Producer([dead, broker_url], secret, retries=2) as producer:
        assert producer.send(topic, 1).offset == 0
        assert producer.send(topic, 2).offset == 1
    assert end_offsets(admin, topic) == [2]


def test_send_async__linger_batches_and_hooks(broker_url, secret, topic_factory):
    topic = topic_factory().name
    requests = []
    hooks = SendHooks(after_send=lambda t, messages, outcome: requests.append(len(messages)))
    with Producer(broker_url, secret, linger_ms=50, batch_size=20, hooks=[hooks]) as producer:
        futures = [producer.send_async(topic, i, key="one-key") for i in range(50)]
        producer.flush()
        assert all(f.done() for f in futures)
    assert [f.result().offset for f in futures] == list(range(50))
    assert sum(requests) == 50
    assert len(requests) < 10


def test_async_producer__send_and_send_async(broker_url, secret, topic_factory):
    topic = topic_factory().name

    async def main():
        async with AsyncProducer(broker_url, secret, linger_ms=20) as producer:
            first = await producer.send(topic, "first")
            queued = [producer.send_async(topic, i) for i in range(10)]
            batch = await producer.send_batch(topic, ["a", "b"])
            return first, [*await asyncio.gather(*queued), *batch]

    first, rest = asyncio.run(main())
    assert first.offset == 0
    assert sorted(r.offset or 0 for r in rest) == list(range(1, 13))
