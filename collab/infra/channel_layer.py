"""The Redis channel layer, with a blocking ``group_send`` for threads that have no event loop.

channels-redis speaks to Redis only through asyncio. A plain thread (a worker process's task, a
web request's sync view) that pushes an event had to hand ``group_send`` to an event loop in
another thread and wait for it: the hand-off, the loop's wake-ups and the two to four round trips
of ``group_send`` were ~16 % of a worker process's CPU (py-spy under ``bench/turns.py``).
``group_send_blocking`` does the same on this thread over a plain redis-py connection pool, in one
round trip to the group's server when the group is empty and two when it has members (one per
further server of a sharded layer).

What goes to Redis is what ``group_send`` writes, made by the layer's own code (the group's key,
the channel keys, the serialized messages with their ``__asgi_channel__`` lists and random
prefixes, each channel's capacity), so a consumer receiving through channels-redis cannot tell
the two apart: the group's stale members are dropped, and each channel key's stale messages,
then each message is added unless its channel is at capacity. Only the Redis commands are
grouped differently: a script each, instead of separate commands.

A host given by Sentinel (``master_name``) has no blocking path here: ``blocking_sender`` is None
for such a layer and its pushes go through ``group_send`` as before.
"""

import threading
import time

import redis
from django.conf import settings
from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer

SEND_TIMEOUT_SECONDS = 10

# KEYS[1]: the group; ARGV[1]: members added before it are stale (as group_send's group_expiry)
_MEMBERS = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# KEYS: channel keys on one server; ARGV[1]: the time (the messages' score), ARGV[2]: messages
# added before it are stale, ARGV[3]: the keys' time to live; then, for each key in turn, its
# message and its capacity. Answers how many keys were at capacity (their message dropped).
_DELIVER = """
local full = 0
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, 0, ARGV[2])
  if redis.call('ZCARD', key) < tonumber(ARGV[3 + 2 * i]) then
    redis.call('ZADD', key, ARGV[1], ARGV[2 + 2 * i])
    redis.call('EXPIRE', key, ARGV[3])
  else
    full = full + 1
  end
end
return full
"""


class BlockingSender:
    """``group_send`` for one layer, from any thread: a redis-py connection pool per server
    (thread-safe, and made again in a forked child: redis-py checks the pid), its scripts
    registered once (sent by hash; redis-py sends the text again if the server lost it)."""

    def __init__(self, layer: "RedisChannelLayer"):
        self.layer = layer
        self._clients: dict[int, redis.Redis] = {}
        self._lock = threading.Lock()
        self._members = redis.Redis().register_script(_MEMBERS)  # a script binds no connection
        self._deliver = redis.Redis().register_script(_DELIVER)

    def client(self, index: int) -> redis.Redis:
        client = self._clients.get(index)
        if client is None:
            with self._lock:
                client = self._clients.get(index)
                if client is None:
                    host = dict(self.layer.hosts[index])
                    # a send waits for no message (the layer's receive blocks for one, hence its
                    # long read timeout): bounded as the pushes through a loop were
                    for timeout in ("socket_timeout", "socket_connect_timeout"):
                        host[timeout] = min(host.get(timeout) or SEND_TIMEOUT_SECONDS, SEND_TIMEOUT_SECONDS)
                    address = host.pop("address", None)
                    pool = (redis.ConnectionPool.from_url(address, **host) if address is not None
                            else redis.ConnectionPool(**host))
                    client = self._clients[index] = redis.Redis(connection_pool=pool)
        return client

    def group_send(self, group: str, message: dict) -> int:
        """Send ``message`` to every member of ``group``; answers how many channel keys were at
        capacity (as ``group_send``, which logs them)."""
        layer = self.layer
        assert layer.require_valid_group_name(group), "Group name not valid"
        group_client = self.client(layer.consistent_hash(group))
        now = time.time()
        members = self._members(keys=[layer._group_key(group)], args=[int(now) - layer.group_expiry],
                                client=group_client)
        if not members:
            return 0
        by_server, messages, capacities = layer._map_channel_keys_to_connection(
            [name.decode("utf8") for name in members], message)
        full = 0
        for index, keys in by_server.items():
            args = [now, int(now) - int(layer.expiry), int(layer.expiry)]
            for key in keys:
                args += [messages[key], capacities[key]]
            full += self._deliver(keys=keys, args=args, client=self.client(index))
        return full

    def ping(self) -> None:
        """Open the connection to the server of every group (a round trip), so a process's first
        push does not carry it."""
        for index in range(self.layer.ring_size):
            self.client(index).ping()


class RedisChannelLayer(BaseRedisChannelLayer):
    """channels-redis's layer (settings ``CHANNEL_LAYERS``), with ``blocking_sender``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        sentinel = any("master_name" in host for host in self.hosts)
        stock = "channel_layer" in settings.TRELLIS_STOCK  # every push through group_send
        self.blocking_sender = None if sentinel or stock else BlockingSender(self)
