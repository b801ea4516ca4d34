"""A worker process opens its channel-layer connection (and its event push loop, where pushes go
through one) as it starts: its first event no longer carries that
set-up to every listener."""

import threading

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from collab.realtime import push
from collab.apps import _warm_event_push


def _on_a_plain_thread(fn, *args, **kwargs):
    """As in a worker process (this test's own thread may carry an event loop of an earlier async test)."""
    thread = threading.Thread(target=fn, args=args, kwargs=kwargs)
    thread.start()
    thread.join(20)


def _own_layer(monkeypatch):
    """The settings' layer made anew for this test, as ``get_channel_layer`` gives it to
    ``collab.realtime.push``: no other thread of this process pushes through it meanwhile."""
    layer = get_channel_layer()
    if not isinstance(layer, InMemoryChannelLayer):
        layer = type(layer)(**settings.CHANNEL_LAYERS["default"].get("CONFIG", {}))
        monkeypatch.setattr(push, "get_channel_layer", lambda: layer)
    return layer


def test_a_worker_start_opens_the_connection_its_events_then_use(monkeypatch):
    monkeypatch.setattr(push, "_loop", None)  # as in a freshly spawned worker
    layer = _own_layer(monkeypatch)
    sender = getattr(layer, "blocking_sender", None)
    # what django-q2's post_spawn sends
    _on_a_plain_thread(_warm_event_push, sender="django_q", proc_name="Process-test")
    if isinstance(layer, InMemoryChannelLayer):
        assert push._loop is None  # the embedded default pushes in-process: nothing to open
        return
    for thread in threading.enumerate():  # the signal's round trip runs in the background
        if thread.name == "trellis-push-warm-up":
            thread.join(10)
    pool = sender.client(0).connection_pool
    opened = pool._created_connections
    assert opened >= 1 and len(pool._available_connections) == opened  # open, and back in the pool
    _on_a_plain_thread(push.push_events, "abcdefabcdef", [{"seq": 1, "type": "test", "payload": {}}])
    assert pool._created_connections == opened  # the push took a warmed connection
    assert push._loop is None  # and started no push loop


def test_a_layer_without_a_blocking_send_is_warmed_through_the_push_loop(monkeypatch):
    """A layer of the operator's choosing that has no ``blocking_sender`` (channels-redis's own, a
    pub/sub layer): the push loop and its connection open at worker start, and pushes use them."""
    layer = _own_layer(monkeypatch)
    if isinstance(layer, InMemoryChannelLayer):
        return
    monkeypatch.setattr(layer, "blocking_sender", None)
    monkeypatch.setattr(push, "_loop", None)
    _on_a_plain_thread(_warm_event_push, sender="django_q", proc_name="Process-test")
    loop = push._loop
    assert loop is not None
    _on_a_plain_thread(push.warm_push, wait=10)
    _on_a_plain_thread(push.push_events, "abcdefabcdef", [{"seq": 1, "type": "test", "payload": {}}])
    assert loop[1].is_running()
    assert push._loop is loop  # the push went through the warmed loop, no new one
