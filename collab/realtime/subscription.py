"""Waiting for a session's events on the event loop: the one subscription that ``?wait=``, SSE
streams and the gateway's foreground calls listen on.

A ``Subscription`` is a fresh channel in the session's group (``collab.realtime.push``) — and,
on the embedded default, the process's relay watching that session (``collab.realtime.relay``).
It holds no thread and no database connection while it waits. ``until_terminal`` is the
``?wait=`` of ``POST /api/sessions/{sid}/turns`` and ``GET /api/executions/{id}`` and the wait of
a foreground ``agent`` call through the gateway: it subscribes, reads the execution once after
subscribing (so an end before the subscription is not missed), wakes on that execution's
terminal ``job.*`` event (Redis) or on the relay's poke, re-reads it, and answers when it is
terminal or the wait ends — then reads it once more. The SSE stream (``collab.streams``) reads
the session's log each time its subscription hears something about it. The sockets' fan-out
(``collab.realtime.fanout``) keeps one such channel per session for every socket of the process.
Waits in threads (tools, the gateway's blocking calls) wait on the event log instead
(``collab.realtime.changes``).
"""

import asyncio
import logging
import re

from channels.layers import get_channel_layer

from collab.models import TERMINAL_STATUSES
from collab.realtime.bounds import Slot, open_wait
from collab.realtime.push import pushed_wires, session_group
from collab.realtime.relay import relay
from collab.realtime.threads import release_request_thread, retake_request_thread

logger = logging.getLogger(__name__)


# a session id as the routes take it (``collab.models.new_id``): only such a name is subscribed
# to before the route has found the session (a group name must be short and plain)
_PLAIN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
_closing_tasks: set[asyncio.Task] = set()
CLOSED = "collab.subscription_closed"  # the last message of a closed subscription's channel


def _consume(read: asyncio.Future) -> None:
    """A dropped read's outcome, taken so that asyncio logs no "exception never retrieved"."""
    if not read.cancelled():
        read.exception()


class Subscription:
    """A fresh channel in a session's event group (and, on the embedded default, the relay's watch
    of that session): what a wait listens on. ``open`` it before the awaited execution can end and
    no read is needed to learn that it ended before the subscription. Without a channel layer it
    hears nothing (``listening`` is False): its owner reads the log on a timer instead."""

    def __init__(self, layer, session_id: str):
        self.layer, self.session_id = layer, session_id
        self.group, self.channel, self.relay = session_group(session_id), None, None
        self._pending: asyncio.Future | None = None  # the layer's read, kept across ``next`` calls

    @property
    def listening(self) -> bool:
        return self.channel is not None

    @classmethod
    async def open(cls, session_id: str) -> "Subscription":
        self = cls(get_channel_layer(), session_id)
        if self.layer is not None:
            self.channel = await self.layer.new_channel()
            await self.layer.group_add(self.group, self.channel)
            self.relay = relay()
            if self.relay:
                self.relay.watch(session_id, 0)
        return self

    @classmethod
    async def before(cls, session_id: str, seconds: float | None) -> "Subscription | None":
        """A subscription opened now, before the route admits or reads anything, for a wait of
        ``seconds`` — None when there is no wait, no channel layer, or ``session_id`` is not a
        plain id (the route answers 404 for it anyway). It only ever listens: what it hears is
        used only after the route has authorized the caller on the session."""
        if not seconds or get_channel_layer() is None or not _PLAIN_ID.fullmatch(session_id):
            return None
        return await cls.open(session_id)

    async def next(self, seconds: float) -> dict | None:
        """The next message of the session's group within ``seconds``, else None. Precondition:
        ``listening``.

        The layer's read is never cancelled: it stays pending for the next call, and ``close``
        ends it with a last message to this channel. (channels-redis reads a process's
        channels under one lock, in a loop of blocking pops; a read cancelled as redis-py's own
        read timer fires can lose the cancellation and go on popping until some message reaches
        the process — with ``asyncio.wait_for``, whose timeout waits for the cancelled read to
        end, a ``?wait=`` then hung past its bound: 1 of 20 concurrent waits ending together, on
        this machine.) A failed read is None too (logged): callers re-read the database, which
        holds the truth, and never fail a request over it."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self.layer.receive(self.channel))
        done, _ = await asyncio.wait({self._pending}, timeout=max(seconds, 0))
        if not done:
            return None
        read, self._pending = self._pending, None
        try:
            return read.result()
        except Exception:  # noqa: BLE001 — any layer failure means "look again", never a 500
            logger.warning("channel layer read failed; re-reading from the database", exc_info=True)
            await asyncio.sleep(min(max(seconds, 0), 0.1))  # not a hot loop while the layer is down
            return None

    async def _end_pending(self) -> None:
        """End the read left pending (see ``next``) without cancelling it: a last message sent to
        this subscription's own channel completes it. Only if that send fails is it cancelled."""
        read, self._pending = self._pending, None
        if read is None:
            return
        read.add_done_callback(_consume)
        try:
            await self.layer.send(self.channel, {"type": CLOSED})
        except Exception:  # noqa: BLE001 — the layer is down: the read may as well be cancelled
            read.cancel()

    def _unwatch(self) -> None:
        if self.relay:
            self.relay.unwatch(self.session_id)
            self.relay = None

    async def close(self) -> None:
        """Leave the group now (the owner is ending anyway)."""
        self._unwatch()
        if self.channel is not None:
            await self._discard()
            self.channel = None

    def close_soon(self) -> None:
        """Leave the group after the answer has gone (a round trip to the layer the caller need
        not wait for): the channel is never read again; a failure is only logged."""
        self._unwatch()
        if self.channel is None:
            return
        task = asyncio.get_running_loop().create_task(self._discard())
        _closing_tasks.add(task)
        task.add_done_callback(_closing_tasks.discard)

    async def _discard(self) -> None:
        try:
            await self.layer.group_discard(self.group, self.channel)
        except Exception:  # noqa: BLE001 — the group's entry expires with the layer's group_expiry
            logger.warning("leaving %s failed", self.group, exc_info=True)
        await self._end_pending()


def _wakes(message: dict, execution_id: str) -> bool:
    if message.get("type") == "collab.poke":
        return True
    return any(str(wire.get("type", "")).startswith("job.") and (wire.get("payload") or {}).get("job") == execution_id
               and (wire.get("payload") or {}).get("status") in TERMINAL_STATUSES for wire in pushed_wires(message))


async def until_terminal(request, session_id: str, execution_id: str, seconds: float, read,
                         current: dict | None = None, slot: Slot | None = None,
                         subscription: Subscription | None = None) -> dict:
    """Await ``read()`` (an async read of the execution's status, a dict with ``status``)
    until the status is terminal or ``seconds`` pass; return the last read. ``current``: a
    read just made (returned as it is when already terminal). ``slot``: the user's wait slot
    when the route took it already (before admitting a turn); it is freed here either way.
    ``subscription``: one the route opened on ``session_id`` before the execution existed (its
    terminal event cannot have been missed: no read before the first wake-up); closed here."""
    try:
        if current is not None and current["status"] in TERMINAL_STATUSES:
            return current
        if get_channel_layer() is None or seconds <= 0:
            return await read()
        slot = slot or open_wait(request.auth)
        return await _until_terminal(request, session_id, execution_id, seconds, read, subscription)
    finally:
        if slot is not None:
            slot.free()
        if subscription is not None:
            subscription.close_soon()


async def _until_terminal(request, session_id: str, execution_id: str, seconds: float, read,
                          subscription: Subscription | None) -> dict:
    await release_request_thread(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    own = subscription is None
    if own:
        subscription = await Subscription.open(session_id)
    try:
        # after subscribing: it may have ended before (unless subscribed before it existed)
        shape = await read() if own else None
        while shape is None or shape["status"] not in TERMINAL_STATUSES:
            left = deadline - loop.time()
            if left <= 0:
                break
            message = await subscription.next(left)
            if message is None and deadline - loop.time() <= 0:
                break  # the wait is over: read once more below
            if message is None or _wakes(message, execution_id):
                shape = await read()
    finally:
        if own:
            subscription.close_soon()
        retake_request_thread(request)
    if shape is None or shape["status"] not in TERMINAL_STATUSES:
        shape = await read()  # once more at the end
    return shape
