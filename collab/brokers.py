"""Handing tasks to django-q2's broker, and its Redis broker with one Redis client per process
(``Q_CLUSTER["broker_class"]``; ``TRELLIS_STOCK=brokers``: django-q2's own broker class).

``hand_to_broker`` is how every task is enqueued for the transaction in progress. With the
database as the broker (the embedded default: django-q2's ORM broker) the task's row is written
*in* that transaction: it commits, or rolls back, with the rows its task will read, and it costs
no write transaction of its own — SQLite runs one writer at a time, so an admission that wrote
its task after its commit took the write lock twice, and 200 people starting turns at once
queued twice as many writers (docs/capacity.md, "The embedded default"). With Redis, outside the
database, the task goes once the transaction has committed (a worker never sees a task
before its rows).

django-q2 builds a broker for every ``async_task`` (``django_q.brokers.get_broker``), and its Redis
broker builds a client, with a connection pool of its own, for every broker: each enqueue opened a
TCP connection to Redis, on the path of every turn between the admission's commit and the worker's
start (3–10 ms of the sequential submit→visible latency measured here). This
broker is the same broker over one client per process, whose pool keeps its connections; redis-py
clients are thread-safe, and a forked process (django-q2's pusher, workers and monitor) makes its
own instead of sharing the sockets it inherited (the parent's client stays referenced, unused,
so nothing in the child closes the parent's sockets).
"""


from django.conf import settings
from django.db import transaction
from django_q.brokers.redis_broker import Redis
from django_q.tasks import async_task

from collab.infra.per_process import PerProcess


def broker_in_database() -> bool:
    """Whether django-q2's broker is the database (its ORM broker) rather than Redis."""
    return "orm" in settings.Q_CLUSTER


def hand_to_broker(task_path, *args, **kwargs) -> None:
    """``async_task(task_path, *args, **kwargs)`` for the transaction in progress (none: now): in
    it when the broker is the database, after its commit otherwise (the module's docstring)."""
    if broker_in_database():
        async_task(task_path, *args, **kwargs)
    else:
        transaction.on_commit(lambda: async_task(task_path, *args, **kwargs))

_client = PerProcess(lambda: Redis.get_connection())


class SharedRedis(Redis):
    @staticmethod
    def get_connection(list_key: str = None):
        return _client()
