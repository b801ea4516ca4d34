"""The one wait primitive: "until this job / this mailbox changes" (issue 14 item 3).

``wait_for_change(check, timeout, sessions=…)`` answers when ``check()`` holds, the caller
stops, or time runs out. It does not sleep-and-poll the condition: every change a waiter cares
about (a job ending, a result owed, a cancel of the waiting turn) writes an Event in one of the
sessions named (``send_event_on_commit``), so the wait watches those sessions' event counters
(``last_event_seq``) the way the embedded relay (``collab.live``) does — one cheap query per
``TRELLIS_EVENT_POLL_MS`` however many conditions — and asks ``check`` again only when an
event was written. The same signal serves both deployments: the waiters run in worker
processes and gateway threads, where a channel-layer subscription would need an event loop
and a Redis connection of its own per wait.

A change written without an event (none is known) would still be seen: ``check`` is also
asked at least every ``BACKSTOP_SECONDS``. The wait is bounded
by ``timeout_seconds`` in every case.

Used by ``job_output`` (``block``), ``wait_agent`` and so by the tool gateway, which runs
those tools. While it sleeps a waiter holds no database connection (P-SEC-4): the thread's
connection is closed and the next read opens a new one, so a thousand waiters cost no
connections and a gateway call parked in a web process pins nothing. Inside a transaction
the connection is kept (closing it would end the transaction).

``?wait=`` on the API (``collab.awaiting``) is the async form of the same wait, for routes
that run on the event loop.
"""

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from django.conf import settings
from django.db import connection

from collab.selectors.events import event_seqs

T = TypeVar("T")

BACKSTOP_SECONDS = 2.0


def release_connection() -> None:
    """Give this thread's database connection back, unless a transaction is open on it."""
    if not connection.in_atomic_block:
        connection.close()


def is_pooled() -> bool:
    """Whether this process's connections come from a pool (psycopg's: PostgreSQL's default)."""
    return bool(connection.settings_dict.get("OPTIONS", {}).get("pool"))


def idle_connection() -> None:
    """This thread is about to wait on something other than the database (a model call, a sleep,
    a tool's process): its connection goes back to the pool, unless a transaction is open on it.
    Without a pool (SQLite; PostgreSQL with ``DB_POOL_MAX_SIZE=0``) the connection is kept, as
    ``CONN_MAX_AGE`` says: closing it would only cost a new one at the next query."""
    if is_pooled():
        release_connection()


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
        if current != seen or time.monotonic() - asked >= BACKSTOP_SECONDS:
            seen = current
            value, done = _answer(check, stop)
            asked = time.monotonic()
        else:
            release_connection()
    return value
