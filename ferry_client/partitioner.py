"""Which partition a request's messages go to, for routing only (docs/client.md#partitions).

The broker places every message itself: an explicit partition, else the key's hash, else round
robin. This copy of its key hash (Kafka's murmur2, docs/decisions/0002-key-hash.md) only lets a
keyed request carry its partition in the `Ferry-Partition-Hint` header, which `scripts/haproxy`
routes by, so that one process appends to a partition. The broker ignores the header: a stale
partition count here costs the routing, never a message's place.

Pure, like batching.py: the caller passes the clock and does the reading.
"""

import threading
from collections.abc import Sequence

from murmurhash2 import murmurhash2

from ferry_client.records import Message, SendResult

HINT_HEADER = "Ferry-Partition-Hint"
# Kafka's metadata.max.age.ms: a topic's partition count is read again this often, so a topic
# that grew is noticed even when no answer shows it.
DEFAULT_METADATA_MAX_AGE_MS = 300_000
# After a failed read (an unknown topic, a broker down) the next try waits this long.
RETRY_AFTER_FAILURE_S = 10.0

# Kafka's seed (org.apache.kafka.common.utils.Utils.murmur2), as the broker's partitioning.py.
_SEED = 0x9747B28C


def partition_for_key(key: str, partition_count: int) -> int:
    """The broker's partition of a key: Kafka's toPositive(murmur2(utf8(key))) % partitions."""
    return (murmurhash2(key.encode(), _SEED) & 0x7FFFFFFF) % partition_count


class Partitions:
    """The partition counts of the topics a producer sends to, as last read from the broker.

    Each topic's count has a generation, which changes when the count does: send_async's
    batches per partition (batching.Lane) drawn with an older count go first.
    """

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        # topic → (partition count, None while unknown; when to read it again; generation)
        self._read: dict[str, tuple[int | None, float, int]] = {}
        self._lock = threading.Lock()  # the producer's threads and its linger thread

    def to_read(self, topic: str, messages: Sequence[Message], now: float) -> bool:
        """Whether to read the topic's partition count before sending: a message is keyed and
        without a partition, and the count was never read, or long ago."""
        if not any(m.key is not None and m.partition is None for m in messages):
            return False
        return now >= self._read.get(topic, (None, now, 0))[1]

    def read(self, topic: str, count: int | None, now: float) -> None:
        """The topic's partition count as read at `now` (None: the read failed). After a
        failure the last count still routes (stale beats none) until a later try."""
        with self._lock:
            known, _, generation = self._read.get(topic, (None, 0.0, 0))
            if count is None:
                self._read[topic] = (known, now + RETRY_AFTER_FAILURE_S, generation)
            else:
                changed = count != known
                self._read[topic] = (count, now + self.max_age_s, generation + changed)

    def lane(self, topic: str, message: Message) -> tuple[int, int | None]:
        """Where send_async queues the message: the count's generation, and its partition as
        far as the client can tell (None: the broker's round robin, or the count unknown)."""
        count, _, generation = self._read.get(topic, (None, 0.0, 0))
        return generation, self._partition(message, count)

    def route(self, topic: str, messages: Sequence[Message]) -> int | None:
        """The one partition every message goes to, as far as the client can tell, or None.

        A message names its partition, or has a key and the topic's count is known; a message
        with neither goes wherever the broker's round robin puts it.
        """
        count = self._count(topic)
        partitions = {self._partition(m, count) for m in messages}
        if len(partitions) == 1 and (only := partitions.pop()) is not None and only >= 0:
            return only
        return None

    def check(self, topic: str, messages: Sequence[Message], results: Sequence[SendResult]) -> None:
        """Forget the count when the broker placed a keyed message elsewhere (the topic grew),
        so that the next keyed send reads it again."""
        count = self._count(topic)
        if count is None:
            return
        for message, result in zip(messages, results, strict=True):
            if message.key is None or message.partition is not None or result.partition is None:
                continue
            if result.partition != partition_for_key(message.key, count):
                with self._lock:
                    if self._count(topic) == count:
                        generation = self._read[topic][2]
                        self._read[topic] = (None, 0.0, generation + 1)
                return

    def _count(self, topic: str) -> int | None:
        return self._read.get(topic, (None, 0.0, 0))[0]

    @staticmethod
    def _partition(message: Message, count: int | None) -> int | None:
        if message.partition is not None:
            return message.partition
        if count == 1:
            return 0  # keyed or not: a topic of one partition keeps one order
        if message.key is not None and count:
            return partition_for_key(message.key, count)
        return None
