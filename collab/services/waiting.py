"""The one wait primitive: "until this job / this mailbox changes" (issue 14 item 3).

``wait_for_change(check, timeout, sessions=…)`` answers when ``check()`` holds, the caller
stops, or time runs out. It does not sleep-and-poll the condition: it sleeps until something
happens in the sessions named — every change a waiter cares about (a job ending, a result
owed, a cancel of the waiting turn) writes an Event there (``send_event_on_commit``) — and
only then asks ``check`` again. The signal is the one live pages use:

- with a shared channel layer (Redis) the wait subscribes a channel of its own to the
  sessions' groups and blocks on it; a push wakes it at once;
- without one (the embedded default: the worker is another process with its own in-memory
  layer) it watches the sessions' ``last_event_seq`` the way the embedded relay
  (``collab.live``) does, one cheap query per ``TRELLIS_EVENT_POLL_MS``, and asks ``check``
  only when an event was written.

Pushes are best effort (``collab.events.push_event``), so ``check`` is also asked at least
every ``BACKSTOP_SECONDS``: a lost push delays an answer, never loses it. The wait is bounded
by ``timeout_seconds`` in every case.

Used by ``job_output`` (``block``), ``wait_agent`` and so by the tool gateway, which runs
those tools. While it sleeps a waiter holds no database connection (P-SEC-4): the thread's
connection is closed and the next read opens a new one, so a thousand waiters cost no
connections and a gateway call parked in a web process pins nothing. Inside a transaction
the connection is kept (closing it would end the transaction).

``?wait=`` on the API (``collab.awaiting``) is the async form of the same wait, for routes
that run on the event loop.
"""

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import InMemoryChannelLayer, channel_layers, get_channel_layer
from django.conf import settings
from django.db import connection

from collab.events import session_group
from collab.selectors.events import event_seqs

T = TypeVar("T")

BACKSTOP_SECONDS = 2.0


def release_connection() -> None:
    """Give this thread's database connection back, unless a transaction is open on it."""
    if not connection.in_atomic_block:
        connection.close()


def _answer(check: Callable[[], T], stop: Callable[[], object] | None) -> tuple[T, bool]:
    """``check``'s value, and whether the wait is over (it holds, or the caller stops)."""
    value = check()
    done = bool(value) or (stop is not None and bool(stop()))
    release_connection()
    return value, done


def wait_for_change(check: Callable[[], T], timeout_seconds: float, *, sessions: Iterable[str],
                    stop: Callable[[], object] | None = None) -> T:
    """Return ``check()`` once it is truthy, ``stop()`` is truthy (or raises), or
    ``timeout_seconds`` pass — then ``check``'s last value. ``check`` is asked first, then
    again each time an event is written in one of ``sessions`` (and at least every
    ``BACKSTOP_SECONDS``). ``sessions`` must name every session whose events can make
    ``check`` or ``stop`` true."""
    sessions = sorted({s for s in sessions if s})
    deadline = time.monotonic() + max(0.0, timeout_seconds)
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):  # this process's pushes only
        return _wait_on_event_log(check, stop, sessions, deadline)
    return async_to_sync(_wait_on_channel_layer)(check, stop, sessions, deadline)


def _wait_on_event_log(check, stop, sessions: list[str], deadline: float):
    """The embedded relay's signal, read by this thread: a session's event counter grew."""
    seen = event_seqs(sessions)  # before the first check: nothing written after it is missed
    value, done = _answer(check, stop)
    asked = time.monotonic()
    while not done:
        now = time.monotonic()
        if now >= deadline:
            break
        time.sleep(min(settings.TRELLIS_EVENT_POLL_INTERVAL, deadline - now))
        current = event_seqs(sessions)
        if current != seen or time.monotonic() - asked >= BACKSTOP_SECONDS:
            seen = current
            value, done = _answer(check, stop)
            asked = time.monotonic()
        else:
            release_connection()
    return value


async def _wait_on_channel_layer(check, stop, sessions: list[str], deadline: float):
    """Block on a channel subscribed to the sessions' groups. The layer is an instance of this
    wait's own: a Redis layer object serves one event loop, and each wait runs in its own."""
    answer = sync_to_async(_answer)  # on the calling thread: its connection, its transaction
    layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
    channel = await layer.new_channel()
    groups = [session_group(s) for s in sessions]
    try:
        for group in groups:
            await layer.group_add(group, channel)
        value, done = await answer(check, stop)  # after subscribing: nothing after it is missed
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(layer.receive(channel), min(left, BACKSTOP_SECONDS))
            except TimeoutError:
                pass
            value, done = await answer(check, stop)
        return value
    finally:
        for group in groups:
            await layer.group_discard(group, channel)
        close = getattr(layer, "close_pools", None)
        if close is not None:
            await close()
