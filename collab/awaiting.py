"""Waiting for an execution without polling (issue 15 item 2): the ``wait`` of
``POST /api/sessions/{sid}/turns`` and ``GET /api/executions/{id}``.

The route is async. Its database work (authorization, admission, reads) runs in a thread
that gives its connection back when done; the wait itself is a coroutine parked on the
channel layer — it holds no thread and no database connection. It subscribes a fresh
channel to the session's event group (SPEC §11.1 live events), reads the execution once
after subscribing (so an execution that ended before the subscription is not missed),
wakes on that execution's terminal ``job.*`` event (Redis), or on the embedded relay's
poke (``collab.live``, no Redis), re-reads it, and answers when it is terminal or the wait
ends — then reads it once more.
"""

import asyncio
import logging
import math
import re
import threading
from collections import Counter

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core.handlers.asgi import ASGIRequest
from django.db import connections

from django.conf import settings

from collab.errors import DomainError, Invalid
from collab.events import pushed_wires, session_group
from collab.live import relay
from collab.models import TERMINAL_STATUSES
from config.request_threads import release_thread, retake_thread

logger = logging.getLogger(__name__)


class InFlight:
    """Long-lived calls per user in this process (the gateway's blocking tool calls; open waits
    and event streams here). Per process, not per deployment: N web processes
    admit up to N times the bound. ``refusal(limit)`` is the error past the bound."""

    def __init__(self, refusal):
        self._counts: Counter = Counter()
        self._lock = threading.Lock()
        self._refusal = refusal

    def take(self, user_id: int, limit: int) -> "Slot":
        with self._lock:
            if self._counts[user_id] >= limit:
                raise self._refusal(limit)
            self._counts[user_id] += 1
        return Slot(self, user_id)

    def _give_back(self, user_id: int) -> None:
        with self._lock:
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


async def give_back_request_connection(request) -> None:
    """Under ASGI: close the database connection of the request's own thread (authentication and
    middleware opened it) before the request's work runs in another thread, so that a request holds
    one connection at a time. With the web processes' pool (``DB_POOL_MAX_SIZE``) a request holding
    one pooled connection while its other thread waits for a second deadlocks the pool once as many
    such requests arrive together as it has connections (seen with 10 ``?wait=`` clients on a pool
    of 2); without the pool it kept a PostgreSQL connection open for the whole of a blocking call.
    Once per request: nothing runs on that thread afterwards, and a later hop would only bring back
    the thread a ``?wait=`` gave up before it parked (``collab.awaiting.release_request_thread``)."""
    if isinstance(request, ASGIRequest) and not getattr(request, "_trellis_connection_given_back", False):
        request._trellis_connection_given_back = True
        await sync_to_async(connections.close_all)()


MAX_WAIT_SECONDS = 60


class TooManyOpenWaits(DomainError):
    status = 429
    code = "too_many_open_waits"


def _too_many_open_waits(limit: int) -> DomainError:
    return TooManyOpenWaits(
        f"you already have {limit} waits and event streams open in this web process "
        "(TRELLIS_MAX_OPEN_WAITS_PER_USER); close one or retry when one has answered",
        retryable=True,
    )


# What a parked request costs is a socket and a channel-layer subscription, not a thread; still,
# one user (or one leaked token) opening thousands would exhaust the process's file descriptors
# and the layer's groups for everyone, so each user holds a bounded number at once.
OPEN_WAITS = InFlight(_too_many_open_waits)


def open_wait(user) -> Slot:
    """A slot for one ``?wait=`` request or event stream of ``user`` (free it when it ends);
    past ``TRELLIS_MAX_OPEN_WAITS_PER_USER`` a 429 ``too_many_open_waits``."""
    return OPEN_WAITS.take(user.pk, settings.TRELLIS_MAX_OPEN_WAITS_PER_USER)


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


def closing(fn):
    """``fn`` that closes its thread's database connections when it returns: for work on a thread
    that outlives it (a pool's), which must not keep a connection while idle."""
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()  # the thread is given back: so is its connection
    return run


async def in_thread(request, fn, *args, **kwargs):
    """Run sync database work for an async route. Under ASGI on the request's own thread (where
    authentication ran: its connection serves the work too), which then closes its connections
    (nothing is held across a wait) — or, once the request has given its thread up for a wait
    (``release_request_thread``), on a thread of the shared pool that closes its connections when
    done; under WSGI and Django's test client on the request's own thread (and its connection and
    transaction)."""
    if not isinstance(request, ASGIRequest):
        return await sync_to_async(fn)(*args, **kwargs)
    if getattr(request, "_trellis_thread_released", False):
        return await briefly(fn, *args, **kwargs)
    try:
        return await sync_to_async(closing(fn))(*args, **kwargs)
    finally:
        request._trellis_connection_given_back = True  # closed by closing, on that thread


async def briefly(fn, *args, **kwargs):
    """Short sync database work from a coroutine that holds no thread (a parked wait): on a thread
    of asgiref's shared executor, which closes its connections when done — never queued behind
    long blocking work (the gateway's pool of tool calls)."""
    return await sync_to_async(closing(fn), thread_sensitive=False)(*args, **kwargs)


async def release_request_thread(request) -> None:
    """Before a long wait under ASGI: close the database connection of the request's own
    thread (authentication and middleware ran there) and let that thread go. Django gives each
    ASGI request a thread of its own for sync code (asgiref's thread-sensitive context; lent by
    ``config.request_threads``) that would otherwise idle — with its connection — until the
    request ends; a lent thread goes back to be lent again. Sync work during the wait runs on
    the shared pool (``in_thread``); ``retake_request_thread`` ends the wait. When ``in_thread``
    has already closed that connection, no hop to the thread is needed for it."""
    if not isinstance(request, ASGIRequest):
        return
    if not getattr(request, "_trellis_connection_given_back", False):
        await give_back_request_connection(request)
    request._trellis_thread_released = True
    release_thread()


def retake_request_thread(request) -> None:
    """After a wait: the request's sync code runs on a lent thread again (``retake_thread``)."""
    if isinstance(request, ASGIRequest) and getattr(request, "_trellis_thread_released", False):
        retake_thread(request.scope)
        request._trellis_thread_released = False


# a session id as the routes take it (``collab.models.new_id``): only such a name is subscribed
# to before the route has found the session (a group name must be short and plain)
_PLAIN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
_closing_tasks: set[asyncio.Task] = set()


class Subscription:
    """A fresh channel in a session's event group (and, on the embedded default, the relay's watch
    of that session): what a wait listens on. ``open`` it before the awaited execution can end and
    no read is needed to learn that it ended before the subscription."""

    def __init__(self, layer, session_id: str):
        self.layer, self.session_id = layer, session_id
        self.group, self.channel, self.relay = session_group(session_id), None, None

    @classmethod
    async def open(cls, session_id: str) -> "Subscription":
        self = cls(get_channel_layer(), session_id)
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

    def close_soon(self) -> None:
        """Leave the group after the answer has gone (a round trip to the layer the caller need
        not wait for): the channel is never read again; a failure is only logged."""
        if self.relay:
            self.relay.unwatch(self.session_id)
            self.relay = None
        task = asyncio.get_running_loop().create_task(self._discard())
        _closing_tasks.add(task)
        task.add_done_callback(_closing_tasks.discard)

    async def _discard(self) -> None:
        try:
            await self.layer.group_discard(self.group, self.channel)
        except Exception:  # noqa: BLE001 — the group's entry expires with the layer's group_expiry
            logger.warning("leaving %s failed", self.group, exc_info=True)


async def receive_within(layer, channel: str, seconds: float) -> dict | None:
    """The next message on ``channel`` within ``seconds``, else None. A failed read of the layer
    is None too (logged): callers re-read the database, which holds the truth, and never fail a
    request over it. (channels-redis: when ``wait_for`` cancels a blocking read just as redis-py's
    own read timeout fires, redis-py raises its ``TimeoutError`` — not the builtin one — out of
    the cancelled read.)"""
    try:
        return await asyncio.wait_for(layer.receive(channel), seconds)
    except TimeoutError:
        return None
    except Exception:  # noqa: BLE001 — any layer failure means "look again", never a 500
        logger.warning("channel layer read failed; re-reading from the database", exc_info=True)
        await asyncio.sleep(min(max(seconds, 0), 0.1))  # not a hot loop while the layer is down
        return None


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
        if subscription is not None and subscription.channel is not None:
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
            message = await receive_within(subscription.layer, subscription.channel, left)
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
