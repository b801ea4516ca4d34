"""The worker queue's Redis broker keeps its connection: django-q2 builds a
broker for every ``async_task``, and its own Redis broker opened a new Redis connection for each,
on the path of every turn from the admission's commit to the worker's start."""

import os

import pytest
from django.conf import settings

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="the Redis broker is used with REDIS_URL only")


def test_every_enqueue_of_a_process_uses_one_redis_connection():
    from django_q.brokers import get_broker

    first, second = get_broker(), get_broker()
    assert first.connection is second.connection
    before = first.connection.client_id()
    first.enqueue("not a task")  # pushed on this run's own queue, then removed
    assert second.connection.client_id() == before
    first.purge_queue()


def test_a_forked_process_makes_its_own_client():
    from django_q.brokers import get_broker

    parent = get_broker().connection
    parent_id = parent.client_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: django-q2's pusher and workers are forked like this
        try:
            child = get_broker().connection
            ok = child is not parent and child.client_id() != parent_id
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.waitpid(pid, 0)
        os.close(read)
    assert parent.client_id() == parent_id  # the parent's connection was left alone
