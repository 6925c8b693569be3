"""DataFrame rows to messages for the `ferry` sink (pure: Arrow batches in, Messages out)."""

import pyarrow as pa
import pytest

from pipeline import rows
from pipeline.options import OptionError


def batch(**columns):
    return pa.RecordBatch.from_pydict(columns)


def test_messages__ids_chunks_and_kinds():
    first = batch(value_json=['{"a": 1}', None], value=[None, b"\x00"], key=["k", None])
    second = batch(value_json=["2"], value=[None], key=[None])

    got = list(rows.messages([first, second], "t", 2, "w-0"))

    assert [(topic, [m.id for m in chunk]) for topic, chunk in got] == [
        ("t", ["w-0-0", "w-0-1"]),
        ("t", ["w-0-2"]),
    ]
    values = [m.value for _, chunk in got for m in chunk]
    assert values == [{"a": 1}, b"\x00", 2]
    assert got[0][1][0].key == "k"


def test_messages__topic_column_unless_the_option():
    by_row = batch(value=["x", "y", "z"], topic=["a", "b", "a"])

    assert [(t, len(c)) for t, c in rows.messages([by_row], None, 10, "p")] == [("a", 2), ("b", 1)]
    assert [(t, len(c)) for t, c in rows.messages([by_row], "o", 10, "p")] == [("o", 3)]


def test_messages__string_value_is_raw_utf8_and_headers_map():
    headers = pa.array([[("h", "v")]], pa.map_(pa.string(), pa.string()))
    given = pa.RecordBatch.from_arrays([pa.array(["é"]), headers], names=["value", "headers"])

    [(_, [message])] = rows.messages([given], "t", 10, "p")

    assert (message.value, dict(message.headers)) == ("é".encode(), {"h": "v"})


def test_messages__row_without_value():
    with pytest.raises(ValueError, match="Row p-0 has neither a value"):
        list(rows.messages([batch(value=[None])], "t", 10, "p"))


def test_check_columns():
    rows.check_columns(["value_json"], has_topic_option=True)
    with pytest.raises(OptionError, match="needs a 'value' column"):
        rows.check_columns(["payload"], has_topic_option=True)
    with pytest.raises(OptionError, match="the 'topic' option or a 'topic' column"):
        rows.check_columns(["value"], has_topic_option=False)
