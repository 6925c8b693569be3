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


def _grouped_one_by_one(receipts):
    """group_receipts as its doc says it, one receipt at a time."""
    groups: dict[tuple[str, int], list[tuple[int, str]]] = {}
    malformed = []
    for text in receipts:
        where = inflight._parse_receipt(text)
        if where is None:
            malformed.append(text)
        else:
            groups.setdefault(where[:2], []).append((where[2], text))
    return {
        key: ([o for o, _ in sorted(pairs)], [t for _, t in sorted(pairs)])
        for key, pairs in groups.items()
    }, malformed


RUN = [inflight.receipt(TOKEN, 3, o) for o in range(250, 350)]


@pytest.mark.parametrize(
    "receipts",
    [
        RUN,  # a batch consumer's ack: one token, one partition, in order
        RUN[::-1],
        [*RUN[50:], *RUN[:50]],
        [RUN[0], RUN[0]],
        [inflight.receipt(TOKEN, 3, 2**60 - 1), inflight.receipt(TOKEN, 3, 0)],
        [inflight.receipt(TOKEN, 3, 2**60), inflight.receipt(TOKEN, 3, 2**63 - 1)],  # 16 digits
        [*RUN, inflight.receipt(TOKEN, 4, 250)],  # another partition
        [*RUN, inflight.receipt("9d2e", 3, 250)],  # another token
        [*RUN, inflight.receipt(TOKEN[1:], 3, 250)],  # a token that ends like it
        [*RUN, f"x{RUN[0]}"],
        [RUN[0], RUN[1].replace(".3.", ".03.")],  # the same partition written otherwise
        *([*RUN[:2], f"{TOKEN}.3.{tail}"] for tail in ("", "-1", "+1", "0x1", "1_0", " 1")),
        *([*RUN[:2], f"{TOKEN}.3.{tail}"] for tail in ("1 ", "1\n", "1\n2", "\n", "1.2")),
        *([*RUN[:2], f"{TOKEN}.3.{'f' * n}"] for n in (15, 16, 17)),
        *([*RUN[:2], bad] for bad in BAD),
        [RUN[0]],
        BAD,
        [],
    ],
)
def test_group_receipts__as_each_alone(receipts):
    groups, malformed = inflight.group_receipts(receipts)
    assert malformed == _grouped_one_by_one(receipts)[1]
    by_key = {(g.token, g.partition_id): (g.offsets, g.texts) for g in groups}
    assert by_key == _grouped_one_by_one(receipts)[0]
    assert len(by_key) == len(groups)


def test_group_receipts__one_run_without_a_step_per_receipt():
    assert inflight._one_group(RUN) == inflight.ReceiptGroup(TOKEN, 3, list(range(250, 350)), RUN)
    assert inflight._one_group(RUN[::-1]) == inflight._one_group(RUN)
    assert inflight._one_group([*RUN, inflight.receipt(TOKEN, 4, 250)]) is None
    assert inflight._one_group([RUN[0]]) is None  # one receipt: taken as any other list
