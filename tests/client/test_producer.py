"""Producers against a fake broker (httpx.MockTransport): ids, retries, hooks, linger."""

import asyncio
import json
import threading

import httpx
import pytest

from broker.core import partitioning
from ferry_client import AsyncProducer, FerryError, Message, Producer, SendHooks

URL = "http://broker:8000"


class FakeBroker:
    """Answers produce requests with consecutive offsets; can fail the first few attempts.

    A topic has `partitions` partitions (its GET answers them): a message goes to the one it
    names, else its key's (the broker's hash), else 0. Not `readable`: its GET answers 404.
    """

    def __init__(self, failures=(), partitions=1, readable=True):
        self.failures = list(failures)
        self.partitions = partitions
        self.readable = readable
        self.bodies = []
        self.paths = []
        self.hints = []
        self.reads = []
        self.offset = 0
        self.lock = threading.Lock()

    def __call__(self, request):
        if request.method == "GET":
            self.reads.append(request.url.path)
            if not self.readable:
                return httpx.Response(404, json={"error": {"code": "topic_not_found"}})
            return httpx.Response(200, json={"partitions": self.partitions})
        body = json.loads(request.content)
        with self.lock:
            self.bodies.append(body)
            self.paths.append(request.url.path)
            self.hints.append(request.headers.get("Ferry-Partition-Hint"))
            if self.failures:
                failure = self.failures.pop(0)
                if isinstance(failure, Exception):
                    raise failure
                return failure
            results = []
            for message in body["messages"]:
                if "delay_ms" in message:
                    results.append({"scheduled_id": 7, "deliver_at_ms": 99, "duplicate": False})
                    continue
                results.append(
                    {"partition": self.place(message), "offset": self.offset, "duplicate": False}
                )
                self.offset += 1
        return httpx.Response(200, json={"results": results})

    def place(self, message):
        if "partition" in message:
            return message["partition"]
        if "key" in message:
            return partitioning.partition_for_key(message["key"], self.partitions)
        return 0

    def ids(self):
        return [[m["id"] for m in body["messages"]] for body in self.bodies]


def producer(broker, **options):
    options.setdefault("backoff_ms", 1)
    return Producer(URL, "key", http_transport=httpx.MockTransport(broker), **options)


def routing(broker, **options):
    """A producer with route_by_partition on (docs/client.md#partitions)."""
    return producer(broker, route_by_partition=True, **options)


def test_send__every_message_gets_an_id_kept_across_retries():
    broker = FakeBroker(failures=[httpx.ReadTimeout("lost"), httpx.Response(503, json={})])
    with producer(broker) as p:
        result = p.send("t", {"a": 1}, key="k", tag="x", headers={"h": "v"}, partition=0)
    (first, second, third) = broker.ids()
    assert first == second == third == [result.id]
    assert broker.bodies[0]["messages"][0] == {
        "value": {"a": 1},
        "key": "k",
        "tag": "x",
        "headers": {"h": "v"},
        "partition": 0,
        "id": result.id,
    }
    assert (result.topic, result.partition, result.offset) == ("t", 0, 0)


def test_send__one_partitions_messages_go_to_its_url():
    """A load balancer sends a partition's URL to the process appending to it (docs/client.md)."""
    broker = FakeBroker()
    with producer(broker) as p:
        p.send("t", 1, partition=2)
        p.send_batch("t", [Message(2, partition=2), Message(3, partition=2)])
        p.send_batch("t", [Message(4, partition=2), Message(5, partition=1)])
        p.send_batch("t", [Message(6, partition=2), 7])
        p.send("t", 8, key="k")
    assert broker.paths == [
        "/api/v1/topics/t/partitions/2/messages",
        "/api/v1/topics/t/partitions/2/messages",
        "/api/v1/topics/t/messages",
        "/api/v1/topics/t/messages",
        "/api/v1/topics/t/messages",
    ]
    assert broker.bodies[0]["messages"][0]["partition"] == 2


def a_key_in_each_partition(count):
    keys: dict[int, str] = {}
    for n in range(1000):
        keys.setdefault(partitioning.partition_for_key(f"k{n}", count), f"k{n}")
    return [keys[p] for p in range(count)]


def test_send__a_keyed_requests_partition_goes_in_a_hint_for_the_balancer():
    """docs/client.md#partitions: the topic's partition count is read once; a request whose
    messages share a partition names it in Ferry-Partition-Hint, others carry no hint."""
    broker = FakeBroker(partitions=4)
    key = a_key_in_each_partition(4)
    with routing(broker) as p:
        results = [p.send("t", 1, key=key[2]), p.send("t", 2, key=key[3])]
        p.send_batch("t", [Message(3, key=key[1]), Message(4, key=key[1])])
        p.send_batch("t", [Message(5, key=key[1]), Message(6, key=key[2])])
        p.send_batch("t", [Message(7, key=key[0]), Message(8, partition=0)])
        p.send("t", 9)
        p.send("t", 10, partition=1)
    assert broker.reads == ["/api/v1/topics/t"]
    assert broker.hints == ["2", "3", "1", None, "0", None, None]
    assert broker.paths[-1] == "/api/v1/topics/t/partitions/1/messages"
    assert [r.partition for r in results] == [2, 3]


def test_send__a_topic_that_grew_is_read_again_when_an_answer_shows_it():
    broker = FakeBroker(partitions=4)
    moved = next(
        f"k{n}"
        for n in range(1000)
        if partitioning.partition_for_key(f"k{n}", 4) != partitioning.partition_for_key(f"k{n}", 8)
    )
    with routing(broker) as p:
        p.send("t", 1, key=moved)
        broker.partitions = 8
        stale = p.send("t", 2, key=moved)
        p.send("t", 3, key=moved)
    was, now = partitioning.partition_for_key(moved, 4), partitioning.partition_for_key(moved, 8)
    # The broker places the message; the stale hint only cost the routing of one request.
    assert stale.partition == now
    assert broker.hints == [str(was), str(was), str(now)]
    assert len(broker.reads) == 2


def test_send__an_unreadable_count_sends_without_hint_and_tries_later():
    broker = FakeBroker(partitions=4)
    with routing(broker, metadata_max_age_ms=0) as p:
        p.send("t", 1, key="a")
        p.send("t", 2, key="a")
        broker.readable = False
        p.send("t", 3, key="a")  # routed by the last count read
        p.send("t", 4, key="a")  # not read again within RETRY_AFTER_FAILURE_S
    hint = str(partitioning.partition_for_key("a", 4))
    assert broker.hints == [hint, hint, hint, hint]
    assert len(broker.reads) == 3
    fresh = FakeBroker(partitions=4, readable=False)
    with routing(fresh) as p:
        assert p.send("t", 1, key="a").offset == 0
        p.send("t", 2, key="a")
    assert fresh.hints == [None, None]
    assert len(fresh.reads) == 1


def test_send__no_hints_and_no_reads_by_default():
    broker = FakeBroker(partitions=4)
    with Producer(URL, "key", http_transport=httpx.MockTransport(broker)) as p:
        p.send("t", 1, key="a")
        p.send_async("t", 2, key="a").result()
    assert broker.hints == [None, None]
    assert broker.reads == []


def test_send_async__batches_per_partition_each_with_its_hint():
    """docs/client.md#partitions: as a Kafka producer, one batch a partition; a partition's
    messages in the order queued."""
    broker = FakeBroker(partitions=4)
    key = a_key_in_each_partition(4)
    with routing(broker, linger_ms=60_000, batch_size=1000) as p:
        p.send("t", "first", key=key[0])  # reads the count
        futures = [p.send_async("t", n, key=key[n % 4]) for n in range(8)]
        futures.append(p.send_async("t", "named", partition=2))
        futures.append(p.send_async("t", "keyless"))
        p.flush()
    assert [f.result().partition for f in futures[:8]] == [0, 1, 2, 3] * 2
    sent = [
        (hint, [m["value"] for m in body["messages"]])
        for hint, body in zip(broker.hints, broker.bodies, strict=True)
    ]
    assert sent == [
        ("0", ["first"]),
        ("0", [0, 4]),
        ("1", [1, 5]),
        ("2", [2, 6, "named"]),
        ("3", [3, 7]),
        (None, ["keyless"]),
    ]


def test_send_async__what_was_queued_before_the_count_was_read_goes_first():
    broker = FakeBroker(partitions=4)
    key = a_key_in_each_partition(4)
    with routing(broker, linger_ms=60_000, batch_size=2) as p:
        early = p.send_async("t", "queued first", key=key[1])
        p.send("t", "reads the count", key=key[0])
        # A full batch of partition 1: due at once, yet it waits for the older one.
        later = [p.send_async("t", n, key=key[1]) for n in range(2)]
        for future in [early, *later]:
            future.result(timeout=10)
    values = [[m["value"] for m in body["messages"]] for body in broker.bodies]
    assert values == [["reads the count"], ["queued first"], [0, 1]]
    assert broker.hints == ["0", "1", "1"]


def test_send__bytes_go_as_base64_and_delays_are_scheduled():
    broker = FakeBroker()
    with producer(broker) as p:
        result = p.send("t", b"\x00\xff", delay_ms=5000, id="mine")
    assert broker.bodies[0]["messages"][0] == {"value_b64": "AP8=", "delay_ms": 5000, "id": "mine"}
    assert result.scheduled
    assert (result.scheduled_id, result.deliver_at_ms) == (7, 99)


def test_send_batch__one_request_with_messages_or_values():
    broker = FakeBroker()
    with producer(broker) as p:
        results = p.send_batch("t", [1, Message(2, key="k", id="two")])
        assert p.send_batch("t", []) == []
    assert len(broker.bodies) == 1
    assert [r.offset for r in results] == [0, 1]
    assert results[1].id == "two"


def test_send__hooks_see_messages_and_outcome():
    broker = FakeBroker(failures=[httpx.Response(409, json={"error": {"code": "topic_full"}})])
    calls: list[tuple[object, ...]] = []

    def broken(topic, messages):
        raise RuntimeError("a buggy hook loses no message")

    hooks = [
        SendHooks(before_send=broken),
        SendHooks(
            before_send=lambda topic, messages: calls.append(("before", topic, len(messages))),
            after_send=lambda topic, messages, outcome: calls.append(("after", topic, outcome)),
        ),
    ]
    with producer(broker, hooks=hooks) as p:
        with pytest.raises(FerryError) as refused:
            p.send("t", 1)
        result = p.send("t", 2)
    assert refused.value.code == "topic_full"
    assert calls == [
        ("before", "t", 1),
        ("after", "t", refused.value),
        ("before", "t", 1),
        ("after", "t", [result]),
    ]


def test_send_async__lingers_into_one_batch():
    broker = FakeBroker()
    with producer(broker, linger_ms=10_000, batch_size=3) as p:
        futures = [p.send_async("t", i) for i in range(7)]
        # Two full batches go at once; the seventh waits for the linger, or a flush.
        futures[5].result(timeout=5)
        assert not futures[6].done()
        assert p.flush(timeout=5)
    assert [f.result().offset for f in futures] == list(range(7))
    assert [len(ids) for ids in broker.ids()] == [3, 3, 1]


def test_send_async__close_sends_what_waits_and_failures_reach_the_future():
    broker = FakeBroker(failures=[httpx.Response(404, json={"error": {"code": "topic_not_found"}})])
    p = producer(broker, linger_ms=10_000)
    failed = p.send_async("nope", 1)
    p.close()
    with pytest.raises(FerryError, match="topic_not_found"):
        failed.result(timeout=0)
    with pytest.raises(RuntimeError, match="closed"):
        p.send_async("t", 2)


def test_send_async__a_cancelled_future_is_not_sent():
    broker = FakeBroker()
    with producer(broker, linger_ms=10_000) as p:
        dropped = p.send_async("t", "dropped")
        kept = p.send_async("t", "kept")
        assert dropped.cancel()
    assert kept.result().offset == 0
    assert [[m["value"] for m in body["messages"]] for body in broker.bodies] == [["kept"]]


async def test_async_producer__send_async_lingers_and_close_flushes():
    broker = FakeBroker(failures=[httpx.ConnectError("refused")])
    hooks = SendHooks(after_send=lambda topic, messages, outcome: None)
    async with AsyncProducer(
        URL,
        "key",
        http_transport=httpx.MockTransport(broker),
        linger_ms=10_000,
        backoff_ms=1,
        hooks=[hooks],
        route_by_partition=True,
    ) as p:
        first = await p.send("t", "now", key="k")
        queued = [p.send_async("t", i) for i in range(3)]
        await asyncio.sleep(0.01)
        assert not any(f.done() for f in queued)
        await p.flush()
        assert [f.result().offset for f in queued] == [1, 2, 3]
        last = p.send_async("t", "at close")
    assert first.offset == 0
    assert (await last).offset == 4
    # The keyed send read the topic's partition count and named its partition.
    assert (broker.reads, broker.hints[0]) == (["/api/v1/topics/t"], "0")
    # The refused connection was retried with the same id.
    assert broker.ids()[0] == broker.ids()[1]
