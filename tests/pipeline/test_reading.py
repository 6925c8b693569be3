"""Read tasks fetch a page ahead of Spark (pipeline.datasource.ahead), without Spark."""

import pytest

from pipeline.datasource import ahead


def test_ahead__order_errors_and_early_close():
    assert list(ahead(iter(range(5)), depth=1)) == [0, 1, 2, 3, 4]

    def failing():
        yield 1
        raise RuntimeError("broker went away")

    pages = ahead(failing())
    assert next(pages) == 1
    with pytest.raises(RuntimeError, match="broker went away"):
        next(pages)
    endless = ahead(iter(range(10**9)), depth=2)
    assert next(endless) == 0
    endless.close()  # stops the thread
