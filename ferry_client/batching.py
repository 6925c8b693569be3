"""Batching with linger: which waiting messages go out now (docs/client.md#batching).

Pure: the caller passes the clock, so the rules are tested without threads or sleeps.
"""

from typing import Generic, TypeVar

T = TypeVar("T")


class Batcher(Generic[T]):
    """Items waiting to be sent, per topic, in the order they came.

    A topic's items go out as soon as `batch_size` of them wait, or when its oldest has waited
    `linger_s`: a burst fills batches at once, a trickle waits at most the linger.
    """

    def __init__(self, linger_s: float, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError("batch_size is at least 1.")
        if linger_s < 0:
            raise ValueError("linger is at least 0.")
        self.linger_s = linger_s
        self.batch_size = batch_size
        self._waiting: dict[str, list[tuple[float, T]]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def add(self, topic: str, item: T, now: float) -> None:
        self._waiting.setdefault(topic, []).append((now, item))

    def take(self, now: float, *, everything: bool = False) -> list[tuple[str, list[T]]]:
        """The batches to send now, at most batch_size items each, oldest first per topic.

        `everything` takes all that waits (flush, close), still in batches of batch_size.
        """
        batches: list[tuple[str, list[T]]] = []
        for topic, queue in list(self._waiting.items()):
            while queue and (
                len(queue) >= self.batch_size or everything or now - queue[0][0] >= self.linger_s
            ):
                chunk, queue[:] = queue[: self.batch_size], queue[self.batch_size :]
                batches.append((topic, [item for _, item in chunk]))
            if not queue:
                del self._waiting[topic]
        return batches

    def next_due(self, now: float) -> float | None:
        """Seconds until the next batch is due (0: now); None when nothing waits."""
        if not self._waiting:
            return None
        oldest = min(queue[0][0] for queue in self._waiting.values())
        return max(0.0, oldest + self.linger_s - now)
