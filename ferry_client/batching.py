"""Batching with linger: which waiting messages go out now (docs/client.md#batching).

Pure: the caller passes the clock, so the rules are tested without threads or sleeps.
"""

from typing import Generic, TypeVar

T = TypeVar("T")

# Where an item waits within its topic: (generation, partition). Items of one lane go out in
# the order they came; lanes of one generation go out independently (a partition's messages
# keep their order, as a Kafka producer batches per partition); a topic's older generations go
# out before any batch of its newer one (the lanes were drawn with another partition count).
Lane = tuple[int, int | None]
ONE_LANE: Lane = (0, None)


class Batcher(Generic[T]):
    """Items waiting to be sent, per topic and lane, in the order they came.

    A lane's items go out as soon as `batch_size` of them wait, or when its oldest has waited
    `linger_s`: a burst fills batches at once, a trickle waits at most the linger.
    """

    def __init__(self, linger_s: float, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError("batch_size is at least 1.")
        if linger_s < 0:
            raise ValueError("linger is at least 0.")
        self.linger_s = linger_s
        self.batch_size = batch_size
        self._waiting: dict[str, dict[Lane, list[tuple[float, T]]]] = {}

    def __len__(self) -> int:
        return sum(len(q) for lanes in self._waiting.values() for q in lanes.values())

    def add(self, topic: str, item: T, now: float, lane: Lane = ONE_LANE) -> None:
        self._waiting.setdefault(topic, {}).setdefault(lane, []).append((now, item))

    def take(self, now: float, *, everything: bool = False) -> list[tuple[str, list[T]]]:
        """The batches to send now, at most batch_size items each, oldest first per lane.

        `everything` takes all that waits (flush, close), still in batches of batch_size.
        """
        batches: list[tuple[str, list[T]]] = []
        for topic, lanes in list(self._waiting.items()):
            newest = max(generation for generation, _ in lanes)
            for lane in sorted(lanes, key=lambda lane: lane[0]):
                queue = lanes[lane]
                superseded = lane[0] < newest
                while queue and (
                    len(queue) >= self.batch_size
                    or everything
                    or superseded
                    or now - queue[0][0] >= self.linger_s
                ):
                    chunk, queue[:] = queue[: self.batch_size], queue[self.batch_size :]
                    batches.append((topic, [item for _, item in chunk]))
                if not queue:
                    del lanes[lane]
            if not lanes:
                del self._waiting[topic]
        return batches

    def next_due(self, now: float) -> float | None:
        """Seconds until the next batch is due (0: now); None when nothing waits."""
        if not self._waiting:
            return None
        oldest = min(q[0][0] for lanes in self._waiting.values() for q in lanes.values())
        return max(0.0, oldest + self.linger_s - now)
