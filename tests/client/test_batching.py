"""Batching with linger: full batches go at once, a trickle waits at most the linger."""

import pytest

from ferry_client.batching import Batcher


def test_take__waits_for_the_linger():
    batcher: Batcher[object] = Batcher(linger_s=0.1, batch_size=10)
    batcher.add("t", 1, now=0.0)
    batcher.add("t", 2, now=0.05)
    assert batcher.take(now=0.09) == []
    assert batcher.next_due(now=0.09) == pytest.approx(0.01)
    assert batcher.take(now=0.1) == [("t", [1, 2])]
    assert len(batcher) == 0
    assert batcher.next_due(now=0.2) is None


def test_take__full_batches_go_at_once():
    batcher: Batcher[object] = Batcher(linger_s=10, batch_size=2)
    for i in range(5):
        batcher.add("t", i, now=0.0)
    assert batcher.take(now=0.0) == [("t", [0, 1]), ("t", [2, 3])]
    assert len(batcher) == 1


def test_take__everything_in_batches_of_batch_size():
    batcher: Batcher[object] = Batcher(linger_s=10, batch_size=2)
    for i in range(3):
        batcher.add("a", i, now=0.0)
    batcher.add("b", "x", now=0.0)
    assert batcher.take(now=0.0, everything=True) == [("a", [0, 1]), ("a", [2]), ("b", ["x"])]
    assert len(batcher) == 0


def test_take__topics_linger_apart():
    batcher: Batcher[object] = Batcher(linger_s=1, batch_size=10)
    batcher.add("early", 1, now=0.0)
    batcher.add("late", 2, now=0.5)
    assert batcher.take(now=1.0) == [("early", [1])]
    assert batcher.next_due(now=1.0) == pytest.approx(0.5)


def test_batcher__refuses_nonsense():
    with pytest.raises(ValueError, match="batch_size"):
        Batcher(linger_s=0, batch_size=0)
    with pytest.raises(ValueError, match="linger"):
        Batcher(linger_s=-1, batch_size=1)


def test_take__lanes_of_a_topic_go_apart():
    """send_async's per-partition batches: a full lane goes at once, the others wait."""
    batcher: Batcher[object] = Batcher(linger_s=10, batch_size=2)
    batcher.add("t", "a1", now=0.0, lane=(1, 0))
    batcher.add("t", "b1", now=0.0, lane=(1, 1))
    batcher.add("t", "a2", now=0.0, lane=(1, 0))
    assert batcher.take(now=0.0) == [("t", ["a1", "a2"])]
    assert batcher.take(now=10.0) == [("t", ["b1"])]


def test_take__a_topics_older_generation_goes_first_and_at_once():
    """Lanes drawn with an older partition count go before any of the newer, due or not."""
    batcher: Batcher[object] = Batcher(linger_s=10, batch_size=2)
    batcher.add("t", "unrouted", now=0.0, lane=(0, None))
    batcher.add("t", "x1", now=1.0, lane=(1, 3))
    batcher.add("t", "x2", now=1.0, lane=(1, 3))
    batcher.add("u", "other topic", now=0.0, lane=(5, 0))
    assert batcher.take(now=1.0) == [("t", ["unrouted"]), ("t", ["x1", "x2"])]
    assert len(batcher) == 1
