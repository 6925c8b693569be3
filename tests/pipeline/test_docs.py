"""Every Python example of docs/pipeline.md, and the Arrow examples of api.md and client.md,
run as they are (STYLE.md §11) against a real broker, in the shared SparkSession."""

import re
import tempfile
from pathlib import Path

import pytest

from broker.core import keys, topics
from ferry_client import Message, Producer, Reader

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples(name, containing=""):
    return [b for b in BLOCK.findall((DOCS / name).read_text()) if containing in b]


@pytest.fixture
def docs_broker(broker_url, ferry_key, monkeypatch):
    """The broker the docs assume: FERRY_URL, FERRY_KEY, topics orders and order-counts."""
    monkeypatch.setenv("FERRY_URL", broker_url)
    monkeypatch.setenv("FERRY_KEY", ferry_key)
    topics.create_topic(keys.CONSOLE, "orders", 2)
    topics.create_topic(keys.CONSOLE, "order-counts", 1)
    topics.create_topic(keys.CONSOLE, "client-demo", 2)
    with Producer(broker_url, ferry_key) as producer:
        orders = [Message({"order": i}, key=f"c{i % 3}", partition=i % 2) for i in range(10)]
        producer.send_batch("orders", orders)
        producer.send_batch("client-demo", [Message(i) for i in range(5)])
    return broker_url, ferry_key


def test_docs__pipeline_examples_run(spark, docs_broker, capsys, monkeypatch, tmp_path):
    blocks = examples("pipeline.md")
    assert len(blocks) == 4
    # The streaming example's checkpoint (tempfile.mkdtemp) under this test's directory, which
    # pytest removes, not in /tmp for good.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    for block in blocks:
        exec(compile(block, "docs/pipeline.md", "exec"), {})

    out = capsys.readouterr().out
    assert "[('c0', 4), ('c1', 3), ('c2', 3)]" in out
    assert "\n4\n" in out
    url, key = docs_broker
    counts = spark.read.format("ferry").options(url=url, apiKey=key, topic="order-counts").load()
    assert counts.count() >= 3  # one update per key at least
    # Streaming writes: ids are <query id>-<batch id>-<task partition>-<row index>.
    with Reader(url, key) as reader:
        ids = [m["id"] for m in reader.fetch("order-counts", 0, 0, 100).messages]
    assert all(re.fullmatch(r"[0-9a-f-]{36}-\d+-\d+-\d+", i) for i in ids), ids
    # The write example added two orders, and running it again adds nothing.
    orders = spark.read.format("ferry").options(url=url, apiKey=key, topic="orders").load()
    assert orders.count() == 12
    exec(compile(blocks[2], "docs/pipeline.md", "exec"), {})
    assert orders.count() == 12


def test_docs__arrow_examples_run(docs_broker, capsys):
    [api_example] = examples("api.md", "vnd.apache.arrow.stream")
    [client_example] = examples("client.md", "fetch_arrow")

    exec(compile(api_example, "docs/api.md", "exec"), {})
    exec(compile(client_example, "docs/client.md", "exec"), {})

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "5 5"  # partition 1 of orders: 5 rows, next offset 5
    per_partition = [line.split() for line in lines[1:]]  # "<partition> <n> rows"
    assert sum(int(n) for _, n, _ in per_partition) == 5
