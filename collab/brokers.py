"""django-q2's Redis broker with one Redis client per process (``Q_CLUSTER["broker_class"]``).

django-q2 builds a broker for every ``async_task`` (``django_q.brokers.get_broker``), and its Redis
broker builds a client, with a connection pool of its own, for every broker: each enqueue opened a
TCP connection to Redis, on the path of every turn between the admission's commit and the worker's
start (3–10 ms of the sequential submit→visible latency measured here, issue 15 item 1). This
broker is the same broker over one client per process, whose pool keeps its connections; redis-py
clients are thread-safe, and a forked process (django-q2's pusher, workers and monitor) makes its
own instead of sharing the sockets it inherited (the parent's client stays referenced, unused,
so nothing in the child closes the parent's sockets).
"""

import os
import threading

from django_q.brokers.redis_broker import Redis

_lock = threading.Lock()
_clients: dict[int, object] = {}


class SharedRedis(Redis):
    @staticmethod
    def get_connection(list_key: str = None):
        pid = os.getpid()
        client = _clients.get(pid)
        if client is None:
            with _lock:
                client = _clients.get(pid)
                if client is None:
                    client = _clients[pid] = Redis.get_connection(list_key)
        return client
