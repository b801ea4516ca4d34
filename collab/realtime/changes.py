"""Waiting in a thread for a change the event log records: ``wait_for_change`` (the blocking
``job_output`` and ``wait_agent``, and the gateway's calls that wait in a thread).

``wait_for_change(check, timeout, sessions=…)`` answers when ``check()`` holds, the caller
stops, or time runs out. It does not sleep-and-poll the condition: every change a waiter cares
about (a job ending, a result owed, a cancel of the waiting turn) writes an Event in one of the
sessions named (``collab.events.send_event_on_commit``), so the wait watches those sessions'
event counters (``last_event_seq``) the way the embedded relay (``collab.realtime.relay``) does —
one cheap query per ``TRELLIS_EVENT_POLL_MS`` however many conditions — and asks ``check`` again
only when an event was written. The same signal serves both deployments: the waiters run in
worker processes and gateway threads, where a channel-layer subscription
(``collab.realtime.subscription``, the event loop's form of the same wait) would need an event
loop and a Redis connection of its own per wait.

A change written without an event (none is known) would still be seen: ``check`` is also
asked at least every ``CHANGE_BACKSTOP_SECONDS`` (``collab.realtime.bounds``). The wait is
bounded by ``timeout_seconds`` in every case. While it sleeps a waiter holds no database
connection: the thread's connection is closed and the next read opens a new one, so a
thousand waiters cost no connections and a gateway call parked in a web process pins nothing.
Inside a transaction the connection is kept (closing it would end the transaction).
"""

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from django.conf import settings

from collab.realtime.bounds import CHANGE_BACKSTOP_SECONDS
from collab.selectors.events import event_seqs
from collab.services.waiting import release_connection

T = TypeVar("T")


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
    ``CHANGE_BACKSTOP_SECONDS``). ``sessions`` must name every session whose events can make
    ``check`` or ``stop`` true."""
    sessions = sorted({s for s in sessions if s})
    deadline = time.monotonic() + max(0.0, timeout_seconds)
    return _wait_on_event_log(check, stop, sessions, deadline)


def _wait_on_event_log(check, stop, sessions: list[str], deadline: float):
    """The relay's signal, read by this thread: a session's event counter grew."""
    seen = event_seqs(sessions)  # before the first check: nothing written after it is missed
    value, done = _answer(check, stop)
    asked = time.monotonic()
    while not done:
        now = time.monotonic()
        if now >= deadline:
            break
        time.sleep(min(settings.TRELLIS_EVENT_POLL_INTERVAL, deadline - now))
        current = event_seqs(sessions)
        if current != seen or time.monotonic() - asked >= CHANGE_BACKSTOP_SECONDS:
            seen = current
            value, done = _answer(check, stop)
            asked = time.monotonic()
        else:
            release_connection()
    return value
