"""Every bound on waiting, in one place: how long each kind of wait may last and how many one
user may hold open.

- ``?wait=`` on ``POST /api/sessions/{sid}/turns`` and ``GET /api/executions/{id}``: 0 to
  ``MAX_WAIT_SECONDS`` (``parse_wait``);
- ``wait_agent``'s ``timeout_ms``: ``AGENT_WAIT_MIN_MS`` to ``AGENT_WAIT_MAX_MS``, default
  ``AGENT_WAIT_DEFAULT_MS``; ``job_output``'s ``timeout`` (ms, with ``block``): 0 to
  ``JOB_OUTPUT_MAX_MS``, default ``JOB_OUTPUT_DEFAULT_MS``;
- a foreground ``agent`` call through the gateway or MCP: ``TRELLIS_GATEWAY_FOREGROUND_WAIT_SECONDS``,
  re-reading the execution at least every ``GATEWAY_REREAD_SECONDS``;
- an SSE stream: a keep-alive (and a re-check of the viewer's access) every ``SSE_HEARTBEAT_SECONDS``;
- a wait on the event log (``collab.realtime.changes``) asks its condition again at least every
  ``CHANGE_BACKSTOP_SECONDS``, whatever the log says;
- long-lived connections (``?wait=`` requests, SSE streams, foreground gateway calls, MCP
  streams, WebSockets) one user holds in one web process: ``TRELLIS_MAX_OPEN_STREAMS_PER_USER``,
  and all users together: ``TRELLIS_MAX_OPEN_STREAMS`` (``open_wait``); the gateway's blocking tool
  calls: ``TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER`` (``collab.gateway``, an ``InFlight`` of its own).
"""

import math
import threading
from collections import Counter

from django.conf import settings

from collab.errors import DomainError, Invalid

AGENT_WAIT_DEFAULT_MS = 60_000
AGENT_WAIT_MIN_MS = 10_000
AGENT_WAIT_MAX_MS = 600_000
JOB_OUTPUT_DEFAULT_MS = 30_000
JOB_OUTPUT_MAX_MS = 600_000
SSE_HEARTBEAT_SECONDS = 15.0
CHANGE_BACKSTOP_SECONDS = 2.0
# a foreground gateway call re-reads its execution at least this often: covers an event the
# channel layer lost
GATEWAY_REREAD_SECONDS = 30.0


class InFlight:
    """Long-lived calls per user in this process (the gateway's blocking tool calls; open waits
    and event streams here). Per process, not per deployment: N web processes
    admit up to N times the bound. ``refusal(limit)`` is the error past the bound."""

    def __init__(self, refusal):
        self._counts: Counter = Counter()
        self._total = 0
        self._lock = threading.Lock()
        self._refusal = refusal

    def take(self, user_id: int, limit: int, process_limit: int = 0, busy=None) -> "Slot":
        """A slot of ``user_id``'s; past ``limit`` of theirs ``refusal(limit)``, past
        ``process_limit`` (0: none) of everyone's in this process ``busy(process_limit)``."""
        with self._lock:
            if self._counts[user_id] >= limit:
                raise self._refusal(limit)
            if process_limit and self._total >= process_limit:
                raise busy(process_limit)
            self._counts[user_id] += 1
            self._total += 1
        return Slot(self, user_id)

    def _give_back(self, user_id: int) -> None:
        with self._lock:
            self._total -= 1
            self._counts[user_id] -= 1
            if self._counts[user_id] <= 0:
                del self._counts[user_id]


class Slot:
    """One admitted blocking call. It is given back when its work ends — not when the client
    goes away, since a thread cannot be stopped: a client that hangs up and calls again does
    not get past the bound. Work abandoned before its thread started never runs."""

    def __init__(self, owner: InFlight | None = None, user_id: int = 0):
        self._owner, self._user_id = owner, user_id
        self._lock = threading.Lock()
        self._started = self._freed = False

    def start(self) -> bool:
        with self._lock:
            self._started = not self._freed
            return self._started

    def free(self) -> None:
        with self._lock:
            if self._freed:
                return
            self._freed = True
        if self._owner is not None:
            self._owner._give_back(self._user_id)

    def abandon(self) -> None:
        """The caller stopped waiting: free the slot now unless its work already runs."""
        with self._lock:
            if self._started:
                return
        self.free()


MAX_WAIT_SECONDS = 60


class TooManyOpenWaits(DomainError):
    status = 429
    code = "too_many_open_waits"


class TooManyOpenStreams(DomainError):
    status = 429
    code = "too_many_open_streams"


def _too_many_open_waits(limit: int) -> DomainError:
    return TooManyOpenWaits(
        f"you already have {limit} waits, event streams, MCP streams and sockets open in this web "
        "process (TRELLIS_MAX_OPEN_STREAMS_PER_USER); close one or retry when one has answered",
        retryable=True,
    )


def _too_many_open_streams(limit: int) -> DomainError:
    return TooManyOpenStreams(
        f"this web process holds the most long-lived connections it takes ({limit}, "
        "TRELLIS_MAX_OPEN_STREAMS); retry in a moment", retryable=True,
    )


# What a parked request or an open stream costs is a socket and a channel-layer subscription,
# not a thread; still, one user (or one leaked token) opening thousands would exhaust the
# process's file descriptors and the layer's groups for everyone. So every long-lived connection
# — a ``?wait=`` request, an SSE stream, a foreground gateway call's wait, an MCP stream, a
# WebSocket — takes one of its user's slots in this process, and one of the process's.
OPEN_WAITS = InFlight(_too_many_open_waits)
WEBSOCKET_REFUSED = 4429  # the close code of a socket past either bound (accepted, then closed)


def open_wait(user) -> Slot:
    """A slot for one long-lived connection of ``user`` (free it when it ends); past
    ``TRELLIS_MAX_OPEN_STREAMS_PER_USER`` a 429 ``too_many_open_waits``, past
    ``TRELLIS_MAX_OPEN_STREAMS`` in this process a 429 ``too_many_open_streams``."""
    return OPEN_WAITS.take(user.pk, settings.TRELLIS_MAX_OPEN_STREAMS_PER_USER, settings.TRELLIS_MAX_OPEN_STREAMS,
                           _too_many_open_streams)


def parse_wait(raw: float | str | None) -> float | None:
    """``wait`` as given in the query: seconds, 0 to 60; None when absent. Bad → 400."""
    if raw is None or raw == "":
        return None
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        raise Invalid(f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS}, not {raw!r}",
                      code="invalid_wait") from None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_WAIT_SECONDS:
        raise Invalid(f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS}, not {raw!r}",
                      code="invalid_wait")
    return seconds


