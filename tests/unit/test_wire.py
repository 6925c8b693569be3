"""Deliveries rendered a list at a time (wire.deliveries_out): message_out's fields, then the
receipt's."""

import orjson
import pytest

from broker import wire
from broker.core.records import Delivery, StoredMessage

JSON = StoredMessage(0, 7, 1_700_000_000_000, "k", None, "{}", b'{"a":1}', True, None)
MESSAGES = [
    JSON,
    JSON._replace(key=None, tag="t", headers_json='{"h":"v"}', client_id="id-1"),
    JSON._replace(value=b"\x00\xffraw", is_json=False),
    JSON._replace(value=b"", is_json=False),
]


@pytest.mark.parametrize("message", MESSAGES)
@pytest.mark.parametrize("receipt", ["9d2e.0.7", ""])  # "": auto-acked, nothing to settle
def test_deliveries_out__message_out_with_the_receipt_fields(message, receipt):
    d = Delivery(message, receipt, 2, 1_700_000_030_000)
    [out] = wire.deliveries_out([d])
    expected = {
        **wire.message_out(message),
        "receipt": receipt or None,
        "attempt": 2,
        "deadline_ms": 1_700_000_030_000 if receipt else None,
    }
    # The same fields in the same order, so the same bytes on the wire.
    assert orjson.dumps(out) == orjson.dumps(expected)


def test_deliveries_out__one_per_delivery_in_order():
    ds = [Delivery(m, f"r{i}", 1, 5) for i, m in enumerate(MESSAGES)]
    assert [o["receipt"] for o in wire.deliveries_out(ds)] == ["r0", "r1", "r2", "r3"]
