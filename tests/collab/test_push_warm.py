"""A worker process opens its event push loop and channel-layer connection as it starts
(issue 15 item 1 ``live``): its first event no longer carries that set-up to every listener."""

import os
import threading

from channels.layers import InMemoryChannelLayer, get_channel_layer

from collab import events
from collab.apps import _warm_event_push


def test_a_worker_start_opens_the_push_loop_its_events_then_use(monkeypatch):
    monkeypatch.setattr(events, "_loop", None)  # as in a freshly spawned worker
    # what django-q2's post_spawn sends, on a plain thread as in a worker process (this test's own
    # thread may carry an event loop of an earlier async test)
    spawned = threading.Thread(target=_warm_event_push, kwargs={"sender": "django_q", "proc_name": "Process-test"})
    spawned.start()
    spawned.join()
    if isinstance(get_channel_layer(), InMemoryChannelLayer):
        assert events._loop is None  # the embedded default pushes in-process: nothing to open
        return
    loop = events._loop
    assert loop is not None and loop[0] == os.getpid()
    def push():
        events.warm_push(wait=10)  # the signal's round trip ran in the background: one more, waited for
        events.push_events("abcdefabcdef", [{"seq": 1, "type": "test", "payload": {}}])

    pushing = threading.Thread(target=push)
    pushing.start()
    pushing.join()
    assert loop[1].is_running()
    assert events._loop is loop  # the push went through the warmed loop, no new one
