"""Pure offset arithmetic and option parsing of the `ferry` data source (no Spark, no broker)."""

import pytest

from ferry_client import PartitionOffsets
from pipeline import offsets, options
from pipeline.offsets import OffsetRange
from pipeline.options import OptionError

BOUNDS = {"t": [PartitionOffsets(0, 5, 50, 20), PartitionOffsets(1, 0, 10, 10)]}
BASE = {"url": "http://b:8000", "apiKey": "fry_x", "topic": "t"}


def test_resolve__words_json_and_time():
    assert offsets.resolve("earliest", BOUNDS, fallback="latest") == {"t": {"0": 5, "1": 0}}
    assert offsets.resolve("latest", BOUNDS, fallback="earliest") == {"t": {"0": 50, "1": 10}}
    assert offsets.resolve({"t": {"0": 7}}, BOUNDS, fallback="latest") == {"t": {"0": 7, "1": 10}}
    assert offsets.resolve({"t": {"0": -2, "1": -1}}, BOUNDS, fallback="latest") == {
        "t": {"0": 5, "1": 10}
    }
    assert offsets.resolve("earliest", BOUNDS, fallback="x", timestamp_ms=1) == {
        "t": {"0": 20, "1": 10}
    }


def test_resolve__past_the_end():
    with pytest.raises(OptionError, match="past its end offset 10"):
        offsets.resolve({"t": {"1": 11}}, BOUNDS, fallback="latest")


def test_ranges__split_and_new_partitions():
    got = offsets.ranges({"t": {"0": 0}}, {"t": {"0": 5, "1": 2}, "u": {"0": 0}}, max_rows=2)

    assert got == [
        OffsetRange("t", 0, 0, 2),
        OffsetRange("t", 0, 2, 4),
        OffsetRange("t", 0, 4, 5),
        OffsetRange("t", 1, 0, 2),  # new since start: from offset 0
    ]


def test_limit__shares_the_budget_by_lag():
    start = {"t": {"0": 0, "1": 0, "2": 10}}
    latest = {"t": {"0": 90, "1": 10, "2": 10, "3": 5}}

    limited = offsets.limit(start, latest, 20)

    assert offsets.rows_between(start, limited) == 20
    assert limited["t"]["2"] == 10
    assert all(limited["t"][k] > start["t"].get(k, 0) for k in ("0", "1", "3"))
    assert offsets.limit(start, latest, 1000) == latest


def test_limit__one_row_still_makes_progress():
    limited = offsets.limit({"t": {"0": 0, "1": 0}}, {"t": {"0": 3, "1": 3}}, 1)

    assert offsets.rows_between({"t": {"0": 0, "1": 0}}, limited) == 1


def test_cap__never_past_the_target():
    latest = {"t": {"0": 9, "1": 9}, "u": {"0": 1}}

    assert offsets.cap(latest, {"t": {"0": 4}}) == {"t": {"0": 4}}


def test_read_options__defaults():
    batch = options.read_options(BASE, streaming=False)
    stream = options.read_options(BASE, streaming=True)

    assert (batch.starting, batch.ending, stream.starting) == ("earliest", "latest", "latest")
    assert (batch.fetch_size, batch.fail_on_data_loss, batch.connection.timeout_s) == (
        10_000,
        True,
        30.0,
    )


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"url": None}, "Option 'url' is required"),
        ({"apiKey": ""}, "Option 'apiKey' is required"),
        ({"topic": None}, "Option 'topic' is required"),
        ({"fetchSize": "20000"}, "'fetchSize' must be between 1 and 10000"),
        ({"maxOffsetsPerTrigger": "ten"}, "'maxOffsetsPerTrigger' must be an integer"),
        ({"endingOffsets": "earliest"}, "cannot be 'earliest'"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, "names topics not in 'topic'"),
        ({"startingOffsets": '{"t": {"x": 1}}'}, "must be 'earliest', 'latest' or JSON"),
        ({"failOnDataLoss": "maybe"}, "must be true or false"),
    ],
)
def test_read_options__errors(given, error):
    with pytest.raises(OptionError, match=error):
        options.read_options({**BASE, **given}, streaming=False)


def test_read_options__stream_only_and_batch_only():
    with pytest.raises(OptionError, match="for streaming reads"):
        options.read_options({**BASE, "maxOffsetsPerTrigger": "5"}, streaming=False)
    with pytest.raises(OptionError, match="a stream has no end"):
        options.read_options({**BASE, "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="'endingTimestamp' is for batch reads"):
        options.read_options({**BASE, "endingTimestamp": "1000"}, streaming=True)
    # A stream may start at a time.
    stream = options.read_options({**BASE, "startingTimestamp": "1000"}, streaming=True)
    assert stream.starting_timestamp_ms == 1000
