"""A worker waits for its next task without holding the task queue's lock (``collab.task_queue``,
docs/infrastructure.md): a worker killed while it waits no longer wedges the others.

The queue is django-q2's own (``django_q.queues.Queue``), read by forked processes as the
sentinel's workers read it; ``stock`` runs the same readers with django-q2's method."""

import multiprocessing
import os
import signal
import time

import pytest

from collab import task_queue

CONTEXT = multiprocessing.get_context("fork")


def _reader(queue, seen, unlocked):
    if unlocked:
        from django_q.queues import Queue

        task_queue._stock_get = task_queue._stock_get or Queue.get
        Queue.get = task_queue.get_unlocked
    for item in iter(queue.get, "STOP"):
        seen.put(item)


def _start(queue, seen, unlocked):
    process = CONTEXT.Process(target=_reader, args=(queue, seen, unlocked), daemon=True)
    process.start()
    return process


def _received(seen, count, timeout):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        try:
            got.append(seen.get(timeout=0.1))
        except Exception:
            continue
    return got


def _killed_while_waiting_then_replaced(unlocked: bool) -> list:
    """A reader waits (django-q2's blocking get), is SIGKILLed, a new reader takes its place,
    three tasks come: what the new reader received within 3 s."""
    from django_q.queues import Queue

    queue, seen = Queue(), CONTEXT.Queue()
    victim = _start(queue, seen, unlocked)
    time.sleep(0.5)  # waiting in get(): the stock method holds the reader lock now
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    replacement = _start(queue, seen, unlocked)
    for n in range(3):
        queue.put(f"task {n}")
    try:
        return _received(seen, 3, timeout=3)
    finally:
        replacement.kill()
        replacement.join()


@pytest.mark.timeout(60)
def test_a_worker_killed_while_it_waits_leaves_the_queue_readable():
    assert _killed_while_waiting_then_replaced(unlocked=True) == ["task 0", "task 1", "task 2"]


@pytest.mark.timeout(60)
def test_with_the_stock_method_the_same_kill_wedges_the_queue():
    """What the unlocked read prevents (and the check that it still needs preventing on this
    Python and django-q2): the dead reader kept the lock, the new one never reads."""
    assert _killed_while_waiting_then_replaced(unlocked=False) == []


@pytest.mark.timeout(60)
def test_many_readers_take_every_task_once_as_with_the_stock_method():
    """Same input, both methods: 4 readers, 400 tasks put at once and then one by one — each task
    read exactly once, none lost."""
    from django_q.queues import Queue

    results = {}
    for unlocked in (False, True):
        queue, seen = Queue(), CONTEXT.Queue()
        readers = [_start(queue, seen, unlocked) for _ in range(4)]
        for n in range(200):
            queue.put(n)
        for n in range(200, 400):
            queue.put(n)
            if n % 50 == 0:
                time.sleep(0.02)
        got = _received(seen, 400, timeout=20)
        for _ in readers:
            queue.put("STOP")
        for reader in readers:
            reader.join(5)
        results[unlocked] = sorted(got)
    assert results[True] == results[False] == list(range(400))


def test_install_replaces_the_method_and_the_stock_setting_keeps_it(settings):
    from django_q.queues import Queue

    stock = Queue.get
    try:
        settings.TRELLIS_STOCK = frozenset({"task_queue"})
        assert task_queue.install() is False and Queue.get is stock
        settings.TRELLIS_STOCK = frozenset()
        assert task_queue.install() is True and Queue.get is task_queue.get_unlocked
    finally:
        if task_queue._stock_get is not None:
            Queue.get = task_queue._stock_get
            task_queue._stock_get = None


def test_the_queue_still_has_the_pipe_the_method_waits_on():
    """The private attribute the unlocked read uses (an upgrade check)."""
    from django_q.queues import Queue

    queue = Queue()
    assert hasattr(queue._reader, "poll") and hasattr(queue, "_rlock")
