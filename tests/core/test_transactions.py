"""core/transactions.py: half messages, commit, rollback, fencing, carried offsets and acks."""

import orjson
import pytest

from broker import models
from broker.core import delivery, errors, groups, log, membership, topics, transactions
from broker.core.records import NewMessage


def msgs(*values, **fields):
    return [NewMessage(orjson.dumps(v), **fields) for v in values]


def stored(console, topic, partition=0):
    return [
        orjson.loads(m.value)
        for m in log.read_messages(console, topic, partition, None, 1000).messages
    ]


def test_commit_transaction__half_messages_invisible_until_commit(topic_factory, console):
    a, b = topic_factory().name, topic_factory().name
    log.append_messages(console, a, msgs("before"))
    t = transactions.begin_transaction(console, "p1", 60_000)
    transactions.add_messages(console, t.id, a, msgs(1, 2))
    transactions.add_messages(console, t.id, b, msgs(3))
    transactions.add_messages(console, t.id, a, msgs(4))
    assert stored(console, a) == ["before"]
    assert stored(console, b) == []
    result = transactions.commit_transaction(console, t.id)
    assert stored(console, a) == ["before", 1, 2, 4]
    assert stored(console, b) == [3]
    assert [(topic, r.offset) for topic, r in result.results] == [(a, 1), (a, 2), (b, 0), (a, 3)]
    assert result.transaction.state == "committed"
    assert result.transaction.reason == "producer"
    assert not models.StagedMessage.objects.exists()
    # A retried commit answers the committed transaction and appends nothing again.
    again = transactions.commit_transaction(console, t.id)
    assert again.transaction.state == "committed"
    assert again.results == ()
    assert stored(console, a) == ["before", 1, 2, 4]


def test_rollback_transaction__leaves_nothing(topic_factory, console):
    a = topic_factory().name
    t = transactions.begin_transaction(console, "p1", 60_000)
    transactions.add_messages(console, t.id, a, msgs(1, 2))
    info = transactions.rollback_transaction(console, t.id)
    assert (info.state, info.reason, info.messages) == ("rolled_back", "producer", 2)
    assert stored(console, a) == []
    assert not models.StagedMessage.objects.exists()
    assert transactions.rollback_transaction(console, t.id).state == "rolled_back"
    with pytest.raises(errors.TransactionNotOpen):
        transactions.commit_transaction(console, t.id)
    with pytest.raises(errors.TransactionNotOpen):
        transactions.add_messages(console, t.id, a, msgs(3))


def test_add_messages__bad_input_stores_nothing(topic_factory, console):
    a = topic_factory(max_message_bytes=10).name
    t = transactions.begin_transaction(console, "p1", 60_000)
    with pytest.raises(errors.MessageTooLarge):
        transactions.add_messages(console, t.id, a, msgs("ok", "x" * 50))
    with pytest.raises(errors.PartitionNotFound):
        transactions.add_messages(console, t.id, a, msgs(1, partition=3))
    with pytest.raises(errors.TopicNotFound):
        transactions.add_messages(console, t.id, "nope", msgs(1))
    assert not models.StagedMessage.objects.exists()
    assert transactions.get_transaction(console, t.id).messages == 0


def test_begin_transaction__validates(db, console):
    with pytest.raises(errors.InvalidRequest):
        transactions.begin_transaction(console, "bad id!", 1000)
    with pytest.raises(errors.InvalidRequest):
        transactions.begin_transaction(console, "p", 0)
    with pytest.raises(errors.InvalidRequest):
        transactions.begin_transaction(console, "p", 1000, "ftp://x/")
    assert not models.Transaction.objects.exists()


def test_begin_transaction__fences_the_older_one(topic_factory, console):
    a = topic_factory().name
    old = transactions.begin_transaction(console, "p1", 60_000)
    transactions.add_messages(console, old.id, a, msgs(1))
    new = transactions.begin_transaction(console, "p1", 60_000)
    assert new.epoch == old.epoch + 1
    fenced = transactions.get_transaction(console, old.id)
    assert (fenced.state, fenced.reason) == ("rolled_back", "fenced")
    with pytest.raises(errors.Fenced):
        transactions.add_messages(console, old.id, a, msgs(2))
    with pytest.raises(errors.Fenced):
        transactions.commit_transaction(console, old.id)
    with pytest.raises(errors.Fenced):
        transactions.rollback_transaction(console, old.id)
    transactions.add_messages(console, new.id, a, msgs(3))
    transactions.commit_transaction(console, new.id)
    assert stored(console, a) == [3]
    # Another producer id is not fenced.
    other = transactions.begin_transaction(console, "p2", 60_000)
    assert transactions.get_transaction(console, other.id).state == "open"


def test_begin_transaction__producer_id_belongs_to_its_key(key_factory):
    alice, _ = key_factory("produce:*")
    bob, _ = key_factory("produce:*")
    t = transactions.begin_transaction(alice, "shared", 60_000)
    with pytest.raises(errors.PermissionDenied):
        transactions.begin_transaction(bob, "shared", 60_000)
    with pytest.raises(errors.TransactionNotFound):
        transactions.get_transaction(bob, t.id)
    with pytest.raises(errors.TransactionNotFound):
        transactions.commit_transaction(bob, t.id)
    assert transactions.list_transactions(bob) == []
    assert [i.id for i in transactions.list_transactions(alice)] == [t.id]


def test_add_messages__needs_produce_on_the_topic(topic_factory, key_factory):
    a = topic_factory(name="orders.eu").name
    other = topic_factory(name="payments").name
    key, _ = key_factory("produce:orders.*")
    t = transactions.begin_transaction(key, "p", 60_000)
    transactions.add_messages(key, t.id, a, msgs(1))
    with pytest.raises(errors.PermissionDenied):
        transactions.add_messages(key, t.id, other, msgs(1))


def test_commit_transaction__carries_group_offsets(topic_factory, console):
    src, out = topic_factory().name, topic_factory().name
    log.append_messages(console, src, msgs(1, 2, 3))
    polled = groups.poll_messages(console, "g", src, 2, auto_commit=False)
    t = transactions.begin_transaction(console, "p", 60_000)
    transactions.add_messages(
        console, t.id, out, msgs(*(orjson.loads(m.value) * 10 for m in polled.messages))
    )
    transactions.add_offsets(console, t.id, "g", src, polled.next_offsets)
    # Not committed yet: the group still reads from 0.
    assert groups.poll_messages(console, "g", src, 10, False).messages[0].offset == 0
    transactions.commit_transaction(console, t.id)
    assert stored(console, out) == [10, 20]
    assert [m.offset for m in groups.poll_messages(console, "g", src, 10, False).messages] == [2]


def test_rollback_transaction__carried_offsets_do_nothing(topic_factory, console):
    src = topic_factory().name
    log.append_messages(console, src, msgs(1, 2))
    t = transactions.begin_transaction(console, "p", 60_000)
    transactions.add_offsets(console, t.id, "g", src, {0: 2})
    transactions.rollback_transaction(console, t.id)
    assert len(groups.poll_messages(console, "g", src, 10, False).messages) == 2


def test_commit_transaction__carries_acks(topic_factory, console):
    src, out = topic_factory().name, topic_factory().name
    log.append_messages(console, src, msgs(1, 2))
    membership.join_group(console, "g", src, "m")
    got = delivery.deliver_messages(console, "g", src, "m", 10).deliveries
    t = transactions.begin_transaction(console, "p", 60_000)
    transactions.add_messages(console, t.id, out, msgs("done"))
    transactions.add_acks(console, t.id, "g", [d.receipt for d in got])
    assert models.InFlight.objects.count() == 1
    transactions.commit_transaction(console, t.id)
    assert not models.InFlight.objects.exists()
    assert stored(console, out) == ["done"]


def test_commit_transaction__stale_receipt_aborts_everything(topic_factory, console):
    src, out = topic_factory().name, topic_factory().name
    log.append_messages(console, src, msgs(1))
    membership.join_group(console, "g", src, "m")
    got = delivery.deliver_messages(console, "g", src, "m", 10).deliveries
    t = transactions.begin_transaction(console, "p", 60_000)
    transactions.add_messages(console, t.id, out, msgs("derived"))
    transactions.add_acks(console, t.id, "g", [got[0].receipt])
    transactions.add_offsets(console, t.id, "other", src, {0: 1})
    # Someone else settled it meanwhile: the transaction's work must be redone.
    delivery.ack_messages(console, "g", [got[0].receipt])
    with pytest.raises(errors.TransactionAborted) as raised:
        transactions.commit_transaction(console, t.id)
    assert raised.value.detail["reason"] == "stale_receipts"
    info = transactions.get_transaction(console, t.id)
    assert (info.state, info.reason) == ("rolled_back", "stale_receipts")
    assert stored(console, out) == []
    assert groups.poll_messages(console, "other", src, 10, False).messages[0].offset == 0


def test_commit_transaction__full_topic_leaves_it_open(topic_factory, console):
    a = topic_factory(capacity=2).name
    t = transactions.begin_transaction(console, "p", 60_000)
    transactions.add_messages(console, t.id, a, msgs(1, 2, 3))
    with pytest.raises(errors.TopicFull):
        transactions.commit_transaction(console, t.id)
    assert stored(console, a) == []
    assert transactions.get_transaction(console, t.id).state == "open"
    transactions.rollback_transaction(console, t.id)


def test_commit_transaction__dedups_client_ids_like_produce(topic_factory, console):
    a = topic_factory().name
    log.append_messages(console, a, [NewMessage(b"1", client_id="x")])
    t = transactions.begin_transaction(console, "p", 60_000)
    transactions.add_messages(
        console, t.id, a, [NewMessage(b"2", client_id="x"), NewMessage(b"3", client_id="y")]
    )
    transactions.add_messages(console, t.id, a, [NewMessage(b"4", client_id="y")])
    result = transactions.commit_transaction(console, t.id)
    assert [(r.offset, r.duplicate) for _, r in result.results] == [
        (0, True),
        (1, False),
        (1, True),
    ]
    assert stored(console, a) == [1, 3]


def test_commit_transaction__deleted_topic_aborts(topic_factory, console):
    a, b = topic_factory().name, topic_factory().name
    t = transactions.begin_transaction(console, "p", 60_000)
    transactions.add_messages(console, t.id, a, msgs(1))
    transactions.add_messages(console, t.id, b, msgs(2))
    topics.delete_topic(console, b)
    with pytest.raises(errors.TransactionAborted):
        transactions.commit_transaction(console, t.id)
    assert stored(console, a) == []
    assert transactions.get_transaction(console, t.id).reason == "topic_deleted"


def test_check_transactions__rolls_back_timed_out_without_check_url(topic_factory, console):
    a = topic_factory().name
    t = transactions.begin_transaction(console, "p", 1)
    transactions.add_messages(console, t.id, a, msgs(1))
    models.Transaction.objects.filter(id=t.id).update(deadline_ms=log.now_ms() - 1)
    done = transactions.run_checks()
    assert done.rolled_back == 1
    info = transactions.get_transaction(console, t.id)
    assert (info.state, info.reason) == ("rolled_back", "timeout")
    assert stored(console, a) == []


def test_check_transactions__purges_old_ended(db, console):
    t = transactions.begin_transaction(console, "p", 60_000)
    transactions.rollback_transaction(console, t.id)
    models.Transaction.objects.filter(id=t.id).update(ended_ms=1)
    assert transactions.run_checks().purged == 1
    assert not models.Transaction.objects.filter(id=t.id).exists()


def test_list_transactions__by_state(db, console):
    a = transactions.begin_transaction(console, "a", 60_000)
    b = transactions.begin_transaction(console, "b", 60_000)
    transactions.rollback_transaction(console, a.id)
    assert [t.id for t in transactions.list_transactions(console, "open")] == [b.id]
    assert [t.id for t in transactions.list_transactions(console)] == [b.id, a.id]
    with pytest.raises(errors.InvalidRequest):
        transactions.list_transactions(console, "weird")


class CheckServer:
    """A real HTTP callback on loopback answering check-backs with the next scripted answer."""

    def __init__(self, answers):
        import http.server
        import threading

        self.answers = list(answers)
        self.asked: list[dict] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                server.asked.append(orjson.loads(self.rfile.read(length)))
                answer = server.answers.pop(0) if server.answers else "unknown"
                body = orjson.dumps({"status": answer})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/check"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def check_server():
    made = []

    def make(*answers):
        made.append(CheckServer(answers))
        return made[-1]

    yield make
    for server in made:
        server.close()


def timed_out(console, topic, check_url, values=(1, 2)):
    t = transactions.begin_transaction(console, "p", 60_000, check_url)
    transactions.add_messages(console, t.id, topic, msgs(*values))
    models.Transaction.objects.filter(id=t.id).update(deadline_ms=log.now_ms() - 1)
    return t


def test_check_transactions__check_back_commit(topic_factory, console, check_server):
    a = topic_factory().name
    server = check_server("commit")
    t = timed_out(console, a, server.url)
    done = transactions.run_checks()
    assert (done.checked, done.committed) == (1, 1)
    assert stored(console, a) == [1, 2]
    info = transactions.get_transaction(console, t.id)
    assert (info.state, info.reason, info.checks) == ("committed", "check_back", 1)
    assert server.asked[0]["transaction_id"] == t.id
    assert server.asked[0]["producer_id"] == "p"


def test_check_transactions__check_back_rollback(topic_factory, console, check_server):
    a = topic_factory().name
    t = timed_out(console, a, check_server("rollback").url)
    assert transactions.run_checks().rolled_back == 1
    assert stored(console, a) == []
    info = transactions.get_transaction(console, t.id)
    assert (info.state, info.reason) == ("rolled_back", "check_back")


def test_check_transactions__unknown_then_rolled_back_after_max(
    topic_factory, console, check_server, settings
):
    settings.FERRY_TRANSACTION_MAX_CHECKS = 3
    settings.FERRY_TRANSACTION_CHECK_BACKOFF_MS = 0
    a = topic_factory().name
    server = check_server("unknown", "unknown", "unknown")
    t = timed_out(console, a, server.url)
    transactions.run_checks()
    info = transactions.get_transaction(console, t.id)
    assert (info.state, info.checks, info.last_check) == ("open", 1, "check answered unknown")
    transactions.run_checks()
    transactions.run_checks()
    info = transactions.get_transaction(console, t.id)
    assert (info.state, info.reason, info.checks) == ("rolled_back", "check_back_unresolved", 3)
    assert [q["checks"] for q in server.asked] == [1, 2, 3]
    assert stored(console, a) == []


def test_check_transactions__backoff_between_checks(topic_factory, console, check_server, settings):
    settings.FERRY_TRANSACTION_CHECK_BACKOFF_MS = 60_000
    a = topic_factory().name
    server = check_server("unknown", "commit")
    t = timed_out(console, a, server.url)
    transactions.run_checks()
    transactions.run_checks()
    assert len(server.asked) == 1  # the next check waits for its backoff
    info = transactions.get_transaction(console, t.id)
    assert info.next_check_ms is not None
    assert info.next_check_ms > log.now_ms() + 50_000


def test_check_transactions__callback_down(topic_factory, console, check_server, settings):
    settings.FERRY_TRANSACTION_MAX_CHECKS = 2
    settings.FERRY_TRANSACTION_CHECK_BACKOFF_MS = 0
    a = topic_factory().name
    server = check_server()
    url = server.url
    server.close()
    t = timed_out(console, a, url)
    transactions.run_checks()
    info = transactions.get_transaction(console, t.id)
    assert info.state == "open"
    assert info.last_check.startswith("check failed")
    transactions.run_checks()
    info = transactions.get_transaction(console, t.id)
    assert (info.state, info.reason) == ("rolled_back", "check_back_unresolved")


def test_check_transactions__producer_may_still_commit_past_timeout(topic_factory, console):
    a = topic_factory().name
    t = timed_out(console, a, "http://127.0.0.1:9/never")
    transactions.commit_transaction(console, t.id)
    assert stored(console, a) == [1, 2]
    assert transactions.run_checks().checked == 0


def test_begin_transaction__with_the_first_messages(topic_factory, console):
    a = topic_factory(max_message_bytes=10).name
    t = transactions.begin_transaction(console, "p", 60_000, None, a, msgs(1, 2))
    assert (t.messages, t.topics) == (2, (a,))
    with pytest.raises(errors.MessageTooLarge):
        transactions.begin_transaction(console, "q", 60_000, None, a, msgs("x" * 20))
    with pytest.raises(errors.InvalidRequest):
        transactions.begin_transaction(console, "q", 60_000, None, a, [])
    # A refused begin stores nothing and fences nothing.
    assert not models.Transaction.objects.filter(producer_id="q").exists()
    assert stored(console, a) == []
    transactions.commit_transaction(console, t.id)
    assert stored(console, a) == [1, 2]


def test_run_shared__each_call_all_or_nothing_on_its_own(topic_factory, console):
    a = topic_factory().name
    full = topic_factory(capacity=1).name
    good = transactions.begin_transaction(console, "good", 60_000, None, a, msgs(1, 2))
    bad = transactions.begin_transaction(console, "bad", 60_000, None, full, msgs(1, 2))
    outcomes = transactions.run_shared(
        [
            lambda: transactions.commit_transaction(console, good.id),
            lambda: transactions.commit_transaction(console, bad.id),
            lambda: transactions.begin_transaction(console, "next", 60_000, None, a, msgs(3)),
        ]
    )
    assert outcomes[0].transaction.state == "committed"
    assert isinstance(outcomes[1], errors.TopicFull)
    assert outcomes[2].messages == 1
    assert stored(console, a) == [1, 2]
    assert stored(console, full) == []
    assert transactions.get_transaction(console, bad.id).state == "open"


def test_commit_transaction__a_failed_append_moves_no_offset(topic_factory, console):
    src, full = topic_factory().name, topic_factory(capacity=1).name
    log.append_messages(console, src, msgs(1, 2))
    t = transactions.begin_transaction(console, "p", 60_000, None, full, msgs("a", "b"))
    transactions.add_offsets(console, t.id, "g", src, {0: 2})
    with pytest.raises(errors.TopicFull):
        transactions.commit_transaction(console, t.id)
    # Consume-transform-produce failed midway: the group still reads from the start.
    assert len(groups.poll_messages(console, "g", src, 10, False).messages) == 2


class OtherService:
    """A loopback HTTP service that is not a check-back: it answers anything with a secret, and
    a redirector in front of it sends every POST there (302)."""

    SECRET = "internal-secret-4711"

    def __init__(self):
        import http.server
        import threading

        self.requests: list[str] = []
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                service.requests.append(f"{self.command} {self.path}")
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", f"{service.url}/secret")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = service.SECRET.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_check_transactions__a_check_url_cannot_read_another_service(db, console):
    """No redirect is followed, and an answer's body never reaches last_check
    (docs/transactions.md#check-back)."""
    service = OtherService()
    try:
        redirected = transactions.begin_transaction(console, "r", 60_000, f"{service.url}/redirect")
        elsewhere = transactions.begin_transaction(console, "s", 60_000, f"{service.url}/secret")
        models.Transaction.objects.update(deadline_ms=log.now_ms() - 1)
        transactions.run_checks()
    finally:
        service.close()
    assert sorted(service.requests) == ["POST /redirect", "POST /secret"]  # no GET /secret
    first = transactions.get_transaction(console, redirected.id)
    assert (first.state, first.last_check) == ("open", "check failed: HTTP 302")
    second = transactions.get_transaction(console, elsewhere.id)
    assert second.last_check == (
        f"check answered {len(OtherService.SECRET)} characters, not commit, rollback or unknown"
    )
    assert OtherService.SECRET not in second.last_check
