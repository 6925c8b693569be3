"""channels_redis's channel layer with a group_send of one or two Redis commands, not two or four.

Every commit announces itself to its topic's layer group (events.py), so a group_send runs once
per group commit, produce or delivery. channels_redis's own group_send makes four calls to Redis
for a group with members (expire its old members, list them, expire each member's old messages,
then a script adding the message) and two for an empty group, one after the other; redis-py
costs about 90 µs of CPU per call on this machine, more than the commit's own Python on
PostgreSQL. Here the first two are one script and the last two another, so the messages Redis
stores, their keys, expiry and capacity are channels_redis's own (its receive reads them
unchanged) at about half the CPU (docs/benchmarks.md). docs/decisions/0020-wakeups-in-two-scripts.md
says why this subclass and not the pub/sub layer.

_map_channel_keys_to_connection (which serializes the message for each channel key) is not
channels_redis's public API: channels_redis is pinned, and tests/integration/test_redis_layer.py
runs this group_send against a real Redis beside channels_redis's receive.
"""

import logging
import time
from typing import Any

from channels_redis.core import RedisChannelLayer
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

# KEYS[1]: the group's sorted set; ARGV[1]: the score below which members have expired.
MEMBERS_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# channels_redis's group_send script, with the expiry of each channel key's old messages (its
# separate pipeline) done first. KEYS: channel keys; ARGV: one message per key, one capacity per
# key, then the time, the expiry in seconds and the score below which messages have expired.
SEND_LUA = """
local n = #KEYS
local current_time = ARGV[2 * n + 1]
local expiry = ARGV[2 * n + 2]
local cutoff = ARGV[2 * n + 3]
local over_capacity = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, cutoff)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + n]) then
        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


class ScriptedRedisChannelLayer(RedisChannelLayer):  # type: ignore[misc]  # channels_redis is untyped
    """RedisChannelLayer whose group_send runs as two server-side scripts (one for no member).

    Sharded layers (several hosts) keep channels_redis's group_send: their channel keys live on
    other servers than the group.
    """

    _scripts: tuple[Any, Any] | None = None

    async def _clean_receive_backup(self, index: int, channel: str) -> None:
        """channels_redis's removal of a received message from its backup queue, a task fired
        and forgotten after each receive. Should Redis go away or end the connection meanwhile,
        its error went unretrieved and asyncio logged it with a traceback. What it leaves behind
        is at most a wake-up received again later, which is harmless (docs/operations.md)."""
        try:
            await super()._clean_receive_backup(index, channel)
        except (RedisError, OSError) as exc:
            logger.info("channel layer: a received wake-up's backup stays (%s)", exc)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        if self.ring_size != 1:
            await super().group_send(group, message)
            return
        self.require_valid_group_name(group)  # raises TypeError, as channels_redis's check
        connection = self.connection(0)
        if self._scripts is None:
            # redis-py runs a script by its hash, loading it again where Redis lost it (a
            # restart); client= below picks the connection of the running event loop.
            self._scripts = (
                connection.register_script(MEMBERS_LUA),
                connection.register_script(SEND_LUA),
            )
        members, send = self._scripts
        now = time.time()
        names = await members(
            keys=[self._group_key(group)], args=[int(now) - self.group_expiry], client=connection
        )
        if not names:
            return
        channel_names = [name.decode("utf8") for name in names]
        by_connection, messages, capacities = self._map_channel_keys_to_connection(
            channel_names, message
        )
        keys = by_connection[0]
        over_capacity = await send(
            keys=keys,
            args=[
                *(messages[key] for key in keys),
                *(capacities[key] for key in keys),
                now,
                self.expiry,
                int(now) - int(self.expiry),
            ],
            client=connection,
        )
        if over_capacity > 0:
            logger.info(
                "%s of %s channels over capacity in group %s",
                over_capacity,
                len(channel_names),
                group,
            )
