"""Acknowledged delivery under concurrent members, ackers and sweeps, in threads and processes."""

import itertools
import random
import threading
import time
from collections import Counter, defaultdict

import orjson
import pytest
from django.db.models import F, Min, Sum

from broker import models
from broker.core import delivery, groups, keys, log, membership, retries
from broker.core.records import Delivery, NewMessage
from tests.concurrency.test_offsets import collect, run_threads, start_workers

pytestmark = pytest.mark.django_db(transaction=True)
CONSOLE = keys.CONSOLE
LONG_DEADLINE_MS = 600_000
WAIT_S = 20


def produce(topic_name, count, partitions, start=0):
    log.append_messages(
        CONSOLE,
        topic_name,
        [NewMessage(orjson.dumps(i), partition=i % partitions) for i in range(start, count)],
    )


def wait_until(condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def every_message(topic_name):
    return set(
        models.Message.objects.filter(partition__topic__name=topic_name).values_list(
            "partition__number", "offset"
        )
    )


def offsets_of(group, subscriber=""):
    """{partition: (committed offset, end offset, in flight)} of the group, through the core."""
    info = groups.describe_group(CONSOLE, group)
    return {
        p.partition: (p.committed_offset, p.end_offset, p.in_flight)
        for topic in info.topics
        if topic.subscriber == subscriber
        for p in topic.partitions
    }


def assert_all_committed(group, subscriber=""):
    offsets = offsets_of(group, subscriber)
    assert offsets
    for partition, (committed, end, in_flight) in offsets.items():
        assert (committed, in_flight) == (end, 0), f"partition {partition}"


def assert_each_message_once(records, topic_name, group):
    """Every message of the topic delivered once, on its first attempt, and all of it settled.

    records: (partition, offset, attempt, member) of every delivery, the drain's included.
    """
    places = Counter((p, o) for p, o, _, _ in records)
    assert [place for place, n in places.items() if n > 1] == [], "delivered twice"
    assert set(places) == every_message(topic_name)
    assert {attempt for *_, attempt, _ in records} == {1}
    assert_all_committed(group)


def drain(group, topic_name, member_id="closer"):
    """Deliver and ack whatever is left, as a last member; returns its deliveries."""
    membership.join_group(CONSOLE, group, topic_name, member_id)
    got = []
    for _ in range(100):
        result = delivery.deliver_messages(CONSOLE, group, topic_name, member_id, 100)
        if not result.deliveries:
            break
        delivery.ack_messages(CONSOLE, group, [d.receipt for d in result.deliveries])
        got += [
            (d.message.partition, d.message.offset, d.attempt, member_id) for d in result.deliveries
        ]
    membership.leave_group(CONSOLE, group, member_id)
    return got


def member_loop(
    group, topic_name, member_id, rounds, record, *, batch=5, pause_s=0.0, after_round=None
):
    """Join, deliver and ack `rounds` times, leave.

    Calls record(delivery, member_id, generation, delivered_s, acked_s) for each delivery, and
    after_round(result) after each round.
    """
    membership.join_group(CONSOLE, group, topic_name, member_id)
    try:
        for _ in range(rounds):
            result = delivery.deliver_messages(CONSOLE, group, topic_name, member_id, batch)
            delivered_s = time.monotonic()
            if result.deliveries:
                acked_s = time.monotonic()
                settled = delivery.ack_messages(
                    CONSOLE, group, [d.receipt for d in result.deliveries]
                )
                assert not settled.stale, settled
                for d in result.deliveries:
                    record(d, member_id, result.generation, delivered_s, acked_s)
            if after_round is not None:
                after_round(result)
            time.sleep(pause_s)
    finally:
        membership.leave_group(CONSOLE, group, member_id)


def run_with_sampler(target, count, sample):
    """run_threads(target, count) while another thread calls sample() until they are done."""
    done = threading.Event()
    finished = []
    lock = threading.Lock()

    def run(n):
        if n == count:
            while not done.is_set():
                sample()
                time.sleep(0.01)
            sample()
            return
        try:
            target(n)
        finally:
            with lock:
                finished.append(n)
                if len(finished) == count:
                    done.set()

    run_threads(run, count + 1)


def test_deliver_messages__clustering_delivers_each_message_once(topic_factory):
    topic = topic_factory(partitions=4)
    groups.configure_group(CONSOLE, "g", ack_deadline_ms=LONG_DEADLINE_MS)
    produce(topic.name, 160, 4)
    procs = start_workers(
        *[("member", topic.name, "g", f"proc-{n}", "10", "batch=4", "pause_ms=10") for n in (1, 2)]
    )
    records: list[tuple] = []
    generations = defaultdict(set)
    lock = threading.Lock()
    first_round, late_joined = threading.Event(), threading.Event()

    def record(d, member_id, *_):
        with lock:
            records.append((d.message.partition, d.message.offset, d.attempt, member_id))

    def member(n):
        member_id = f"thread-{n}"

        def after_round(result):
            generations[member_id].add(result.generation)
            if n == 0 and not first_round.is_set():
                first_round.set()
                # Rounds 2 on come after thread-2's join: a rebalance mid-run.
                late_joined.wait(WAIT_S)

        # Join while the processes deliver: each join (and each leave) rebalances them.
        wait_until(
            lambda: models.GroupMember.objects.filter(member_id__startswith="proc-").exists(),
            "a member process to join",
        )
        if n == 2:
            first_round.wait(WAIT_S)
            membership.join_group(CONSOLE, "g", topic.name, member_id)
            late_joined.set()
        # 4 rounds of 8 cannot empty a partition of 40: someone else reads its rest.
        member_loop(
            "g", topic.name, member_id, 4, record, batch=8, pause_s=0.005, after_round=after_round
        )

    try:
        run_threads(member, 3)
    finally:
        outputs = collect(procs)
    records += [(p, o, attempt, m) for out in outputs for p, o, attempt, m, *_ in out]
    records += drain("g", topic.name)

    assert_each_message_once(records, topic.name, "g")
    # thread-0 polled before and after a rebalance, and every partition a thread read was
    # read by another member too: partitions changed hands with messages left to deliver.
    assert len(generations["thread-0"]) > 1, generations
    holders = defaultdict(set)
    for p, _, _, m in records:
        holders[p].add(m)
    by_threads = [p for p, members in holders.items() if any("thread" in m for m in members)]
    assert by_threads
    assert all(len(holders[p]) > 1 for p in by_threads), holders


def test_ack_and_deliver__members_across_processes_each_message_once(topic_factory):
    """Acks that push the next batch from their own call (a waiting WebSocket subscriber's),
    in processes that join while the others deliver: each rebalance leaves receipts of
    partitions a member no longer holds (on PostgreSQL those take the two-transaction way, the
    lock order in docs/architecture.md#locks), and still every message goes out once and every
    ack settles."""
    topic = topic_factory(partitions=4)
    groups.configure_group(CONSOLE, "g", ack_deadline_ms=LONG_DEADLINE_MS)
    produce(topic.name, 400, 4)
    procs = start_workers(
        *[
            ("member", topic.name, "g", f"push-{n}", "25", "batch=2", "pause_ms=30", "push=1")
            for n in (1, 2, 3)
        ],
        ("member", topic.name, "g", "plain", "25", "batch=2", "pause_ms=30"),
    )
    outputs = collect(procs)
    records = [(p, o, attempt, m) for out in outputs for p, o, attempt, m, *_ in out]
    records += drain("g", topic.name)
    assert_each_message_once(records, topic.name, "g")


def test_ack_messages__concurrent_out_of_order_acks(topic_factory):
    topic = topic_factory(partitions=2)
    groups.configure_group(CONSOLE, "g", ack_deadline_ms=LONG_DEADLINE_MS)
    produce(topic.name, 400, 2)
    membership.join_group(CONSOLE, "g", topic.name, "m")
    delivered: list[Delivery] = []
    for _ in range(10):
        delivered += delivery.deliver_messages(CONSOLE, "g", topic.name, "m", 100).deliveries
    assert len(delivered) == 400
    rng = random.Random(7)
    rng.shuffle(delivered)
    ackers = 4
    shares = [delivered[n::ackers] for n in range(ackers)]
    places = [(d.message.partition, d.message.offset) for d in delivered]
    started: set[tuple[int, int]] = set()
    lock = threading.Lock()
    settled_counts = []
    samples = []

    def acker(n):
        mine = shares[n]
        local = random.Random(n)
        i = 0
        while i < len(mine):
            batch = mine[i : i + local.randint(1, 7)]
            i += len(batch)
            receipts = [d.receipt for d in batch]
            if local.random() < 0.2:
                # An ack repeated (a client's retry): that receipt is stale by now.
                receipts.append(mine[local.randrange(i - len(batch) + 1)].receipt)
            with lock:
                started.update((d.message.partition, d.message.offset) for d in batch)
            result = delivery.ack_messages(CONSOLE, "g", receipts)
            with lock:
                settled_counts.append(result.settled)

    def sample():
        committed = dict(
            models.GroupOffset.objects.filter(group__name="g").values_list(
                "partition__number", "committed_offset"
            )
        )
        # Read after the committed offsets: what is unsettled now was unsettled then too.
        lowest_in_flight = dict(
            models.InFlight.objects.filter(group__name="g")
            .values("partition__number")
            .annotate(low=Min("offset"))
            .values_list("partition__number", "low")
        )
        with lock:
            not_acked = [place for place in places if place not in started]
        lowest_unacked: dict[int, int] = {}
        for p, o in not_acked:
            lowest_unacked[p] = min(o, lowest_unacked.get(p, o))
        samples.append((committed, lowest_in_flight, lowest_unacked))

    run_with_sampler(acker, ackers, sample)
    assert sum(settled_counts) == 400
    assert len(samples) >= 3
    for committed, lowest_in_flight, lowest_unacked in samples:
        for p, offset in committed.items():
            assert offset <= lowest_in_flight.get(p, 200), (p, committed, lowest_in_flight)
            assert offset <= lowest_unacked.get(p, 200), (p, committed, lowest_unacked)
    for before, after in itertools.pairwise(samples):
        assert all(after[0][p] >= offset for p, offset in before[0].items()), "went back"
    assert offsets_of("g") == {0: (200, 200, 0), 1: (200, 200, 0)}


def test_deliver_messages__ordered_one_in_flight_per_partition(topic_factory):
    topic = topic_factory(partitions=3)
    groups.configure_group(CONSOLE, "g", ordered=True, ack_deadline_ms=LONG_DEADLINE_MS)
    produce(topic.name, 45, 3)
    procs = start_workers(
        *[("member", topic.name, "g", f"proc-{n}", "15", "pause_ms=5") for n in (1, 2)]
    )
    records: list[tuple] = []
    violations: list[tuple[int, int]] = []
    lock = threading.Lock()

    def over_one():
        # A row holds a run of offsets [offset, last_offset]: count the offsets.
        found = list(
            models.InFlight.objects.filter(group__name="g")
            .values("partition_id")
            .annotate(n=Sum(F("last_offset") - F("offset") + 1))
            .filter(n__gt=1)
            .values_list("partition_id", "n")
        )
        with lock:
            violations.extend(found)

    def record(d, member_id, generation, delivered_s, acked_s):
        over_one()  # after each delivery, before its ack
        with lock:
            records.append((d.message.partition, d.message.offset, member_id, delivered_s, acked_s))

    def member(n):
        # thread-1 leaves half-way and joins again: two more rebalances mid-run.
        for _ in range(2 if n == 1 else 1):
            member_loop("g", topic.name, f"thread-{n}", 8 if n == 1 else 15, record)

    try:
        run_with_sampler(member, 3, over_one)
    finally:
        outputs = collect(procs)
    records += [(p, o, m, d_s, a_s) for out in outputs for p, o, _, m, d_s, a_s in out]
    for p, o, _, m in drain("g", topic.name):
        records.append((p, o, m, time.monotonic(), time.monotonic()))

    assert violations == [], "two messages of one partition in flight at once"
    assert sorted((p, o) for p, o, *_ in records) == sorted(every_message(topic.name))
    by_partition = defaultdict(list)
    for p, o, m, delivered_s, acked_s in records:
        by_partition[p].append((delivered_s, acked_s, o, m))
    for p, deliveries in by_partition.items():
        deliveries.sort()
        # In offset order, each delivered only after the previous one was acked.
        assert [o for _, _, o, _ in deliveries] == list(range(len(deliveries))), p
        for earlier, later in itertools.pairwise(deliveries):
            assert earlier[1] < later[0], (p, earlier, later)
    assert_all_committed("g")


@pytest.mark.parametrize("batches", [False, True], ids=["by-message", "by-batch"])
def test_redeliver_expired__races_acks_and_nacks(topic_factory, batches):
    """by-batch: half the deliveries have one fate for the whole batch, so whole runs are
    nacked, forgotten (the sweep makes them wait as one row) and handed out again whole."""
    topic = topic_factory(partitions=3)
    groups.configure_group(CONSOLE, "g", ack_deadline_ms=1000, max_attempts=3, retry_delays_ms=[0])
    produce(topic.name, 45, 3)
    procs = start_workers(("sweep", "2"))
    deliveries: dict[tuple[int, int], list[tuple[int, str]]] = defaultdict(list)
    outcomes: dict[str, list[str]] = defaultdict(list)  # action: receipts it settled
    late: list[tuple[float, str]] = []  # (when, receipt): acks sent around the deadline
    lock = threading.Lock()
    stop = threading.Event()

    def settle(action, receipts, **options):
        if receipts:
            result = getattr(delivery, f"{action}_messages")(CONSOLE, "g", receipts, **options)
            with lock:
                outcomes[action] += [r for r in receipts if r not in result.stale]

    def member(n):
        rng = random.Random(n)
        membership.join_group(CONSOLE, "g", topic.name, f"m{n}")
        try:
            while not stop.is_set():
                result = delivery.deliver_messages(CONSOLE, "g", topic.name, f"m{n}", 6)
                actions = defaultdict(list)
                fates = ["ack", "nack", "reject", "late", "forget"]
                whole = rng.choices(fates, [50, 15, 5, 20, 10])[0]
                one_fate = batches and rng.random() < 0.5
                for d in result.deliveries:
                    with lock:
                        deliveries[(d.message.partition, d.message.offset)].append(
                            (d.attempt, d.receipt)
                        )
                    # Acked, nacked, rejected, acked about when its deadline passes, or
                    # forgotten (the sweep retries it after the deadline).
                    action = whole if one_fate else rng.choices(fates, [50, 15, 5, 20, 10])[0]
                    actions[action].append(d.receipt)
                settle("ack", actions["ack"])
                settle("nack", actions["nack"], error="boom", delay_ms=0)
                settle("reject", actions["reject"], error="bad")
                with lock:
                    late.extend(
                        (time.monotonic() + rng.uniform(0.9, 1.1), r) for r in actions["late"]
                    )
                if not result.deliveries:
                    time.sleep(0.02)
        finally:
            membership.leave_group(CONSOLE, "g", f"m{n}")

    def late_acker():
        while not stop.is_set() or late:
            now = time.monotonic()
            with lock:
                due = [r for when, r in late if when <= now]
                late[:] = [(when, r) for when, r in late if when > now]
            settle("ack", due)
            time.sleep(0.01)

    def sweeper():
        while not stop.is_set():
            delivery.redeliver_expired()
            with lock:
                waiting = bool(late)
            if time.monotonic() > give_up or (not waiting and all_settled()):
                stop.set()
            time.sleep(0.02)

    def all_settled():
        offsets = offsets_of("g")
        return len(offsets) == 3 and all(
            (committed, in_flight) == (end, 0) for committed, end, in_flight in offsets.values()
        )

    def run(n):
        try:
            if n == 3:
                late_acker()
            elif n == 4:
                sweeper()
            else:
                member(n)
        finally:
            # A role that fails stops the others; otherwise the sweeper has set it already.
            stop.set()

    give_up = time.monotonic() + 9
    try:
        run_threads(run, 5)
    finally:
        collect(procs)
    assert all_settled(), offsets_of("g")

    acked = set(outcomes["ack"])
    letters = retries.list_dead_letters(CONSOLE, "g", limit=1000)
    dead = {(item.partition, item.offset): item for item in letters.items}
    assert len(dead) == letters.total, "a message dead-lettered twice"
    assert set(deliveries) == every_message(topic.name), "a message was never delivered"
    for place, attempts in deliveries.items():
        numbers = [attempt for attempt, _ in attempts]
        # Redelivered only once the previous attempt failed: attempts count 1, 2, 3.
        assert sorted(numbers) == list(range(1, len(numbers) + 1)), place
        assert len(numbers) <= 3, place
        last = max(attempts)[1]
        settled_by_ack = [r for _, r in attempts if r in acked]
        if place in dead:
            assert settled_by_ack == [], f"{place} acked and dead-lettered"
            letter = dead[place]
            assert letter.attempts == len(numbers), place
            if letter.reason == "rejected":
                assert last in outcomes["reject"], place
            else:
                assert (letter.reason, letter.attempts) == ("max_attempts", 3), place
        else:
            # Settled by its last delivery's ack: an earlier receipt was stale by then.
            assert settled_by_ack == [last], place


def test_deliver_messages__broadcast_every_member_gets_everything_once(topic_factory):
    topic = topic_factory(partitions=3)
    groups.configure_group(CONSOLE, "g", mode="broadcast", ack_deadline_ms=LONG_DEADLINE_MS)
    produce(topic.name, 30, 3)
    procs = start_workers(
        *[
            ("member", topic.name, "g", f"proc-{n}", "300", "batch=10", "pause_ms=10", "want=90")
            for n in (1, 2)
        ]
    )
    try:
        wait_until(
            lambda: models.GroupMember.objects.filter(group__name="g").count() == 2,
            "both member processes to join",
        )
        # The rest arrives while they deliver.
        for start in range(30, 90, 10):
            produce(topic.name, start + 10, 3, start=start)
            time.sleep(0.05)
    finally:
        outputs = collect(procs)
    everything = sorted(every_message(topic.name))
    assert len(everything) == 90
    for member_id, out in zip(("proc-1", "proc-2"), outputs, strict=True):
        assert sorted((p, o) for p, o, *_ in out) == everything, member_id
        assert {attempt for _, _, attempt, *_ in out} == {1}
        # Each member's own offsets are past everything it was sent.
        assert_all_committed("g", subscriber=member_id)


def test_ack_messages__broadcast_members_ack_the_same_offsets(topic_factory):
    """Two members hold the same offsets in flight at once; each ack settles only its own."""
    topic = topic_factory().name
    groups.configure_group(CONSOLE, "g", mode="broadcast")
    for member_id in ("a", "b"):
        membership.join_group(CONSOLE, "g", topic, member_id)
    produce(topic, 5, 1)
    a = delivery.deliver_messages(CONSOLE, "g", topic, "a", 10).deliveries
    b = delivery.deliver_messages(CONSOLE, "g", topic, "b", 10).deliveries
    acked_a = delivery.ack_messages(CONSOLE, "g", [d.receipt for d in a])
    assert (acked_a.settled, acked_a.stale) == (5, ())
    assert offsets_of("g", "b") == {0: (0, 5, 5)}
    acked_b = delivery.ack_messages(CONSOLE, "g", [d.receipt for d in b])
    assert (acked_b.settled, acked_b.stale) == (5, ())
    assert offsets_of("g", "a") == offsets_of("g", "b") == {0: (5, 5, 0)}
