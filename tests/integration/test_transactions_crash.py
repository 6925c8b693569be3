"""SIGKILL a broker while transactions are open and committing, with produces beside them: no
acknowledged message is missing, offsets have no gaps, no transaction is partly visible, and
the open ones are resolved by check-back."""

import os
import signal
import threading
import time
from collections import Counter

import httpx
import orjson
import pytest

from broker import models
from broker.core import keys, log, transactions
from ferry_client import CheckBackServer
from tests.integration.conftest import other_sessions, start_daphne, wait_for_sessions_to_end

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

THREADS = 3
SIZE = 5


def test_transactions__survive_sigkill_and_are_resolved(key_factory, topic_factory):
    topic = topic_factory(partitions=2).name
    _, secret = key_factory("produce:*")
    committed: list[tuple[int, int]] = []  # (thread, n) whose commit answered 200
    produced: list[tuple[int, int]] = []  # (partition, offset) of acknowledged plain produces
    stop = threading.Event()
    lock = threading.Lock()

    def check(request):
        return "commit" if request.transaction_id % 2 == 0 else "rollback"

    with CheckBackServer(check) as server:
        before = other_sessions()
        proc, base = start_daphne()
        url = f"{base}/api/v1"

        def transactional(thread):
            with httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=10) as http:
                n = 0
                while not stop.is_set():
                    try:
                        tx = http.post(
                            f"{url}/transactions",
                            json={
                                "producer_id": f"crash-{thread}-{n}",
                                "timeout_ms": 60000,
                                "check_url": server.url,
                            },
                        ).json()["id"]
                        http.post(
                            f"{url}/transactions/{tx}/messages",
                            json={
                                "topic": topic,
                                "messages": [
                                    {"value": [thread, n, j], "key": f"k{j}"} for j in range(SIZE)
                                ],
                            },
                        ).raise_for_status()
                        if n % 3 != 2:  # every third stays open, for the check-back
                            response = http.post(f"{url}/transactions/{tx}/commit")
                            if response.status_code == 200:
                                with lock:
                                    committed.append((thread, n))
                    except (httpx.HTTPError, KeyError, ValueError):
                        return  # the broker died under us
                    n += 1

        def plain():
            with httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=10) as http:
                i = 0
                while not stop.is_set():
                    try:
                        response = http.post(
                            f"{url}/topics/{topic}/messages",
                            json={"messages": [{"value": ["plain", i]}]},
                        )
                    except httpx.HTTPError:
                        return
                    if response.status_code == 200:
                        with lock:
                            produced.extend(
                                (r["partition"], r["offset"]) for r in response.json()["results"]
                            )
                    i += 1

        workers = [threading.Thread(target=transactional, args=(t,)) for t in range(THREADS)]
        workers.append(threading.Thread(target=plain))
        for w in workers:
            w.start()
        try:
            deadline = time.monotonic() + 60
            while len(committed) < 10:
                assert time.monotonic() < deadline, "the producers did not get going"
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            stop.set()
            for w in workers:
                w.join(30)
            wait_for_sessions_to_end(before)

        # After the crash: what was acknowledged is there, whole.
        rows = models.Message.objects.filter(partition__topic__name=topic)
        seen: Counter[tuple[int, int]] = Counter()
        for value in rows.values_list("value", flat=True):
            decoded = orjson.loads(bytes(value))
            if decoded[0] != "plain":
                seen[(decoded[0], decoded[1])] += 1
        assert all(count == SIZE for count in seen.values()), seen
        assert set(committed) <= set(seen)
        stored = set(rows.values_list("partition__number", "offset"))
        assert set(produced) <= stored
        for p in models.Partition.objects.filter(topic__name=topic):
            offsets = sorted(o for n, o in stored if n == p.number)
            assert offsets == list(range(p.next_offset))

        # The open ones are checked back once past their timeout: none stays open.
        still_open = list(models.Transaction.objects.filter(state="open"))
        assert still_open
        models.Transaction.objects.update(deadline_ms=log.now_ms() - 1)
        transactions.run_checks()
    assert not models.Transaction.objects.filter(state="open").exists()
    assert not models.StagedMessage.objects.exists()
    for row in still_open:
        info = transactions.get_transaction(keys.CONSOLE, row.id)
        assert info.reason == "check_back"
        assert info.state == ("committed" if row.id % 2 == 0 else "rolled_back")
