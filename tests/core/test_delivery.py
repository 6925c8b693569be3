import orjson
import pytest

from broker import models
from broker.core import bulk, delivery, errors, groups, log, membership, retries
from broker.core.delivery import settle
from broker.core.records import NewMessage


def produce(console, topic, count, partition=0, **fields):
    log.append_messages(
        console,
        topic,
        [NewMessage(orjson.dumps(i), partition=partition, **fields) for i in range(count)],
    )


def joined(console, topic, member="m", group="g", **options):
    membership.join_group(console, group, topic, member, **options)
    return member


def deliver(console, topic, member="m", n=100, group="g", **options):
    return delivery.deliver_messages(console, group, topic, member, n, **options).deliveries


def committed(group, topic, partition=0):
    info = groups.describe_group(groups_principal(), group)
    for t in info.topics:
        if t.topic == topic:
            return next(p for p in t.partitions if p.partition == partition)
    raise AssertionError


def group_id(name):
    return models.ConsumerGroup.objects.get(name=name).id


def groups_principal():
    from broker.core import keys

    return keys.CONSOLE


def test_deliver_messages__receipts_and_in_flight(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 3)
    joined(console, topic)
    got = deliver(console, topic)
    assert [d.message.offset for d in got] == [0, 1, 2]
    assert all(d.attempt == 1 and d.receipt for d in got)
    # In flight: not handed out again.
    assert deliver(console, topic) == ()
    lag = committed("g", topic)
    assert (lag.committed_offset, lag.in_flight) == (0, 3)


def test_ack_messages__out_of_order_moves_to_lowest_unsettled(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 4)
    joined(console, topic)
    got = deliver(console, topic)
    result = delivery.ack_messages(console, "g", [got[1].receipt, got[2].receipt])
    assert result.settled == 2
    assert committed("g", topic).committed_offset == 0
    delivery.ack_messages(console, "g", [got[0].receipt])
    assert committed("g", topic).committed_offset == 3
    delivery.ack_messages(console, "g", [got[3].receipt])
    assert committed("g", topic).committed_offset == 4
    again = delivery.ack_messages(console, "g", [got[3].receipt])
    assert (again.settled, again.stale) == (0, (got[3].receipt,))


def test_nack_messages__retry_then_dead_letter(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic)
    groups.configure_group(console, "g", max_attempts=3, retry_delays_ms=[0])
    attempts = []
    for _ in range(3):
        (d,) = deliver(console, topic)
        attempts.append(d.attempt)
        result = delivery.nack_messages(console, "g", [d.receipt], error="boom")
    assert attempts == [1, 2, 3]
    assert result.dead_lettered == 1
    assert deliver(console, topic) == ()
    page = retries.list_dead_letters(console, "g")
    (letter,) = page.items
    assert (letter.reason, letter.attempts, letter.last_error) == ("max_attempts", 3, "boom")
    assert orjson.loads(letter.message.value) == 0
    assert committed("g", topic).committed_offset == 1
    # Redrive: delivered again, with a fresh attempt count.
    assert retries.redrive_dead_letters(console, "g", [letter.id]).redriven == 1
    (d,) = deliver(console, topic)
    assert (d.message.offset, d.attempt) == (0, 1)
    delivery.ack_messages(console, "g", [d.receipt])
    assert retries.list_dead_letters(console, "g").total == 0


def test_nack_messages__backoff_waits(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic)
    (d,) = deliver(console, topic)
    delivery.nack_messages(console, "g", [d.receipt])
    row = models.InFlight.objects.get()
    assert row.state == "retry_wait"
    assert row.deadline_ms - log.now_ms() > 9000  # RocketMQ's first level: 10 s
    assert deliver(console, topic) == ()


def test_reject_messages__straight_to_dead_letters(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 2)
    joined(console, topic)
    got = deliver(console, topic)
    delivery.reject_messages(console, "g", [got[0].receipt], error="bad")
    (letter,) = retries.list_dead_letters(console, "g").items
    assert (letter.reason, letter.attempts, letter.offset) == ("rejected", 1, 0)
    assert committed("g", topic).committed_offset == 1


def test_redeliver_expired__after_deadline(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic)
    groups.configure_group(console, "g", retry_delays_ms=[0])
    (d,) = deliver(console, topic)
    models.InFlight.objects.update(deadline_ms=log.now_ms() - 1)
    assert delivery.redeliver_expired() == 1
    (again,) = deliver(console, topic)
    assert (again.message.offset, again.attempt) == (0, 2)
    assert again.receipt != d.receipt


def test_extend_deadlines(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic)
    (d,) = deliver(console, topic)
    delivery.extend_deadlines(console, "g", [d.receipt], 600_000)
    assert models.InFlight.objects.get().deadline_ms > log.now_ms() + 500_000


def test_extend_deadlines__a_whole_run_keeps_its_row(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 6)
    joined(console, topic)
    got = deliver(console, topic)
    result = delivery.extend_deadlines(console, "g", [d.receipt for d in got], 600_000)
    assert (result.settled, result.stale) == (6, ())
    assert runs() == [(0, 5, "delivered")]
    assert models.InFlight.objects.get().deadline_ms > log.now_ms() + 500_000
    # Part of it: those named are carved out and moved, the rest stay runs with their deadline.
    delivery.extend_deadlines(console, "g", [got[1].receipt], 900_000)
    assert runs() == [(0, 0, "delivered"), (1, 1, "delivered"), (2, 5, "delivered")]
    deadlines = dict(models.InFlight.objects.values_list("offset", "deadline_ms"))
    assert deadlines[1] > log.now_ms() + 800_000 > deadlines[0] == deadlines[2]
    # A message waiting for its retry is stale to an extend, alone in its row or not.
    delivery.nack_messages(console, "g", [got[2].receipt], delay_ms=60_000)
    result = delivery.extend_deadlines(console, "g", [got[2].receipt, got[3].receipt], 60_000)
    assert (result.settled, result.stale) == (1, (got[2].receipt,))
    assert delivery.ack_messages(console, "g", [d.receipt for d in got]).settled == 6
    assert committed("g", topic).committed_offset == 6


def test_deliver_messages__ordered_one_in_flight(topic_factory, console):
    topic = topic_factory(partitions=2).name
    produce(console, topic, 3, partition=0)
    produce(console, topic, 3, partition=1)
    joined(console, topic)
    groups.configure_group(console, "g", ordered=True, retry_delays_ms=[0])
    got = deliver(console, topic)
    assert sorted((d.message.partition, d.message.offset) for d in got) == [(0, 0), (1, 0)]
    assert deliver(console, topic) == ()
    first = next(d for d in got if d.message.partition == 0)
    delivery.nack_messages(console, "g", [first.receipt])
    (retry,) = deliver(console, topic)
    assert (retry.message.partition, retry.message.offset, retry.attempt) == (0, 0, 2)


def test_deliver_messages__broadcast(topic_factory, console):
    topic = topic_factory(partitions=2).name
    groups.configure_group(console, "g", mode="broadcast")
    joined(console, topic, "a")
    joined(console, topic, "b")
    produce(console, topic, 2, partition=0)
    produce(console, topic, 2, partition=1)
    a = deliver(console, topic, "a")
    b = deliver(console, topic, "b")
    assert len(a) == len(b) == 4
    delivery.ack_messages(console, "g", [d.receipt for d in a])
    assert deliver(console, topic, "b") == ()


def test_deliver_messages__filter(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 2, tag="a")
    produce(console, topic, 2, tag="b")
    joined(console, topic, filter={"tags": "b"})
    result = delivery.deliver_messages(console, "g", topic, "m", 100)
    assert [d.message.tag for d in result.deliveries] == ["b", "b"]
    assert result.filtered == 2
    lag = committed("g", topic)
    assert lag.filtered == 2


def test_deliver_messages__ttl_dead_letters(topic_factory, console):
    topic = topic_factory().name
    models.Topic.objects.filter(name=topic).update(message_ttl_ms=1)
    produce(console, topic, 1)
    import time

    time.sleep(0.01)
    joined(console, topic)
    result = delivery.deliver_messages(console, "g", topic, "m", 100)
    assert (result.deliveries, result.expired) == ((), 1)
    assert retries.list_dead_letters(console, "g").items[0].reason == "expired"


def test_leave_group__releases_in_flight(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic, "a")
    deliver(console, topic, "a")
    joined(console, topic, "b")
    membership.leave_group(console, "g", "a")
    (again,) = deliver(console, topic, "b")
    assert again.message.offset == 0


def test_commit_offsets__stale_generation(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic, "a")
    with pytest.raises(errors.StaleGeneration):
        groups.commit_offsets(console, "g", topic, {0: 1}, member_id="a", generation=0)


def test_get_trace__lifecycle(topic_factory, console):
    from broker.core import trace

    topic = topic_factory(trace=True).name
    produce(console, topic, 1)
    joined(console, topic)
    groups.configure_group(console, "g", retry_delays_ms=[0])
    (d,) = deliver(console, topic)
    delivery.nack_messages(console, "g", [d.receipt], error="boom")
    (d,) = deliver(console, topic)
    delivery.ack_messages(console, "g", [d.receipt])
    events = [e.event for e in trace.get_trace(console, topic, 0, 0)]
    assert events == ["produced", "delivered", "nacked", "retry_scheduled", "delivered", "acked"]


def test_get_trace__lean_topic_keeps_retries_only(topic_factory, console):
    from broker.core import trace

    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic)
    (d,) = deliver(console, topic)
    delivery.reject_messages(console, "g", [d.receipt], error="no")
    assert [e.event for e in trace.get_trace(console, topic, 0, 0)] == ["dead_lettered"]


def test_join_group__start_latest_only_without_a_position(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 2)
    joined(console, topic, start="latest")
    produce(console, topic, 1)
    assert [d.message.offset for d in deliver(console, topic)] == [2]
    # A rejoin keeps the group's position.
    membership.leave_group(console, "g", "m")
    produce(console, topic, 1)
    joined(console, topic, start="latest")
    # Offset 2 left in flight comes back at once; 0 and 1 stay behind the kept position.
    assert sorted(d.message.offset for d in deliver(console, topic)) == [2, 3]


def test_join_group__start_timestamp(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 2)
    models.Message.objects.filter(offset=0).update(timestamp_ms=1)
    joined(console, topic, start="timestamp", start_timestamp_ms=2)
    assert [d.message.offset for d in deliver(console, topic)] == [1]


def runs():
    return sorted(
        (r.offset, r.last_offset, r.state) for r in models.InFlight.objects.order_by("offset")
    )


def test_deliver_messages__one_row_per_run(topic_factory, console, django_assert_max_num_queries):
    topic = topic_factory().name
    produce(console, topic, 500)
    joined(console, topic)
    with django_assert_max_num_queries(16):
        got = deliver(console, topic, n=500)
    assert len(got) == 500
    assert runs() == [(0, 499, "delivered")]
    with django_assert_max_num_queries(10):
        delivery.ack_messages(console, "g", [d.receipt for d in got])
    assert runs() == []


def test_ack_messages__part_of_a_run_leaves_the_rest_as_runs(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 8)
    joined(console, topic)
    got = deliver(console, topic)
    (token,) = {d.receipt.split(".")[0] for d in got}
    delivery.ack_messages(console, "g", [got[0].receipt, got[2].receipt])
    assert runs() == [(1, 1, "delivered"), (3, 7, "delivered")]
    assert set(models.InFlight.objects.values_list("token", flat=True)) == {token}
    assert committed("g", topic).committed_offset == 1
    assert committed("g", topic).in_flight == 6
    # The other receipts still settle their messages, a piece in part too.
    assert delivery.ack_messages(console, "g", [got[1].receipt, got[4].receipt]).settled == 2
    assert runs() == [(3, 3, "delivered"), (5, 7, "delivered")]
    assert committed("g", topic).committed_offset == 3
    # A stale receipt for an offset already acked settles nothing.
    result = delivery.ack_messages(console, "g", [got[2].receipt, got[3].receipt])
    assert (result.settled, result.stale) == (1, (got[2].receipt,))
    delivery.nack_messages(console, "g", [got[6].receipt], delay_ms=60_000)
    assert runs() == [(5, 5, "delivered"), (6, 6, "retry_wait"), (7, 7, "delivered")]
    assert delivery.ack_messages(console, "g", [got[5].receipt, got[7].receipt]).settled == 2
    assert committed("g", topic).committed_offset == 6


def test_ack_messages__a_prefetch_of_several_ack_batches_keeps_one_run(
    topic_factory, console, pipelines
):
    """A subscriber holding more than it acks at a time (prefetch 400, acks of 100) settles
    the front of a run each time: what is left stays one run, put back by one statement more
    than an ack of a whole run takes, and on PostgreSQL in the same round trips."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    topic = topic_factory().name
    produce(console, topic, 400)
    joined(console, topic)
    got = deliver(console, topic, n=400)
    statements, trips = [], []
    for start in range(0, 400, 100):
        receipts = [d.receipt for d in got[start : start + 100]]
        pipelines.clear()
        with CaptureQueriesContext(connection) as queries:
            assert delivery.ack_messages(console, "g", receipts).settled == 100
        statements.append(len(queries))
        trips.append(len(pipelines))
        assert runs() == ([(start + 100, 399, "delivered")] if start < 300 else [])
        assert committed("g", topic).committed_offset == start + 100
    # The first ack may also find out the group's id (settle._clustering_ids); on SQLite the
    # INSERT goes to sqlite3 itself, past Django's log.
    assert statements[1] == statements[2] in (statements[3], statements[3] + 1)
    assert trips[1] == trips[2] == trips[3]


def test_nack_messages__a_whole_run_waits_as_one_row(topic_factory, console):
    from broker.core import trace

    topic = topic_factory().name
    produce(console, topic, 3)
    joined(console, topic)
    got = deliver(console, topic)
    result = delivery.nack_messages(console, "g", [d.receipt for d in got], error="boom")
    assert (result.settled, result.dead_lettered) == (3, 0)
    assert runs() == [(0, 2, "retry_wait")]
    assert committed("g", topic).retry_waiting == 3
    (row,) = models.InFlight.objects.all()
    assert (row.last_error, row.attempt) == ("boom", 1)
    # Every message's retry is in its trace, as when runs were split first.
    for offset in range(3):
        (event,) = trace.get_trace(console, topic, 0, offset)
        assert (event.event, event.attempt) == ("retry_scheduled", 1)
        assert event.detail == {"due_ms": row.deadline_ms, "error": "boom"}
    # Due at once: the run goes out again whole, as one row, each message a second attempt.
    models.InFlight.objects.update(deadline_ms=0)
    again = deliver(console, topic)
    assert [(d.message.offset, d.attempt) for d in again] == [(0, 2), (1, 2), (2, 2)]
    assert runs() == [(0, 2, "delivered")]
    assert delivery.ack_messages(console, "g", [d.receipt for d in again]).settled == 3
    assert committed("g", topic).committed_offset == 3


def test_nack_messages__a_big_batch_records_every_retry(topic_factory, console):
    """250 retry events: on PostgreSQL more than bulk.insert_rows sends as an INSERT (COPY)."""
    from broker.core import bulk, trace

    assert bulk.PG_COPY_MIN_ROWS <= 250
    topic = topic_factory().name
    produce(console, topic, 250)
    joined(console, topic)
    got = deliver(console, topic, n=250)
    assert delivery.nack_messages(console, "g", [d.receipt for d in got], error="é\n").settled
    (row,) = models.InFlight.objects.all()
    for offset in (0, 249):
        (event,) = trace.get_trace(console, topic, 0, offset)
        assert (event.event, event.attempt, event.group) == ("retry_scheduled", 1, "g")
        assert event.detail == {"due_ms": row.deadline_ms, "error": "é\n"}


def _waiting_run(console, topic, count):
    """A run of count messages nacked whole, due at once."""
    produce(console, topic, count)
    joined(console, topic)
    got = deliver(console, topic)
    assert delivery.nack_messages(console, "g", [d.receipt for d in got], delay_ms=0).settled
    assert runs() == [(0, count - 1, "retry_wait")]


def test_deliver_messages__a_due_run_past_the_room_goes_out_in_front_pieces(topic_factory, console):
    topic = topic_factory().name
    _waiting_run(console, topic, 5)
    first = deliver(console, topic, n=2)
    assert [(d.message.offset, d.attempt) for d in first] == [(0, 2), (1, 2)]
    # The rest waits on as a run of its own, still due, at the attempt it failed.
    assert runs() == [(0, 1, "delivered"), (2, 4, "retry_wait")]
    rest = models.InFlight.objects.get(offset=2)
    assert (rest.attempt, rest.deadline_ms > 0) == (1, True)
    second = deliver(console, topic, n=10)
    assert [(d.message.offset, d.attempt) for d in second] == [(2, 2), (3, 2), (4, 2)]
    assert runs() == [(0, 1, "delivered"), (2, 4, "delivered")]
    receipts = [d.receipt for d in second + first]
    assert delivery.ack_messages(console, "g", receipts).settled == 5
    assert runs() == []
    assert committed("g", topic).committed_offset == 5


def test_deliver_messages__due_runs_and_single_retries_share_the_room(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 6)
    joined(console, topic)
    got = deliver(console, topic, n=3) + deliver(console, topic, n=3)
    # 0-2 wait as a run, 4 alone (part of a run), 3 and 5 stay delivered.
    delivery.nack_messages(console, "g", [d.receipt for d in got[:3]], delay_ms=0)
    delivery.nack_messages(console, "g", [got[4].receipt], delay_ms=0)
    assert runs() == [
        (0, 2, "retry_wait"),
        (3, 3, "delivered"),
        (4, 4, "retry_wait"),
        (5, 5, "delivered"),
    ]
    again = deliver(console, topic, n=4)
    assert sorted(d.message.offset for d in again) == [0, 1, 2, 4]
    assert all(d.attempt == 2 for d in again)
    receipts = [d.receipt for d in again] + [got[3].receipt, got[5].receipt]
    assert delivery.ack_messages(console, "g", receipts).settled == 6
    assert committed("g", topic).committed_offset == 6


def test_deliver_messages__a_due_run_auto_acked_in_part_leaves_the_rest_waiting(
    topic_factory, console
):
    topic = topic_factory().name
    _waiting_run(console, topic, 4)
    first = deliver(console, topic, n=3, auto_ack=True)
    assert [d.message.offset for d in first] == [0, 1, 2]
    assert runs() == [(3, 3, "retry_wait")]
    assert committed("g", topic).committed_offset == 3
    (last,) = deliver(console, topic, auto_ack=True)
    assert (last.message.offset, last.attempt) == (3, 2)
    assert runs() == []
    assert committed("g", topic).committed_offset == 4


def test_deliver_messages__a_due_run_with_a_message_past_its_ttl_is_split(topic_factory, console):
    topic = topic_factory().name
    _waiting_run(console, topic, 3)
    # Offset 1 is old enough to be past a TTL of 1 s; its neighbours are not.
    mine = models.Message.objects.filter(partition__topic__name=topic)
    mine.filter(offset=1).update(timestamp_ms=log.now_ms() - 60_000)
    models.Topic.objects.filter(name=topic).update(message_ttl_ms=1_000)
    result = delivery.deliver_messages(console, "g", topic, "m", 100)
    assert [(d.message.offset, d.attempt) for d in result.deliveries] == [(0, 2), (2, 2)]
    assert result.expired == 1
    (letter,) = retries.list_dead_letters(console, "g", reason="expired").items
    assert letter.offset == 1
    assert runs() == [(0, 0, "delivered"), (2, 2, "delivered")]
    assert delivery.ack_messages(console, "g", [d.receipt for d in result.deliveries]).settled == 2
    assert committed("g", topic).committed_offset == 3


def test_deliver_messages__a_due_run_with_a_message_removed_is_split(topic_factory, console):
    topic = topic_factory().name
    _waiting_run(console, topic, 3)
    models.Message.objects.filter(partition__topic__name=topic, offset=0).delete()
    again = deliver(console, topic)
    assert [(d.message.offset, d.attempt) for d in again] == [(1, 2), (2, 2)]
    (letter,) = retries.list_dead_letters(console, "g", reason="removed").items
    assert (letter.offset, letter.attempts) == (0, 1)


def test_nack_messages__middle_of_a_run(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 3)
    joined(console, topic)
    got = deliver(console, topic)
    delivery.nack_messages(console, "g", [got[1].receipt], delay_ms=60_000)
    assert runs() == [(0, 0, "delivered"), (1, 1, "retry_wait"), (2, 2, "delivered")]
    result = delivery.extend_deadlines(console, "g", [got[0].receipt, got[1].receipt], 60_000)
    assert (result.settled, result.stale) == (1, (got[1].receipt,))


def test_settling_part_of_a_run__carves_out_what_it_names(topic_factory, console):
    """A nack, reject, release or extend of some messages of a batch makes rows of those only;
    the rest of the batch stays runs, and settles whole."""
    topic = topic_factory().name
    produce(console, topic, 10)
    joined(console, topic)
    got = deliver(console, topic)
    delivery.nack_messages(console, "g", [got[2].receipt], delay_ms=60_000)
    assert runs() == [(0, 1, "delivered"), (2, 2, "retry_wait"), (3, 9, "delivered")]
    delivery.reject_messages(console, "g", [got[5].receipt, got[6].receipt])
    assert runs() == [
        (0, 1, "delivered"),
        (2, 2, "retry_wait"),
        (3, 4, "delivered"),
        (7, 9, "delivered"),
    ]
    result = delivery.extend_deadlines(console, "g", [got[8].receipt], 60_000)
    assert result.settled == 1
    assert runs() == [
        (0, 1, "delivered"),
        (2, 2, "retry_wait"),
        (3, 4, "delivered"),
        (7, 7, "delivered"),
        (8, 8, "delivered"),
        (9, 9, "delivered"),
    ]
    assert delivery.release_messages(console, "g", [got[0].receipt]).settled == 1
    assert (0, 0, "retry_wait") in runs()
    assert (1, 1, "delivered") in runs()
    # Every receipt left still settles its message.
    rest = [got[i].receipt for i in (1, 3, 4, 7, 8, 9)]
    assert delivery.ack_messages(console, "g", rest).settled == 6
    assert runs() == [(0, 0, "retry_wait"), (2, 2, "retry_wait")]
    assert committed("g", topic).committed_offset == 0
    (letter, other) = sorted(retries.list_dead_letters(console, "g").items, key=lambda d: d.offset)
    assert (letter.offset, other.offset, letter.reason) == (5, 6, "rejected")


def test_ack_messages__wrong_token_is_stale(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic)
    (d,) = deliver(console, topic)
    forged = "00000000." + d.receipt.split(".", 1)[1]
    result = delivery.ack_messages(console, "g", [forged])
    assert (result.settled, len(result.stale)) == (0, 1)
    assert runs() == [(0, 0, "delivered")]


@pytest.mark.parametrize(
    "garbage", ["nonsense", "a.zz.1", "a.ffffffffffffffffffff.1", "a.+1.2", "a.1_0.2", "a. 1.2"]
)
def test_ack_messages__malformed_receipt_is_refused(topic_factory, console, garbage):
    topic = topic_factory().name
    produce(console, topic, 1)
    joined(console, topic)
    (d,) = deliver(console, topic)
    with pytest.raises(errors.InvalidRequest) as refused:
        delivery.ack_messages(console, "g", [d.receipt, garbage])
    assert refused.value.detail == {"receipts": [garbage]}
    assert runs() == [(0, 0, "delivered")]


def test_redeliver_expired__a_whole_run_waits_as_one_row(topic_factory, console):
    from broker.core import trace

    topic = topic_factory(trace=True).name
    produce(console, topic, 3)
    joined(console, topic)
    groups.configure_group(console, "g", retry_delays_ms=[0])
    deliver(console, topic)
    models.InFlight.objects.update(deadline_ms=log.now_ms() - 1)
    assert delivery.redeliver_expired() == 3
    assert runs() == [(0, 2, "retry_wait")]
    (row,) = models.InFlight.objects.all()
    assert (row.attempt, row.last_error) == (1, "ack deadline passed")
    for offset in range(3):
        *_, event = trace.get_trace(console, topic, 0, offset)
        assert (event.event, event.attempt) == ("retry_scheduled", 1)
        assert event.detail == {"due_ms": row.deadline_ms, "error": "ack deadline passed"}
    again = deliver(console, topic)
    assert [(d.message.offset, d.attempt) for d in again] == [(0, 2), (1, 2), (2, 2)]
    assert runs() == [(0, 2, "delivered")]
    assert delivery.ack_messages(console, "g", [d.receipt for d in again]).settled == 3
    assert committed("g", topic).committed_offset == 3


def test_redeliver_expired__whole_runs_of_several_partitions(topic_factory, console):
    topic = topic_factory(partitions=2).name
    produce(console, topic, 3, partition=0)
    produce(console, topic, 2, partition=1)
    joined(console, topic)
    groups.configure_group(console, "g", retry_delays_ms=[0])
    assert len(deliver(console, topic)) == 5
    models.InFlight.objects.update(deadline_ms=log.now_ms() - 1)
    assert delivery.redeliver_expired() == 5
    assert runs() == [(0, 1, "retry_wait"), (0, 2, "retry_wait")]
    again = deliver(console, topic)
    assert sorted((d.message.partition, d.message.offset, d.attempt) for d in again) == [
        (0, 0, 2),
        (0, 1, 2),
        (0, 2, 2),
        (1, 0, 2),
        (1, 1, 2),
    ]
    assert delivery.ack_messages(console, "g", [d.receipt for d in again]).settled == 5


def test_redeliver_expired__a_run_out_of_attempts_is_dead_lettered(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 5)
    joined(console, topic)
    groups.configure_group(console, "g", max_attempts=2, retry_delays_ms=[0])
    deliver(console, topic, n=2)
    second = deliver(console, topic, n=3)
    # 2-4 fail once and come back as second attempts, then both runs outlive their deadline.
    delivery.nack_messages(console, "g", [d.receipt for d in second])
    models.InFlight.objects.filter(offset=2).update(deadline_ms=0)
    assert [d.attempt for d in deliver(console, topic)] == [2, 2, 2]
    models.InFlight.objects.update(deadline_ms=log.now_ms() - 1)
    assert delivery.redeliver_expired() == 5
    # The first run waits for its second attempt; the other is out of attempts.
    assert runs() == [(0, 1, "retry_wait")]
    letters = retries.list_dead_letters(console, "g").items
    assert sorted((d.offset, d.reason, d.attempts) for d in letters) == [
        (2, "max_attempts", 2),
        (3, "max_attempts", 2),
        (4, "max_attempts", 2),
    ]
    assert committed("g", topic).committed_offset == 0


def test_join_group__rejoin_releases_in_flight(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 2)
    joined(console, topic)
    deliver(console, topic)
    joined(console, topic)  # the consumer restarted under the same id
    again = deliver(console, topic)
    # A hand-over is no failed attempt: the redelivery keeps attempt 1.
    assert [(d.message.offset, d.attempt) for d in again] == [(0, 1), (1, 1)]


def _nack_after_removal(console, topic, remove):
    """A member holds 0-1, the topic loses 0-2, offset 0 is nacked for a retry at once."""
    produce(console, topic, 3)
    joined(console, topic)
    got = deliver(console, topic, n=2)
    remove()
    assert delivery.nack_messages(console, "g", [got[0].receipt], delay_ms=0).settled == 1
    return deliver(console, topic)


def test_deliver_messages__retry_removed_by_drop_oldest_is_dead_lettered(topic_factory, console):
    topic = topic_factory(capacity=3, overflow_policy="drop_oldest").name
    again = _nack_after_removal(console, topic, lambda: produce(console, topic, 3))
    assert [d.message.offset for d in again] == [3, 4, 5]
    (letter,) = retries.list_dead_letters(console, "g").items
    assert (letter.reason, letter.partition, letter.offset, letter.attempts) == ("removed", 0, 0, 1)
    events = [e.event for e in trace_of(console, topic, 0)]
    assert events[-1] == "dead_lettered"


def test_deliver_messages__retry_removed_by_retention_is_dead_lettered(topic_factory, console):
    import time

    from broker.core import retention

    topic = topic_factory().name

    def expire_all():
        models.Topic.objects.filter(name=topic).update(retention_ms=1)
        time.sleep(0.01)
        assert retention.apply_retention() == 3

    assert _nack_after_removal(console, topic, expire_all) == ()
    (letter,) = retries.list_dead_letters(console, "g", reason="removed").items
    assert letter.offset == 0
    assert letter.message.value == b""


def test_leave_group__hand_over_keeps_the_attempt(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 1)
    groups.configure_group(console, "g", max_attempts=2, retry_delays_ms=[0])
    joined(console, topic, "a")
    (first,) = deliver(console, topic, "a")
    delivery.nack_messages(console, "g", [first.receipt])
    (second,) = deliver(console, topic, "a")
    joined(console, topic, "b")
    membership.leave_group(console, "g", "a")
    (handed,) = deliver(console, topic, "b")
    assert (first.attempt, second.attempt, handed.attempt) == (1, 2, 2)
    # The hand-over did not count: a nack now fails the last of max_attempts=2.
    assert delivery.nack_messages(console, "g", [handed.receipt]).dead_lettered == 1
    assert retries.list_dead_letters(console, "g").items[0].attempts == 2


def trace_of(console, topic, offset):
    from broker.core import trace

    return trace.get_trace(console, topic, 0, offset)


def test_ack_and_deliver__delivers_the_freed_credit(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 5)
    joined(console, topic)
    got = deliver(console, topic, n=2)
    result = delivery.ack_and_deliver(console, "g", [got[0].receipt], topic, "m", 0, 100)
    assert result.acked.settled == 1
    assert result.delivered is not None
    assert [d.message.offset for d in result.delivered.deliveries] == [2]
    lag = committed("g", topic)
    assert (lag.committed_offset, lag.in_flight) == (1, 2)
    # With credit besides the freed one, up to max_messages.
    result = delivery.ack_and_deliver(console, "g", [got[1].receipt], topic, "m", 5, 1)
    assert result.delivered is not None
    assert [d.message.offset for d in result.delivered.deliveries] == [3]


def test_ack_and_deliver__nothing_settled_nothing_delivered(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 3)
    joined(console, topic)
    (first,) = deliver(console, topic, n=1)
    delivery.ack_messages(console, "g", [first.receipt])
    result = delivery.ack_and_deliver(console, "g", [first.receipt], topic, "m", 0, 100)
    assert (result.acked.settled, result.acked.stale) == (0, (first.receipt,))
    assert result.delivered is None
    assert committed("g", topic).in_flight == 0


def test_ack_and_deliver__member_gone_keeps_the_ack(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 3)
    joined(console, topic)
    joined(console, topic, member="other")
    got = deliver(console, topic, n=1)
    membership.leave_group(console, "g", "m")
    result = delivery.ack_and_deliver(console, "g", [got[0].receipt], topic, "m", 0, 100)
    assert result.acked.settled == 1
    assert result.delivered is None
    assert committed("g", topic).committed_offset == 1


def guesses_of(monkeypatch, module, name):
    """The guess argument of each call of module.name (a transaction run guessed or not)."""
    runs = []
    once = getattr(module, name)

    def counted(*args, **kwargs):
        runs.append(kwargs["guess"])
        return once(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return runs


def test_ack_and_deliver__the_locks_guessed_wrong_are_let_go_and_it_runs_again(
    topic_factory, console, monkeypatch
):
    """On PostgreSQL an ack and push locks the offset rows the member's last one locked, with
    its group's lock (deliver.lock_ahead); rows that are not the member's now (after a
    rebalance) roll the transaction back, and it runs again without a guess."""
    from django.db import connection

    from broker.core.delivery import deliver as delivering
    from broker.core.delivery import push

    topic = topic_factory(partitions=2).name
    produce(console, topic, 4, partition=0)
    produce(console, topic, 4, partition=1)
    joined(console, topic)
    got = list(deliver(console, topic, n=2))
    result = delivery.ack_and_deliver(console, "g", [got.pop(0).receipt], topic, "m", 0, 100)
    assert result.delivered is not None
    got += result.delivered.deliveries
    assert len(delivering._last_locks[("g", "m", topic)][0]) == 2  # both partitions' rows
    joined(console, topic, member="b")  # a rebalance: m keeps one partition
    runs = guesses_of(monkeypatch, push, "_in_one_transaction")
    result = delivery.ack_and_deliver(console, "g", [got.pop(0).receipt], topic, "m", 0, 100)
    assert result.acked.settled == 1
    assert result.delivered is not None
    assert len(result.delivered.deliveries) == 1
    assert runs == ([True, False] if connection.vendor == "postgresql" else [True])
    got += result.delivered.deliveries
    # The rows the member locks now are remembered: the next guess is right.
    assert len(delivering._last_locks[("g", "m", topic)][0]) == 1
    runs.clear()
    result = delivery.ack_and_deliver(console, "g", [got.pop(0).receipt], topic, "m", 0, 100)
    assert result.delivered is not None
    assert runs == [True]
    # b reads its partition: the rows m locked ahead were let go of.
    assert deliver(console, topic, member="b", n=1)


def test_ack_and_deliver__a_heartbeat_due_is_written_by_a_run_that_did_not_guess(
    topic_factory, console, monkeypatch
):
    """A call that locked offset rows ahead does not write the member's heartbeat (its row
    would be locked after those rows, where a call that did not guess locks it before them):
    when one is due, it rolls back and runs again unguessed, which writes it."""
    from django.db import connection

    from broker.core.delivery import push

    topic = topic_factory().name
    produce(console, topic, 4)
    joined(console, topic)
    got = list(deliver(console, topic, n=2))
    models.GroupMember.objects.filter(member_id="m").update(heartbeat_ms=1)
    runs = guesses_of(monkeypatch, push, "_in_one_transaction")
    result = delivery.ack_and_deliver(console, "g", [got[0].receipt], topic, "m", 0, 100)
    assert result.delivered is not None
    assert runs == ([True, False] if connection.vendor == "postgresql" else [True])
    assert models.GroupMember.objects.get(member_id="m").heartbeat_ms > 1
    runs.clear()
    result = delivery.ack_and_deliver(console, "g", [got[1].receipt], topic, "m", 0, 100)
    assert runs == [True]  # not due again so soon: guessed, and nothing written


def test_deliver_messages__the_locks_guessed_wrong_are_let_go_and_it_runs_again(
    topic_factory, console, monkeypatch
):
    from django.db import connection

    from broker.core.delivery import deliver as delivering

    topic = topic_factory(partitions=2).name
    produce(console, topic, 2, partition=0)
    produce(console, topic, 2, partition=1)
    joined(console, topic)
    assert len(deliver(console, topic, n=1)) == 1  # its lock remembered: both partitions
    joined(console, topic, member="b")  # a rebalance: m keeps one partition
    runs = guesses_of(monkeypatch, delivering, "_deliver_once")
    got = deliver(console, topic, n=10)
    held = {m.member_id: m.partitions for m in groups.describe_group(console, "g").members}
    assert {d.message.partition for d in got} <= set(held["m"])
    assert runs == ([True, False] if connection.vendor == "postgresql" else [True])
    runs.clear()
    assert deliver(console, topic, member="b", n=10)  # the rows m locked ahead were let go of
    deliver(console, topic, n=10)
    assert runs == [True, True]


@pytest.mark.django_db(transaction=True)
def test_ack_and_deliver__members_acking_through_rebalances_all_get_through(console):
    """Two members ack and push side by side, one of them polling beside too, while a third
    joins and leaves: their guesses of the rows to lock go wrong at each rebalance
    (deliver.lock_ahead), heartbeats fall due every 100 ms, and neither a deadlock nor a lost
    message comes of it."""
    import threading

    from django.db import connection

    from broker.core import topics

    topic = "t-guesses"
    topics.create_topic(console, topic, 4)
    for partition in range(4):
        produce(console, topic, 50, partition=partition)
    groups.configure_group(console, "g", session_timeout_ms=1000)
    for member in ("a", "b"):
        joined(console, topic, member=member)
    seen: set[tuple[int, int]] = set()
    failures: list[BaseException] = []
    stop = threading.Event()

    def poll(member):
        """A poll and an ack of two at a time, beside the member's ack and push."""
        try:
            while not stop.is_set():
                got = deliver(console, topic, member=member, n=2)
                seen.update((d.message.partition, d.message.offset) for d in got)
                if got:
                    delivery.ack_messages(console, "g", [d.receipt for d in got])
                else:
                    stop.wait(0.005)
        except BaseException as exc:  # reported below
            failures.append(exc)
        finally:
            connection.close()

    def work(member):
        try:
            held: list = []
            for _ in range(400):
                if not held:
                    if stop.is_set():
                        break
                    held = list(deliver(console, topic, member=member, n=8))
                    if not held:
                        stop.wait(0.005)
                        continue
                seen.update((d.message.partition, d.message.offset) for d in held)
                receipts = [d.receipt for d in held]
                result = delivery.ack_and_deliver(console, "g", receipts, topic, member, 0, 8)
                held = list(result.delivered.deliveries) if result.delivered else []
        except BaseException as exc:  # reported below
            failures.append(exc)
        finally:
            connection.close()

    def churn():
        try:
            for _ in range(6):
                joined(console, topic, member="c")
                threading.Event().wait(0.05)
                membership.leave_group(console, "g", "c")
                threading.Event().wait(0.05)
        except BaseException as exc:
            failures.append(exc)
        finally:
            stop.set()
            connection.close()

    threads = [threading.Thread(target=work, args=(m,)) for m in ("a", "b")]
    threads += [threading.Thread(target=poll, args=("a",)), threading.Thread(target=churn)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    # What the two did not get (held when a rebalance moved it, or left to the end) one
    # member takes now: every message got through at least once.
    for _ in range(40):
        rest = deliver(console, topic, member="a", n=100)
        if not rest:
            break
        seen.update((d.message.partition, d.message.offset) for d in rest)
        delivery.ack_messages(console, "g", [d.receipt for d in rest])
    assert seen == {(p, o) for p in range(4) for o in range(50)}


@pytest.mark.django_db(transaction=True)
def test_ack_and_deliver__a_guess_and_a_heartbeat_written_beside_it_do_not_deadlock(console):
    """A delivery that did not guess writes the member's heartbeat, then locks the offset
    rows; one that guessed holds those rows from its first round trip, so it must not wait
    for the member's row after that: it rolls back and runs again (deliver.lock_ahead)."""
    import threading

    from django.db import connection, transaction

    from broker.core import inflight, topics

    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's; SQLite serializes writers at BEGIN")
    topic = "t-beat"
    topics.create_topic(console, topic, 1)
    produce(console, topic, 4)
    joined(console, topic)
    got = list(deliver(console, topic, n=2))  # the member's offset rows remembered
    models.GroupMember.objects.filter(member_id="m").update(heartbeat_ms=1)
    keys = [
        (o.group_id, o.partition_id, o.subscriber)
        for o in models.GroupOffset.objects.filter(group__name="g")
    ]
    beaten, failures = threading.Event(), []

    def unguessed():
        try:
            with transaction.atomic():
                membership.touch_member_of_topic("g", "m", topic)  # the heartbeat: row locked
                beaten.set()
                threading.Event().wait(0.3)  # the guessed call is waiting meanwhile
                inflight.locked_offsets(keys)
        except BaseException as exc:  # reported below
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=unguessed)
    thread.start()
    assert beaten.wait(10)
    result = delivery.ack_and_deliver(console, "g", [got[0].receipt], topic, "m", 0, 100)
    thread.join(10)
    assert not thread.is_alive()
    assert failures == []
    assert result.acked.settled == 1
    assert result.delivered is not None


def test_ack_and_deliver__member_gone_after_a_guess_keeps_the_ack(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 5)
    joined(console, topic)
    joined(console, topic, member="other")
    got = list(deliver(console, topic, n=2))
    result = delivery.ack_and_deliver(console, "g", [got.pop(0).receipt], topic, "m", 0, 100)
    assert result.delivered is not None
    membership.leave_group(console, "g", "m")
    result = delivery.ack_and_deliver(console, "g", [got[0].receipt], topic, "m", 0, 100)
    assert result.acked.settled == 1
    assert result.delivered is None
    # Its leave handed offset 2 back; the other member gets it, and the rest.
    again = deliver(console, topic, member="other")
    assert sorted(d.message.offset for d in again) == [2, 3, 4]


def test_ack_and_deliver__an_invalid_ack_delivers_nothing(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 3)
    joined(console, topic)
    deliver(console, topic, n=1)
    with pytest.raises(errors.InvalidRequest):
        delivery.ack_and_deliver(console, "g", ["not-a-receipt"], topic, "m", 5, 100)
    assert committed("g", topic).in_flight == 1


def test_deliver_messages__a_rebalance_changes_the_partitions_read(topic_factory, console):
    """The partitions a member holds are read once per generation (membership.held_partitions)."""
    topic = topic_factory(partitions=2).name
    produce(console, topic, 1, partition=0)
    produce(console, topic, 1, partition=1)
    joined(console, topic, member="a")
    first = deliver(console, topic, member="a")
    assert {d.message.partition for d in first} == {0, 1}
    delivery.ack_messages(console, "g", [d.receipt for d in first])
    joined(console, topic, member="b")
    produce(console, topic, 1, partition=0)
    produce(console, topic, 1, partition=1)
    held = {m.member_id: m.partitions for m in groups.describe_group(console, "g").members}
    for member in ("a", "b"):
        got = deliver(console, topic, member=member)
        assert [(d.message.partition, d.message.offset) for d in got] == [(held[member][0], 1)]


# Statements per call of the prefetch-2 loop (an ack of one message, a delivery of one), as
# Django's cursor sees them: savepoints included (the test's transaction), SQLite's multi-row
# in-flight INSERT and its PRAGMAs not (they bypass it); PostgreSQL's in-flight INSERT of one
# run is counted (a COPY, from bulk.PG_COPY_MIN_ROWS rows on, would not be).
# docs/benchmarks.md#the-per-message-path-benchper_messagepy has the before and after.
STATEMENTS = {
    "sqlite": {
        "ack": 7,
        "ack, unguessed": 7,
        "deliver": 6,
        "ack_and_deliver": 8,
        "ack_and_deliver, unguessed": 8,
    },
    "postgresql": {
        "ack": 8,
        "ack, unguessed": 8,
        "deliver": 9,
        "ack_and_deliver": 11,
        "ack_and_deliver, unguessed": 11,
    },
}


# Round trips to PostgreSQL of the same calls outside a test's transaction (its COMMIT
# included, the test's savepoint pair not): statements deferred with bulk.defer share the
# next one's pipeline, or the COMMIT's, and reads announced with bulk.read_ahead the
# previous one's (the member's with its group's lock, the ack's runs and the messages to
# deliver with their offsets' lock), and a delivery whose member's offset rows this process
# locked before locks them with the group's lock (deliver.lock_ahead); an ack of a clustering
# group this process settled for before locks its offset rows, and reads its runs, with the
# group's read (settle._clustering_ids).
ROUND_TRIPS = {
    "ack": 2,
    "ack, unguessed": 3,
    "deliver": 2,
    "ack_and_deliver": 2,
    "ack_and_deliver, unguessed": 3,
}


def test_ack_and_deliver__statements(topic_factory, console, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    # Statements that went in a pipeline with others, but the first of each; and those of the
    # last flush of deferred statements (deferred to the end, they go before the test's RELEASE
    # SAVEPOINT in their own pipeline, where outside a test they go with the COMMIT).
    shared: list[int] = []
    last: list[str] = []
    flushing: list[bool] = []
    pipeline, flush = bulk._pipeline, bulk.flush_deferred

    def counted(db, statements, then=None):
        shared.append(len(statements) - 1)
        last[:] = [sql for sql, _ in statements] if flushing else []
        return pipeline(db, statements, then)

    def flushed(db):
        flushing.append(True)
        try:
            flush(db)
        finally:
            flushing.pop()

    def trips_of(captured):
        sqls = [q["sql"] for q in captured.captured_queries]
        at_end = sqls[-1 - len(last) : -1] == last
        with_commit = bool(last) and at_end and sqls[-1].startswith("RELEASE SAVEPOINT")
        return len(sqls) - sum(shared) - with_commit

    monkeypatch.setattr(bulk, "_pipeline", counted)
    monkeypatch.setattr(bulk, "flush_deferred", flushed)
    topic = topic_factory().name
    produce(console, topic, 10)
    joined(console, topic)
    got = list(deliver(console, topic, n=2))
    # Warm: the first delivery reads the member's leases and creates its offsets.
    delivery.ack_messages(console, "g", [got.pop(0).receipt])
    got += deliver(console, topic, n=1)
    counts, trips = {}, {}

    def measured(name, call):
        shared.clear()
        last.clear()
        with CaptureQueriesContext(connection) as seen:
            found = call()
        counts[name], trips[name] = len(seen.captured_queries), trips_of(seen)
        return found

    measured("ack", lambda: delivery.ack_messages(console, "g", [got.pop(0).receipt]))
    got += deliver(console, topic, n=1)
    # On a process that has not settled for the group yet: its offset rows are locked after
    # its read.
    monkeypatch.setattr(settle, "_clustering_ids", {})
    measured("ack, unguessed", lambda: delivery.ack_messages(console, "g", [got.pop(0).receipt]))
    got += measured("deliver", lambda: deliver(console, topic, n=1))
    result = measured(
        "ack_and_deliver",
        lambda: delivery.ack_and_deliver(console, "g", [got.pop(0).receipt], topic, "m", 0, 100),
    )
    assert result.delivered is not None
    assert len(result.delivered.deliveries) == 1
    got += result.delivered.deliveries
    # On a process that has not delivered to the member yet: its offset rows are not locked
    # ahead, with its group's lock (deliver.lock_ahead), but after.
    from broker.core.delivery import deliver as delivering

    monkeypatch.setattr(delivering, "_last_locks", {})
    result = measured(
        "ack_and_deliver, unguessed",
        lambda: delivery.ack_and_deliver(console, "g", [got.pop(0).receipt], topic, "m", 0, 100),
    )
    assert result.delivered is not None
    assert len(result.delivered.deliveries) == 1
    assert counts == STATEMENTS[connection.vendor]
    if connection.vendor == "postgresql":
        # The savepoint pair out, the COMMIT in.
        assert {call: n - 2 + 1 for call, n in trips.items()} == ROUND_TRIPS


def test_ack_messages__a_group_made_again_under_its_name(topic_factory, console):
    """On PostgreSQL an ack locks the offset rows of the group id this process last settled for
    under the name, with the group's read (settle._clustering_ids). After the group is deleted
    and made again (a new id), in clustering mode or in broadcast mode, or is gone, an ack
    settles what it names and nothing else, and the guess follows the group."""
    topic = topic_factory(partitions=2).name
    for partition in (0, 1):
        produce(console, topic, 4, partition=partition)
    joined(console, topic)
    old = list(deliver(console, topic, n=4))
    assert delivery.ack_messages(console, "g", [old.pop(0).receipt]).settled == 1
    first_id = group_id("g")
    if bulk.vendor() == "postgresql":
        assert settle._clustering_ids["g"] == first_id

    groups.delete_group(console, "g", force=True)
    with pytest.raises(errors.GroupNotFound):
        delivery.ack_messages(console, "g", [old[0].receipt])
    joined(console, topic)
    again = list(deliver(console, topic, n=4))
    assert group_id("g") != first_id
    result = delivery.ack_messages(console, "g", [old[0].receipt, again[0].receipt])
    assert (result.settled, result.stale) == (1, (old[0].receipt,))
    if bulk.vendor() == "postgresql":
        assert settle._clustering_ids["g"] == group_id("g")
    assert committed("g", topic, again[0].message.partition).in_flight == 3

    groups.delete_group(console, "g", force=True)
    groups.configure_group(console, "g", mode="broadcast")
    joined(console, topic, "a")
    joined(console, topic, "b")
    a, b = deliver(console, topic, "a", n=8), deliver(console, topic, "b", n=8)
    assert len(a) == len(b) == 8
    result = delivery.ack_messages(console, "g", [d.receipt for d in a] + [again[1].receipt])
    assert (result.settled, result.stale) == (8, (again[1].receipt,))
    assert "g" not in settle._clustering_ids
    assert deliver(console, topic, "a") == ()
    assert delivery.ack_messages(console, "g", [d.receipt for d in b]).settled == 8


def test_deliver_messages__partitions_take_turns_and_the_first_is_read_with_the_lock(
    topic_factory, console, monkeypatch
):
    """A member of several partitions reads a different one first at each delivery; on
    PostgreSQL that first read goes in the offset rows' lock's round trip (bulk.read_ahead)."""
    from django.db import connection

    from broker.core import pgwire

    topic = topic_factory(partitions=3).name
    for partition in range(3):
        produce(console, topic, 4, partition=partition)
    joined(console, topic)
    alone: list[str] = []  # the first statement of each round trip that read messages
    real = pgwire.execute

    def seen(db, statements, commit=False):
        sqls = [sql for sql, _ in statements]
        if log.SELECT_MESSAGES in sqls and not any("FOR NO KEY UPDATE" in s for s in sqls):
            alone.append(sqls[0])
        return real(db, statements, commit)

    monkeypatch.setattr(pgwire, "execute", seen)
    got = list(deliver(console, topic, n=1))
    firsts = []
    for _ in range(6):
        result = delivery.ack_and_deliver(console, "g", [got.pop(0).receipt], topic, "m", 0, 9)
        assert result.delivered is not None
        (delivered,) = result.delivered.deliveries
        firsts.append(delivered.message.partition)
        got.append(delivered)
    assert sorted(firsts[:3]) == sorted(firsts[3:]) == [0, 1, 2]
    assert firsts[:3] == firsts[3:]
    if connection.vendor == "postgresql":
        # The first delivery from each partition had no guess yet; then none read alone.
        assert len(alone) <= 3
        alone.clear()
        for _ in range(3):
            result = delivery.ack_and_deliver(console, "g", [got.pop(0).receipt], topic, "m", 0, 9)
            assert result.delivered is not None
            got += result.delivered.deliveries
        assert alone == []


@pytest.mark.parametrize("off_by", [-2, 3])
def test_ack_and_deliver__a_wrong_guess_of_the_next_read_is_not_used(
    topic_factory, console, off_by, monkeypatch
):
    """The messages read ahead with the offsets' lock start where this process's last delivery
    ended; when the delivery starts elsewhere (another process delivered, a seek), it reads for
    itself."""
    from broker.core.delivery import deliver as delivering

    topic = topic_factory().name
    produce(console, topic, 10)
    joined(console, topic)
    got = list(deliver(console, topic, n=4))
    assert delivering._next_reads  # the guesses the next lock reads ahead with
    monkeypatch.setattr(
        delivering,
        "_next_reads",
        {key: offset + off_by for key, offset in delivering._next_reads.items()},
    )
    result = delivery.ack_and_deliver(console, "g", [got[0].receipt], topic, "m", 1, 100)
    assert result.delivered is not None
    assert [d.message.offset for d in result.delivered.deliveries] == [4, 5]
    assert [d.message.value for d in result.delivered.deliveries] == [b"4", b"5"]
    # From there on, the guess is right again.
    result = delivery.ack_and_deliver(console, "g", [got[1].receipt], topic, "m", 0, 100)
    assert result.delivered is not None
    assert [d.message.offset for d in result.delivered.deliveries] == [6]


def test_ack_and_deliver__committed_offsets_follow_the_lowest_in_flight(topic_factory, console):
    """The ack's committed offset, written by the delivery's own update on PostgreSQL: out of
    order, in order, and with nothing left to deliver."""
    topic = topic_factory().name
    produce(console, topic, 4)
    joined(console, topic)
    got = list(deliver(console, topic, n=3))

    def ack(receipt):
        result = delivery.ack_and_deliver(console, "g", [receipt], topic, "m", 0, 100)
        assert result.acked.settled == 1
        assert result.delivered is not None
        return [d.message.offset for d in result.delivered.deliveries], result.delivered

    # Out of order: offset 1 settled, 0 still in flight; the freed credit takes offset 3.
    offsets, third = ack(got[1].receipt)
    assert offsets == [3]
    assert committed("g", topic).committed_offset == 0
    # In order: the lowest in flight is 2 now; nothing is left to deliver.
    assert ack(got[0].receipt)[0] == []
    assert committed("g", topic).committed_offset == 2
    assert ack(got[2].receipt)[0] == []
    assert committed("g", topic).committed_offset == 3
    assert ack(third.deliveries[0].receipt)[0] == []
    lag = committed("g", topic)
    assert (lag.committed_offset, lag.in_flight) == (4, 0)


def test_ack_and_deliver__a_due_retry_goes_first(topic_factory, console):
    """Whether a retry is due is asked with the offsets' lock: a nacked message comes back
    before new ones, from a delivery alone and from an ack's."""
    topic = topic_factory().name
    produce(console, topic, 4)
    joined(console, topic)
    first, second = deliver(console, topic, n=2)
    delivery.nack_messages(console, "g", [first.receipt], delay_ms=0)
    again = deliver(console, topic, n=1)
    assert [(d.message.offset, d.attempt) for d in again] == [(0, 2)]
    delivery.nack_messages(console, "g", [again[0].receipt], delay_ms=0)
    result = delivery.ack_and_deliver(console, "g", [second.receipt], topic, "m", 0, 100)
    assert result.delivered is not None
    assert [(d.message.offset, d.attempt) for d in result.delivered.deliveries] == [(0, 3)]


def test_ack_and_deliver__receipt_of_an_earlier_assignment(topic_factory, console):
    """A receipt from a partition the member no longer holds is settled and the member's own
    partition delivered. On PostgreSQL its offset row is not among those locked first, so the
    ack takes a transaction of its own (core/delivery/push.py: the lock order)."""
    topic = topic_factory(partitions=2).name
    produce(console, topic, 3, partition=0)
    produce(console, topic, 3, partition=1)
    joined(console, topic, member="a")
    got = list(deliver(console, topic, member="a", n=100))
    assert {d.message.partition for d in got} == {0, 1}
    joined(console, topic, member="b")  # a rebalance: "a" keeps one partition
    members = groups.describe_group(groups_principal(), "g").members
    held = {p for m in members if m.member_id == "a" for p in m.partitions}
    assert len(held) == 1
    elsewhere = next(d for d in got if d.message.partition not in held)
    produce(console, topic, 1, partition=next(iter(held)))
    result = delivery.ack_and_deliver(console, "g", [elsewhere.receipt], topic, "a", 1, 100)
    assert result.acked.settled == 1
    assert result.delivered is not None
    assert [d.message.partition for d in result.delivered.deliveries] == sorted(held)
    # Its committed offset moved too, though the delivery writes only the member's rows.
    assert elsewhere.message.offset == 0
    assert committed("g", topic, partition=elsewhere.message.partition).committed_offset == 1


def test_deliver_messages__lookup_errors(topic_factory, console):
    """The one-statement lookup of topic, group and member falls back to each one's error."""
    topic, other = topic_factory().name, topic_factory().name
    produce(console, topic, 1)
    joined(console, topic)
    joined(console, other, member="elsewhere")
    with pytest.raises(errors.TopicNotFound):
        deliver(console, "no-such-topic")
    with pytest.raises(errors.MemberNotFound):
        deliver(console, topic, member="stranger")
    with pytest.raises(errors.MemberNotFound):
        deliver(console, topic, group="no-such-group")
    with pytest.raises(errors.InvalidRequest):
        deliver(console, topic, member="elsewhere")
    assert [d.message.offset for d in deliver(console, topic)] == [0]


def test_ack_and_deliver__writes_only_the_offset_rows_it_moved(topic_factory, console):
    """A member of several partitions: an ack and its push write the one partition's row, not
    one per partition (the statement that recomputes committed offsets names each row)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    topic = topic_factory(partitions=3).name
    for partition in range(3):
        produce(console, topic, 1, partition=partition)
    joined(console, topic)
    got = list(deliver(console, topic, n=3))  # every partition gets an offset row
    produce(console, topic, 1, partition=0)
    first = next(d for d in got if d.message.partition == 0)
    with CaptureQueriesContext(connection) as seen:
        result = delivery.ack_and_deliver(console, "g", [first.receipt], topic, "m", 0, 100)
    assert result.delivered is not None
    assert [d.message.partition for d in result.delivered.deliveries] == [0]
    (update,) = [q["sql"] for q in seen.captured_queries if q["sql"].startswith("WITH v")]
    # Seven values a row, and the time of the update.
    assert (update.count("%s") - 1) // 7 == 1
    assert committed("g", topic, partition=0).committed_offset == 1


def test_release_messages__back_at_once_with_the_same_attempt(topic_factory, console):
    topic = topic_factory().name
    produce(console, topic, 3)
    groups.configure_group(console, "g", max_attempts=2, retry_delays_ms=[60_000])
    joined(console, topic)
    got = deliver(console, topic)
    result = delivery.release_messages(console, "g", [got[1].receipt, got[2].receipt, "0.0.0"])
    assert (result.settled, result.stale) == (2, ("0.0.0",))
    assert runs() == [(0, 0, "delivered"), (1, 1, "retry_wait"), (2, 2, "retry_wait")]
    # Unsettled still: the committed offset stays; released, they are deliverable at once
    # (no backoff), with the attempt they had.
    assert committed("g", topic).committed_offset == 0
    again = deliver(console, topic)
    assert [(d.message.offset, d.attempt) for d in again] == [(1, 1), (2, 1)]
    # Not counted as failed: a nack now is the first failure of max_attempts=2.
    assert delivery.nack_messages(console, "g", [again[0].receipt]).dead_lettered == 0
    # The old receipts named nothing any more.
    assert delivery.release_messages(console, "g", [got[1].receipt]).stale == (got[1].receipt,)
    assert delivery.ack_messages(console, "g", [got[0].receipt, again[1].receipt]).settled == 2


def test_acks__settle_once_the_in_flight_ids_pass_a_smallint(topic_factory, console):
    """On PostgreSQL an ack deletes its runs by "id = ANY(list)". A process whose first acks
    named small ids went on sending later lists as smallint[], and every ack failed once the
    ids passed 32,767 (pgwire._Int8Context)."""
    topic = topic_factory().name
    produce(console, topic, 6)
    joined(console, topic)
    first = deliver(console, topic, n=2)
    assert delivery.ack_messages(console, "g", [d.receipt for d in first]).settled == 2
    if bulk.vendor() == "postgresql":
        bulk.run("SELECT setval(pg_get_serial_sequence('broker_inflight', 'id'), %s)", [40_000])
    later = deliver(console, topic, n=2)
    if bulk.vendor() == "postgresql":
        assert min(row.id for row in models.InFlight.objects.all()) > 40_000
    assert delivery.ack_messages(console, "g", [d.receipt for d in later]).settled == 2
    rest = deliver(console, topic, n=2)
    assert [d.message.offset for d in rest] == [4, 5]
    receipts = [d.receipt for d in rest]
    assert delivery.ack_and_deliver(console, "g", receipts, topic, "m", 0, 2).acked.settled == 2
    assert committed("g", topic).committed_offset == 6
