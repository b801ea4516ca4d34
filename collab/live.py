"""Carrying events from the database to sockets when there is no shared channel layer.

On the embedded default the worker is another process with its own in-memory
channel layer, so its pushes never reach the web process. Each web process
therefore runs one relay per event loop that watches ``Session.last_event_seq``
for the sessions its sockets follow and pokes their group when it grows; the
consumers then read the new events from the log. One cheap query per interval
however many sockets are open.
"""

import asyncio
import weakref
from collections import Counter

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from collab.events import session_group
from collab.selectors.events import event_seqs

_current_seqs = database_sync_to_async(event_seqs)


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
        while self.watchers:
            await asyncio.sleep(settings.TRELLIS_EVENT_POLL_INTERVAL)
            try:
                rows = await _current_seqs(list(self.watchers))
            except Exception:  # a locked or restarting database: try again next tick
                continue
            for session_id, seq in rows.items():
                if seq > self.known.get(session_id, 0):
                    self.known[session_id] = seq
                    await layer.group_send(session_group(session_id), {"type": "collab.poke", "seq": seq})


_relays: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventRelay]" = weakref.WeakKeyDictionary()


def relay() -> EventRelay | None:
    """This event loop's relay, or None when the channel layer is shared (Redis)."""
    if not settings.TRELLIS_EVENT_POLL:
        return None
    loop = asyncio.get_running_loop()
    if loop not in _relays:
        _relays[loop] = EventRelay()
    return _relays[loop]
