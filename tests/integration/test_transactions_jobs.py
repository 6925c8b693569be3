"""Transaction check-back and timeouts through a real Celery beat and worker with Redis."""

import orjson
import pytest

from broker import models
from broker.core import log, transactions
from broker.core.records import NewMessage
from ferry_client import CheckBackServer
from tests.integration.conftest import stop
from tests.integration.test_redis import start_worker, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_celery_beat__checks_back_and_times_out(redis_url, topic_factory, console, tmp_path):
    topic = topic_factory().name
    with CheckBackServer(lambda request: "commit") as server:
        checked = transactions.begin_transaction(console, "checked", 60_000, server.url)
        transactions.add_messages(console, checked.id, topic, [NewMessage(orjson.dumps(1))])
        silent = transactions.begin_transaction(console, "silent", 60_000)
        transactions.add_messages(console, silent.id, topic, [NewMessage(orjson.dumps(2))])
        models.Transaction.objects.update(deadline_ms=log.now_ms() - 1)
        worker = start_worker(
            redis_url, tmp_path, "-B", FERRY_TRANSACTION_CHECK_INTERVAL_SECONDS="0.5"
        )
        try:
            wait_until(
                lambda: not models.Transaction.objects.filter(state="open").exists(),
                "beat to schedule check_transactions on the worker",
            )
        finally:
            stop(worker)
    assert transactions.get_transaction(console, checked.id).reason == "check_back"
    assert transactions.get_transaction(console, silent.id).reason == "timeout"
    values = [m.value for m in log.read_messages(console, topic, 0, None, 10).messages]
    assert values == [b"1"]
