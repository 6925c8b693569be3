"""Console noun `consume`."""

import base64

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.core.management.base import CommandError

from broker import models
from broker.core import delivery, groups, keys, log, membership, records, retries


def append_json(topic, *values, **fields):
    batch = [records.NewMessage(orjson.dumps(v), **fields) for v in values]
    log.append_messages(keys.CONSOLE, topic, batch)


def lines(out):
    return [orjson.loads(line) for line in out.splitlines()]


def test_handle__json_lines_and_commit(ferry, topic_factory):
    topic_factory("orders")
    log.append_messages(
        keys.CONSOLE,
        "orders",
        [records.NewMessage(b'{"id": 1}', key="k", tag="t", headers={"h": "v"})],
    )
    [message] = lines(ferry("consume", "orders", "--group=billing"))
    # The same message shape as the REST API (broker/wire.py), the client's id included.
    assert set(message) == {
        "partition",
        "offset",
        "timestamp_ms",
        "key",
        "tag",
        "headers",
        "id",
        "value",
    }
    assert (message["partition"], message["offset"]) == (0, 0)
    assert (message["key"], message["tag"], message["headers"]) == ("k", "t", {"h": "v"})
    assert message["value"] == {"id": 1}
    # Committed: the group moved past it.
    assert ferry("consume", "orders", "--group=billing") == ""
    [offsets] = groups.describe_group(keys.CONSOLE, "billing").topics
    assert offsets.committed_total == 1


def test_handle__no_commit_shows_same_messages_again(ferry, topic_factory):
    topic_factory("orders")
    append_json("orders", "a", "b")
    first = ferry("consume", "orders", "--group=audit", "--no-commit")
    assert [m["value"] for m in lines(first)] == ["a", "b"]
    assert ferry("consume", "orders", "--group=audit", "--no-commit") == first
    assert [m["value"] for m in lines(ferry("consume", "orders", "--group=audit"))] == ["a", "b"]
    assert ferry("consume", "orders", "--group=audit") == ""


def test_handle__max_messages(ferry, topic_factory):
    topic_factory("orders")
    append_json("orders", *range(5))
    out = ferry("consume", "orders", "--group=g", "--max-messages=2")
    assert [m["value"] for m in lines(out)] == [0, 1]
    out = ferry("consume", "orders", "--group=g", "--max-messages=10")
    assert [m["value"] for m in lines(out)] == [2, 3, 4]


def test_handle__raw_bytes_as_base64(ferry, topic_factory):
    topic_factory("orders")
    log.append_messages(keys.CONSOLE, "orders", [records.NewMessage(b"\x00\xff", is_json=False)])
    [message] = lines(ferry("consume", "orders", "--group=g"))
    assert "value" not in message
    assert base64.b64decode(message["value_b64"]) == b"\x00\xff"


def test_handle__unknown_topic(ferry):
    with pytest.raises(CommandError, match=r"^topic_not_found: "):
        ferry("consume", "missing", "--group=g")


def test_handle__bad_group_name(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match=r"^invalid_request: Group names"):
        ferry("consume", "orders", "--group=no spaces")


def test_handle__group_required(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match="--group"):
        ferry("consume", "orders")


# --follow polls through asyncio on asgiref's worker thread, which has its own database
# connection: the data must be committed for it to see, hence transaction=True.
@pytest.mark.django_db(transaction=True)
def test_follow__max_total_stops(ferry, topic_factory):
    topic_factory("orders", partitions=2)
    append_json("orders", *range(5), partition=0)
    append_json("orders", *range(5, 10), partition=1)
    out = ferry("consume", "orders", "--group=g", "--follow", "--max-total=7", "--max-messages=3")
    assert len(lines(out)) == 7
    # Never more delivered (and acked) than printed: nothing left in flight.
    [offsets] = groups.describe_group(keys.CONSOLE, "g").topics
    assert offsets.committed_total == 7
    assert sum(p.in_flight for p in offsets.partitions) == 0


@pytest.mark.django_db(transaction=True)
def test_follow__joins_as_member_and_leaves(ferry, topic_factory, monkeypatch):
    topic_factory("orders", partitions=2)
    append_json("orders", *range(3), partition=0)
    append_json("orders", *range(3, 6), partition=1)
    # Another member holds one partition: this consumer reads only the other one.
    other = membership.join_group(keys.CONSOLE, "g", "orders", "other")
    joined = []
    join_group = membership.join_group

    def recording_join(*args, **kwargs):
        info = join_group(*args, **kwargs)
        joined.append(info)
        return info

    monkeypatch.setattr(membership, "join_group", recording_join)
    out = ferry("consume", "orders", "--group=g", "--follow", "--max-total=3")
    [mine] = joined
    assert len(mine.partitions) == 1
    assert mine.partitions != membership.heartbeat(keys.CONSOLE, "g", other.member_id).partitions
    assert {m["partition"] for m in lines(out)} == set(mine.partitions)
    # Left on exit: the other member holds everything again.
    info = groups.describe_group(keys.CONSOLE, "g")
    assert [m.member_id for m in info.members] == ["other"]
    assert info.members[0].partitions == (0, 1)


@pytest.mark.django_db(transaction=True)
def test_follow__leaves_when_done(ferry, topic_factory):
    topic_factory("orders")
    append_json("orders", "a", "b")
    out = ferry("consume", "orders", "--group=g", "--follow", "--max-total=2")
    assert [m["value"] for m in lines(out)] == ["a", "b"]
    info = groups.describe_group(keys.CONSOLE, "g")
    assert info.members == ()
    assert info.generation == 2  # joined, then left


@pytest.mark.django_db(transaction=True)
def test_follow__rejoins_after_expiry(ferry, topic_factory, monkeypatch):
    topic_factory("orders")
    append_json("orders", "a")
    real_deliver = delivery.deliver_messages_async
    polls: list[str] = []

    async def expire_first(principal, group, topic, member_id, *args, **kwargs):
        if not polls:
            # As if the process stopped past the session timeout: the member is gone.
            await sync_to_async(models.GroupMember.objects.all().delete)()
        polls.append(member_id)
        return await real_deliver(principal, group, topic, member_id, *args, **kwargs)

    monkeypatch.setattr(delivery, "deliver_messages_async", expire_first)
    out = ferry("consume", "orders", "--group=g", "--follow", "--max-total=1")
    assert [m["value"] for m in lines(out)] == ["a"]
    # Polled again under the same member id, joined again.
    assert len(polls) == 2
    assert polls[0] == polls[1]
    assert groups.describe_group(keys.CONSOLE, "g").members == ()


def test_without_follow__no_membership(ferry, topic_factory):
    topic_factory("orders")
    append_json("orders", "a")
    ferry("consume", "orders", "--group=g")
    info = groups.describe_group(keys.CONSOLE, "g")
    assert (info.members, info.generation) == ((), 0)


def test_follow__ctrl_c_exits_cleanly(ferry, topic_factory, monkeypatch):
    topic_factory("orders")

    async def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(delivery, "deliver_messages_async", interrupted)
    assert ferry("consume", "orders", "--group=g", "--follow") == ""
    # Left the group on the way out.
    assert groups.describe_group(keys.CONSOLE, "g").members == ()


@pytest.mark.django_db(transaction=True)
def test_follow__acks_after_printing(ferry, topic_factory):
    topic_factory("orders")
    append_json("orders", "a", "b")
    out = ferry("consume", "orders", "--group=g", "--follow", "--max-total=2")
    printed = lines(out)
    # The REST message shape plus the attempt (no receipt: the console acks for you).
    assert {m["value"]: m["attempt"] for m in printed} == {"a": 1, "b": 1}
    assert "receipt" not in printed[0]
    [offsets] = groups.describe_group(keys.CONSOLE, "g").topics
    assert (offsets.committed_total, offsets.partitions[0].in_flight) == (2, 0)


@pytest.mark.django_db(transaction=True)
def test_follow__killed_before_ack_delivers_again(ferry, topic_factory, monkeypatch):
    topic_factory("orders")
    append_json("orders", "a")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(delivery, "ack_messages", killed)
    assert [m["value"] for m in lines(ferry("consume", "orders", "--group=g", "--follow"))] == ["a"]
    monkeypatch.undo()
    # Printed, not acked: leaving handed it back, so the next consumer gets it again.
    [again] = lines(ferry("consume", "orders", "--group=g", "--follow", "--max-total=1"))
    assert (again["value"], again["offset"]) == ("a", 0)


@pytest.mark.django_db(transaction=True)
def test_follow__no_commit_leaves_in_flight(ferry, topic_factory, monkeypatch):
    topic_factory("orders")
    append_json("orders", "a", "b")
    # Stay a member after the run, to see what it left in flight.
    monkeypatch.setattr(membership, "leave_group", lambda *args: None)
    out = ferry("consume", "orders", "--group=g", "--follow", "--no-commit", "--max-total=2")
    assert [m["value"] for m in lines(out)] == ["a", "b"]
    [offsets] = groups.describe_group(keys.CONSOLE, "g").topics
    assert (offsets.committed_total, offsets.partitions[0].in_flight) == (0, 2)


@pytest.mark.django_db(transaction=True)
def test_follow__filter_tags(ferry, topic_factory):
    topic_factory("orders")
    append_json("orders", "created", tag="created")
    append_json("orders", "paid", tag="paid")
    append_json("orders", "shipped", tag="shipped")
    out = ferry(
        "consume",
        "orders",
        "--group=g",
        "--follow",
        "--filter-tags=created || shipped",
        "--max-total=2",
    )
    assert [m["value"] for m in lines(out)] == ["created", "shipped"]
    [offsets] = groups.describe_group(keys.CONSOLE, "g").topics
    assert offsets.partitions[0].filtered == 1


def test_follow__bad_filter_tags(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match=r"^invalid_filter: "):
        ferry("consume", "orders", "--group=g", "--follow", "--filter-tags=a || ")
    assert groups.list_groups(keys.CONSOLE) == []


def test_handle__filter_tags_needs_follow(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match="--filter-tags needs --follow"):
        ferry("consume", "orders", "--group=g", "--filter-tags=a")


@pytest.mark.django_db(transaction=True)
def test_follow__redelivery_shows_attempt(ferry, topic_factory):
    topic_factory("orders")
    append_json("orders", "a")
    membership.join_group(keys.CONSOLE, "g", "orders", "first")
    [first] = delivery.deliver_messages(keys.CONSOLE, "g", "orders", "first", 10).deliveries
    delivery.nack_messages(keys.CONSOLE, "g", [first.receipt], delay_ms=0)
    membership.leave_group(keys.CONSOLE, "g", "first")
    [again] = lines(ferry("consume", "orders", "--group=g", "--follow", "--max-total=1"))
    assert (again["value"], again["attempt"]) == ("a", 2)
    assert retries.list_dead_letters(keys.CONSOLE, "g").total == 0


def test_handle__plain_consume_skips_expired(ferry, topic_factory):
    topic_factory("aged", message_ttl_ms=60_000)
    append_json("aged", "old", timestamp_ms=1_000)
    append_json("aged", "new")
    assert [m["value"] for m in lines(ferry("consume", "aged", "--group=g"))] == ["new"]
    (letter,) = retries.list_dead_letters(keys.CONSOLE, "g").items
    assert (letter.offset, letter.reason) == (0, "expired")
    assert ferry("consume", "aged", "--group=g") == ""
