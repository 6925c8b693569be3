import base64

import orjson
import pytest

from broker import models
from broker.core import browse, errors, log
from broker.core.records import NewMessage


def produce(principal, topic, n, partition=0, **fields):
    log.append_messages(
        principal,
        topic,
        [NewMessage(value=orjson.dumps(i), partition=partition, **fields) for i in range(n)],
    )


@pytest.fixture
def two(topic_factory, console):
    """A topic with 5 messages on partition 0 and 3 on 1, timestamps interleaved by offset."""
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 5, 0)
    produce(console, topic.name, 3, 1)
    for m in models.Message.objects.select_related("partition"):
        m.timestamp_ms = 1000 + m.offset * 10 + m.partition.number
        m.save(update_fields=["timestamp_ms"])
    return topic.name


def coords(items):
    return [(m.partition, m.offset) for m in items]


def test_browse_messages__newest_first_across_partitions_pages(two, console):
    page = browse.browse_messages(console, two, limit=3)
    assert coords(page.items) == [(0, 4), (0, 3), (1, 2)]
    page2 = browse.browse_messages(console, two, limit=3, cursor=page.next_cursor)
    assert coords(page2.items) == [(0, 2), (1, 1), (0, 1)]
    page3 = browse.browse_messages(console, two, limit=3, cursor=page2.next_cursor)
    assert (coords(page3.items), page3.next_cursor) == ([(1, 0), (0, 0)], None)
    back = browse.browse_messages(console, two, limit=3, cursor=page3.prev_cursor)
    assert coords(back.items) == [(0, 1), (1, 1), (0, 2)]


def test_browse_messages__one_partition_from_offset(two, console):
    forward = browse.browse_messages(
        console, two, partition=0, offset=1, newest_first=False, limit=2
    )
    assert coords(forward.items) == [(0, 1), (0, 2)]
    forward2 = browse.browse_messages(console, two, limit=2, cursor=forward.next_cursor)
    assert coords(forward2.items) == [(0, 3), (0, 4)]
    assert forward2.next_cursor is None
    backward = browse.browse_messages(console, two, partition=0, offset=3, limit=10)
    assert coords(backward.items) == [(0, 3), (0, 2), (0, 1), (0, 0)]
    assert backward.next_cursor is None


def test_browse_messages__from_timestamp(two, console):
    page = browse.browse_messages(console, two, partition=0, timestamp_ms=1020, newest_first=False)
    assert coords(page.items) == [(0, 2), (0, 3), (0, 4)]
    page = browse.browse_messages(console, two, timestamp_ms=1011, limit=2)
    assert coords(page.items) == [(1, 1), (0, 1)]


def test_browse_messages__message_fields(topic_factory, console):
    topic = topic_factory()
    log.append_messages(
        console,
        topic.name,
        [
            NewMessage(
                value=b"\x00\x01",
                is_json=False,
                key="k",
                tag="t",
                headers={"h": "v"},
                client_id="id-1",
            )
        ],
    )
    (m,) = browse.browse_messages(console, topic.name).items
    assert (m.key, m.tag, m.headers, m.value, m.is_json, m.client_id) == (
        "k",
        "t",
        {"h": "v"},
        b"\x00\x01",
        False,
        "id-1",
    )
    assert m.size_bytes == models.Message.objects.get().size_bytes


def test_browse_messages__errors(two, console, key_factory):
    with pytest.raises(errors.InvalidRequest):
        browse.browse_messages(console, two, offset=1)
    with pytest.raises(errors.InvalidRequest):
        browse.browse_messages(console, two, limit=0)
    with pytest.raises(errors.InvalidRequest):
        browse.browse_messages(console, two, cursor="x1:2")
    with pytest.raises(errors.PartitionNotFound):
        browse.browse_messages(console, two, partition=7)
    with pytest.raises(errors.TopicNotFound):
        browse.browse_messages(console, "missing")
    principal, _ = key_factory("produce:*")
    with pytest.raises(errors.PermissionDenied):
        browse.browse_messages(principal, two)


def test_get_message__found_and_gone(two, console):
    assert browse.get_message(console, two, 1, 2).offset == 2
    for partition, offset in ((1, 3), (0, 99)):
        with pytest.raises(errors.MessageNotFound):
            browse.get_message(console, two, partition, offset)
    with pytest.raises(errors.PartitionNotFound):
        browse.get_message(console, two, 5, 0)


def test_search_messages__by_key_and_id_indexed(topic_factory, console):
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 3, 0, key="a")
    produce(console, topic.name, 2, 1, key="b")
    log.append_messages(console, topic.name, [NewMessage(value=b"1", partition=1, client_id="x")])
    by_key = browse.search_messages(console, topic.name, key="a")
    assert coords(by_key.items) == [(0, 2), (0, 1), (0, 0)]
    assert (by_key.indexed, by_key.scanned, by_key.complete) == (True, 0, True)
    assert coords(browse.search_messages(console, topic.name, client_id="x").items) == [(1, 2)]
    assert browse.search_messages(console, topic.name, key="zzz").items == ()
    assert len(browse.search_messages(console, topic.name, key="a", limit=2).items) == 2


def test_search_messages__tag_and_header_scan_bounded(topic_factory, console):
    topic = topic_factory()
    produce(console, topic.name, 4, tag="red", headers={"h": "1"})
    produce(console, topic.name, 4, tag="blue", headers={"h": "2"})
    found = browse.search_messages(console, topic.name, tag="red")
    assert (coords(found.items), found.scanned, found.complete, found.indexed) == (
        [(0, 3), (0, 2), (0, 1), (0, 0)],
        8,
        True,
        False,
    )
    partial = browse.search_messages(console, topic.name, header=("h", "1"), scan_limit=5)
    assert (coords(partial.items), partial.scanned, partial.complete) == ([(0, 3)], 5, False)
    assert coords(browse.search_messages(console, topic.name, tag="blue", limit=1).items) == [
        (0, 7)
    ]


def test_search_messages__needs_a_condition(two, console):
    with pytest.raises(errors.InvalidRequest):
        browse.search_messages(console, two)
    with pytest.raises(errors.InvalidRequest):
        browse.search_messages(console, two, tag="x", scan_limit=0)


def test_export_messages__json_lines_chunked(topic_factory, console, monkeypatch):
    monkeypatch.setattr(browse, "EXPORT_CHUNK", 2)
    topic = topic_factory(partitions=2)
    produce(console, topic.name, 3, 0)
    log.append_messages(
        console, topic.name, [NewMessage(value=b"\xff", is_json=False, partition=1)]
    )
    lines = [orjson.loads(line) for line in browse.export_messages(console, topic.name)]
    assert [(r["partition"], r["offset"]) for r in lines] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [r.get("value") for r in lines[:3]] == [0, 1, 2]
    assert base64.b64decode(lines[3]["value_b64"]) == b"\xff"
    ranged = list(
        browse.export_messages(
            console, topic.name, partition=0, from_offset=1, to_offset=3, limit=1
        )
    )
    assert [orjson.loads(line)["offset"] for line in ranged] == [1]


def test_export_messages__checks_before_streaming(two, console, key_factory):
    principal, _ = key_factory("produce:*")
    with pytest.raises(errors.PermissionDenied):
        browse.export_messages(principal, two)
    with pytest.raises(errors.InvalidRequest):
        browse.export_messages(console, two, from_offset=3, to_offset=1)
