"""Console noun `produce`."""

import io

import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from broker.core import keys, log, scheduling


def stored(topic, partition=0):
    return log.read_messages(keys.CONSOLE, topic, partition, None, 100).messages


def stored_values(topic, partition=0):
    return [orjson.loads(m.value) for m in stored(topic, partition)]


@pytest.fixture
def stdin(monkeypatch):
    def feed(text):
        monkeypatch.setattr("sys.stdin", io.StringIO(text))

    return feed


def test_handle__stdin_lines_are_json_strings(ferry, topic_factory, stdin):
    topic_factory("orders")
    stdin('first\n\n{"not": "parsed"}\r\nlast')
    assert ferry("produce", "orders") == "produced 3 messages to orders\n"
    assert stored_values("orders") == ["first", '{"not": "parsed"}', "last"]
    assert all(m.is_json for m in stored("orders"))


def test_handle__json_lines(ferry, topic_factory, stdin):
    topic_factory("orders")
    stdin('{"id": 1}\n\n[1, 2]\n"text"\n3.5\nnull\n')
    assert ferry("produce", "orders", "--json") == "produced 5 messages to orders\n"
    assert stored_values("orders") == [{"id": 1}, [1, 2], "text", 3.5, None]


def test_handle__invalid_json_line_stores_nothing(ferry, topic_factory, stdin):
    topic_factory("orders")
    stdin('{"id": 1}\n{"id": 2\n{"id": 3}\n')
    with pytest.raises(CommandError, match=r"^malformed_json: Line 2 is not a JSON document"):
        ferry("produce", "orders", "--json")
    assert stored("orders") == ()


def test_handle__invalid_json_line_keeps_earlier_batches(topic_factory, stdin):
    topic_factory("orders")
    stdin("1\n2\n3\nnope\n5\n")
    stderr = io.StringIO()
    with pytest.raises(CommandError, match="Line 4"):
        call_command(
            "ferry",
            "produce",
            "orders",
            "--json",
            "--batch-size=2",
            stdout=io.StringIO(),
            stderr=stderr,
        )
    # Batch [1, 2] was committed; batch [3, nope] was rejected whole before the core call.
    assert stored_values("orders") == [1, 2]
    assert "2 messages were produced before the failing batch" in stderr.getvalue()


def test_handle__file_in_batches(ferry, topic_factory, tmp_path):
    topic_factory("orders")
    path = tmp_path / "orders.jsonl"
    path.write_text("".join(f'{{"n": {n}}}\n' for n in range(7)))
    out = ferry("produce", "orders", "--json", "--file", str(path), "--batch-size=3")
    assert out == "produced 7 messages to orders\n"
    assert stored_values("orders") == [{"n": n} for n in range(7)]


def test_handle__file_missing(ferry, topic_factory, tmp_path):
    topic_factory("orders")
    with pytest.raises(CommandError, match="cannot read"):
        ferry("produce", "orders", "--file", str(tmp_path / "missing.txt"))


def test_handle__file_not_utf8(ferry, topic_factory, tmp_path):
    topic_factory("orders")
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"ok\ncaf\xe9\n")
    with pytest.raises(CommandError, match=r"^invalid_message: Line 2 is not UTF-8"):
        ferry("produce", "orders", "--file", str(path))
    assert stored("orders") == ()


def test_handle__key_tag_headers_partition(ferry, topic_factory, stdin):
    topic_factory("orders", partitions=3)
    stdin("a\nb\n")
    ferry(
        "produce",
        "orders",
        "--key=customer-7",
        "--tag=created",
        "--header=source=cli",
        "--header",
        "trace=a=b",
        "--partition=2",
    )
    messages = stored("orders", partition=2)
    assert [orjson.loads(m.value) for m in messages] == ["a", "b"]
    assert {(m.key, m.tag) for m in messages} == {("customer-7", "created")}
    assert messages[0].headers == {"source": "cli", "trace": "a=b"}


def test_handle__one_message(ferry, topic_factory, stdin):
    topic_factory("orders")
    stdin("only\n")
    assert ferry("produce", "orders") == "produced 1 message to orders\n"


def test_handle__unknown_topic(ferry, stdin):
    stdin("a\n")
    with pytest.raises(CommandError, match=r"^topic_not_found: "):
        ferry("produce", "missing")


def test_handle__bad_header(ferry, topic_factory, stdin):
    topic_factory("orders")
    stdin("a\n")
    with pytest.raises(CommandError, match=r"^invalid_request: --header takes NAME=VALUE"):
        ferry("produce", "orders", "--header=novalue")


def test_handle__bad_batch_size(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match="must be at least 1"):
        ferry("produce", "orders", "--batch-size=0")


def test_handle__partition_not_found(ferry, topic_factory, stdin):
    topic_factory("orders", partitions=2)
    stdin("a\n")
    with pytest.raises(CommandError, match=r"^partition_not_found: "):
        ferry("produce", "orders", "--partition=5")


def test_handle__topic_full(ferry, topic_factory, stdin):
    topic_factory("orders", capacity=2)
    stdin("a\nb\nc\n")
    with pytest.raises(CommandError, match=r"^topic_full: "):
        ferry("produce", "orders")
    assert stored("orders") == ()


def test_handle__message_too_large(ferry, topic_factory, stdin):
    topic_factory("orders", max_message_bytes=8)
    stdin("a much longer line than eight bytes\n")
    with pytest.raises(CommandError, match=r"^message_too_large: "):
        ferry("produce", "orders")


def test_handle__delay_ms_schedules_every_line(ferry, topic_factory, stdin):
    topic_factory("orders")
    stdin("a\nb\n")
    before = log.now_ms()
    out = ferry("produce", "orders", "--delay-ms=60000")
    assert out == "produced 2 messages to orders (2 scheduled)\n"
    assert stored("orders") == ()
    found = scheduling.list_scheduled(keys.CONSOLE, "orders")
    assert [orjson.loads(s.value) for s in found] == ["a", "b"]
    assert all(before + 60_000 <= s.deliver_at_ms <= log.now_ms() + 60_000 for s in found)


def test_handle__level_and_deliver_at_ms(ferry, topic_factory, stdin):
    topic_factory("orders")
    before = log.now_ms()
    stdin("a\n")
    ferry("produce", "orders", "--level=18")
    stdin("b\n")
    ferry("produce", "orders", f"--deliver-at-ms={before + 60_000}")
    due = {
        orjson.loads(s.value): s.deliver_at_ms
        for s in scheduling.list_scheduled(keys.CONSOLE, "orders")
    }
    assert before + 7_200_000 <= due["a"] <= log.now_ms() + 7_200_000  # level 18 is 2 h
    assert due["b"] == before + 60_000


def test_handle__bad_level(ferry, topic_factory, stdin):
    topic_factory("orders")
    stdin("a\n")
    with pytest.raises(CommandError, match=r"^invalid_message: Message 0: level is 1 to 18"):
        ferry("produce", "orders", "--level=19")
    assert scheduling.list_scheduled(keys.CONSOLE, "orders") == []


def test_handle__two_delay_flags(ferry, topic_factory):
    topic_factory("orders")
    with pytest.raises(CommandError, match="not allowed with argument"):
        ferry("produce", "orders", "--delay-ms=1000", "--level=1")
