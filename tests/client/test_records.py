"""Messages on the wire both ways: what the producer sends, what a consumer gets."""

import time

from ferry_client import Delivery, Message
from ferry_client.records import new_id


def test_to_wire__only_what_is_set():
    assert Message(None).to_wire() == {"value": None}
    assert Message(bytearray(b"\x01"), level=3, headers={"a": "b"}).to_wire() == {
        "value_b64": "AQ==",
        "level": 3,
        "headers": {"a": "b"},
    }


def test_with_id__keeps_a_given_id():
    assert Message(1, id="mine").with_id().id == "mine"
    fresh = Message(1).with_id()
    assert fresh.id is not None
    assert len(fresh.id) == 32
    assert fresh.with_id() is fresh


def test_delivery_from_wire__json_and_bytes():
    item = {
        "partition": 1,
        "offset": 4,
        "timestamp_ms": 10,
        "key": "k",
        "tag": None,
        "headers": {"h": "v"},
        "id": "x",
        "receipt": "r",
        "attempt": 2,
        "deadline_ms": 99,
    }
    as_json = Delivery.from_wire("t", {**item, "value": {"a": 1}})
    assert (as_json.value, as_json.attempt, as_json.receipt) == ({"a": 1}, 2, "r")
    assert Delivery.from_wire("t", {**item, "value_b64": "AP8="}).value == b"\x00\xff"


def test_new_id__32_hex_digits_that_grow_with_time():
    """docs/client.md#retries-and-failover: ids in time order, so that the broker's indexes of
    ids grow at their end; unique, with 80 random bits each."""
    first = new_id()
    time.sleep(0.002)
    later = [new_id() for _ in range(1000)]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in [first, *later])
    assert all(first < i for i in later)
    assert len(set(later)) == 1000
