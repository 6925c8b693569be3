"""Receipts taken apart a whole ack at a time (inflight.parse_receipts), as one by one."""

import pytest

from broker.core import inflight

TOKEN = "9d2e0c41aa07b3f1"
GOOD = [inflight.receipt(TOKEN, 3, 0), inflight.receipt(TOKEN, 3, 255), "a.b.c", "0.0.0"]
BAD = [
    "",
    "9D2E.3.ff",  # upper case
    "9d2e.3",  # two parts
    "9d2e.3.ff.1",  # four
    "9d2e.-3.ff",
    "9d2e.+3.ff",
    "9d2e.0x3.ff",
    "9d2e.3_0.ff",
    " 9d2e.3.ff",
    "9d2e.3.ff ",
    "9d2e.3.ff\n",  # a line break of its own: two receipts to a joined text
    "9d2e.3.ff\n9d2e.3.fe",
    "\n",
    "9d2e..ff",
    "1" * 17 + ".3.ff",  # a part past 16 digits
    "9d2e.8000000000000000.ff",  # past 63 bits
    "9d2e.3.ffffffffffffffff",
]


@pytest.mark.parametrize(
    "receipts",
    [
        GOOD,
        [inflight.receipt(TOKEN, p, o) for p in (1, 2) for o in range(300)],
        *([bad] for bad in BAD),
        *([*GOOD[:2], bad, *GOOD[2:]] for bad in BAD),
        BAD,
        [],
    ],
)
def test_parse_receipts__as_each_alone(receipts):
    assert inflight.parse_receipts(receipts) == [inflight._parse_receipt(r) for r in receipts]


def test_parse_receipts__the_numbers_of_a_receipt():
    assert inflight.parse_receipts([inflight.receipt(TOKEN, 26, 2**40)]) == [(TOKEN, 26, 2**40)]
    assert inflight.parse_receipts(["9d2e.3.ff", "x"]) == [("9d2e", 3, 255), None]
