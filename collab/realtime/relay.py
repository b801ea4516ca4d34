"""The database relay: how events committed in other processes reach this one's listeners on
the embedded default (no shared channel layer).

On the embedded default the worker is another process with its own in-memory
channel layer, so its pushes never reach the web process. Each web process
therefore runs one relay per event loop that watches ``Session.last_event_seq``
for the sessions its sockets follow and pokes their group when it grows; the
process's fan-out (``collab.realtime.fanout``) then reads the new events from the log, once for all
its sockets on the session. One cheap query per wake-up however many sockets
are open.

It does not wait out a poll interval per event: a process that commits events
wakes the relays of the other processes on the machine right after the commit
(``collab.realtime.push.wake_relays``, a datagram on the relay's socket), and the relay
reads at once — one query for however many wake-ups queued meanwhile. The poll
stays as the safety net, every ``TRELLIS_EVENT_NOTIFY_POLL_MS`` (1 s), or every
``TRELLIS_EVENT_POLL_MS`` (150 ms) where the socket cannot be made or waking is
off (``TRELLIS_EVENT_NOTIFY=0``). Events committed in the web process itself
reach its sockets through its in-memory layer directly. Every listener of the process — the
sockets' feeds, ``?wait=`` requests, SSE streams (``collab.realtime.subscription``) — is poked
through its session's group the same way.
"""

import asyncio
import weakref
from collections import Counter

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from collab.realtime.push import close_relay_socket, open_relay_socket, session_group
from collab.selectors.events import event_seqs

current_seqs = database_sync_to_async(event_seqs)  # the sessions' event counters, read off the loop


class EventRelay:
    def __init__(self):
        self.watchers: Counter[str] = Counter()
        self.known: dict[str, int] = {}
        self.task: asyncio.Task | None = None

    def watch(self, session_id: str, seq: int) -> None:
        self.watchers[session_id] += 1
        self.known[session_id] = max(self.known.get(session_id, 0), seq)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    def unwatch(self, session_id: str) -> None:
        self.watchers[session_id] -= 1
        if self.watchers[session_id] <= 0:
            del self.watchers[session_id]
            self.known.pop(session_id, None)

    async def run(self) -> None:
        layer = get_channel_layer()
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        sock = open_relay_socket()
        interval = settings.TRELLIS_EVENT_POLL_INTERVAL
        if sock is not None:
            interval = max(interval, settings.TRELLIS_EVENT_NOTIFY_POLL_INTERVAL)
            loop.add_reader(sock.fileno(), _drain, sock, woken)
            woken.set()  # read once now: what committed before the socket was bound sent it nothing
        try:
            while self.watchers:
                try:
                    await asyncio.wait_for(woken.wait(), interval)
                except TimeoutError:
                    pass
                woken.clear()  # a wake-up that arrives during the read below wakes the next one
                try:
                    rows = await current_seqs(list(self.watchers))
                except Exception:  # a locked or restarting database: try again next tick
                    continue
                for session_id, seq in rows.items():
                    if seq > self.known.get(session_id, 0):
                        self.known[session_id] = seq
                        await layer.group_send(session_group(session_id), {"type": "collab.poke", "seq": seq})
        finally:
            if sock is not None:
                loop.remove_reader(sock.fileno())
                close_relay_socket(sock)


def _drain(sock, woken: asyncio.Event) -> None:
    """The relay's socket is readable: take every queued wake-up, then wake the relay once."""
    while True:
        try:
            sock.recv(64)
        except OSError:  # BlockingIOError: drained
            break
    woken.set()


_relays: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventRelay]" = weakref.WeakKeyDictionary()


def relay() -> EventRelay | None:
    """This event loop's relay, or None when the channel layer is shared (Redis)."""
    if not settings.TRELLIS_EVENT_POLL:
        return None
    loop = asyncio.get_running_loop()
    if loop not in _relays:
        _relays[loop] = EventRelay()
    return _relays[loop]
