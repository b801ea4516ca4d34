"""A worker waits for its next task without holding the task queue's lock (docs/infrastructure.md).

django-q2's worker processes read their tasks from one ``multiprocessing`` queue that the
sentinel shares among them. A blocking ``get()`` holds the queue's reader lock (a semaphore
shared by the processes) for the whole of its wait, so a worker SIGKILLed while it waits takes
the lock with it: every other worker of the cluster, and every worker the sentinel starts in its
place, then waits for that lock forever, and the cluster never takes a task again until it is
restarted. Before turn slots a worker waited in ``get()`` only between turns; with them it hands
each turn to a slot thread and waits there almost all the time, so an OOM kill or a stray
``kill -9`` of one worker process wedged its whole cluster about once in every number-of-workers
kills.

Here a worker waits until the queue's pipe has data *without* the lock, then takes the lock only
to read one task (a lock it cannot take at once means another worker is reading: it waits for
data again). The lock is now held for the microseconds of a read, not for the wait.

``install()`` replaces ``get`` of django-q2's queue class in a worker process, after the fork
(``collab.apps``: django-q2's ``post_spawn``); the sentinel, pusher and monitor keep the stock
method. ``TRELLIS_STOCK=task_queue`` keeps the stock method everywhere. Private API touched:
``multiprocessing.queues.Queue._reader`` (the pipe's read end), checked by
``tests/test_task_queue.py`` against the running Python.
"""

import time
from queue import Empty

BUSY_PAUSE_SECONDS = 0.005  # another reader holds the lock: let it finish its read

_stock_get = None


def install() -> bool:
    """Use ``get_unlocked`` for blocking reads of django-q2's task queue in this process.
    Returns whether it was installed (not with ``TRELLIS_STOCK=task_queue``)."""
    global _stock_get
    # app registry: collab.apps imports this module while the apps load; settings and django_q's
    # modules are read once a worker has started
    from django.conf import settings
    # app registry: as above
    from django_q.queues import Queue

    if "task_queue" in settings.TRELLIS_STOCK:
        return False
    if _stock_get is None:
        _stock_get = Queue.get
        Queue.get = get_unlocked
    return True


def get_unlocked(self, block=True, timeout=None):
    """``Queue.get``: a blocking read without a timeout (the worker's) waits for data unlocked,
    then reads with a lock taken without waiting; any other read is the stock one."""
    if not (block and timeout is None):
        return _stock_get(self, block, timeout)
    while True:
        self._reader.poll(None)  # until a task is in the pipe; no lock held
        try:
            return _stock_get(self, True, 0)  # the lock at once and the task in the pipe, or Empty
        except Empty:
            time.sleep(BUSY_PAUSE_SECONDS)  # another worker is reading (it may take this task)
