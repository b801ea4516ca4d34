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
import math

from asgiref.sync import SyncToAsync, sync_to_async
from channels.layers import get_channel_layer
from django.core.handlers.asgi import ASGIRequest
from django.db import connections

from collab.errors import Invalid
from collab.events import session_group
from collab.live import relay
from collab.models import TERMINAL_STATUSES

MAX_WAIT_SECONDS = 60


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


def _closing(fn):
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()  # the thread is given back: so is its connection
    return run


async def in_thread(request, fn, *args, **kwargs):
    """Run sync database work for an async route. Under ASGI in a worker thread that closes its
    connections when done (nothing is held across the wait); under WSGI and Django's test
    client on the request's own thread (and its connection and transaction)."""
    if not isinstance(request, ASGIRequest):
        return await sync_to_async(fn)(*args, **kwargs)
    return await sync_to_async(_closing(fn), thread_sensitive=False)(*args, **kwargs)


async def release_request_thread(request) -> None:
    """Before a long wait under ASGI: close the database connection of the request's own
    thread (authentication and middleware ran there) and let that thread go. Django gives each
    ASGI request a thread of its own for sync code (asgiref's thread-sensitive context) that
    would otherwise idle — with its connection — until the request ends; sync code after the
    wait gets a fresh one (asgiref creates it on demand)."""
    if not isinstance(request, ASGIRequest):
        return
    await sync_to_async(connections.close_all)()
    context = getattr(SyncToAsync, "thread_sensitive_context", None)
    context = context.get(None) if context is not None else None
    executors = getattr(SyncToAsync, "context_to_thread_executor", None)
    if context is not None and executors is not None and getattr(context, "_executor", None) is None:
        executor = executors.pop(context, None)
        if executor is not None:
            executor.shutdown(wait=False)


def _wakes(message: dict, execution_id: str) -> bool:
    if message.get("type") == "collab.poke":
        return True
    if message.get("type") != "collab.event":
        return False
    wire = message.get("event") or {}
    payload = wire.get("payload") or {}
    return (str(wire.get("type", "")).startswith("job.") and payload.get("job") == execution_id
            and payload.get("status") in TERMINAL_STATUSES)


async def until_terminal(request, session_id: str, execution_id: str, seconds: float, read, current: dict | None = None) -> dict:
    """Await ``read()`` (an async read of the execution's status, a dict with ``status``)
    until the status is terminal or ``seconds`` pass; return the last read. ``current``: a
    read just made (returned as it is when already terminal)."""
    if current is not None and current["status"] in TERMINAL_STATUSES:
        return current
    layer = get_channel_layer()
    if layer is None or seconds <= 0:
        return await read()
    await release_request_thread(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    channel = await layer.new_channel()
    group = session_group(session_id)
    await layer.group_add(group, channel)
    events_relay = relay()
    if events_relay:
        events_relay.watch(session_id, 0)
    try:
        shape = await read()  # after subscribing: it may have ended before
        while shape["status"] not in TERMINAL_STATUSES:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                message = await asyncio.wait_for(layer.receive(channel), left)
            except TimeoutError:
                break
            if _wakes(message, execution_id):
                shape = await read()
    finally:
        if events_relay:
            events_relay.unwatch(session_id)
        await layer.group_discard(group, channel)
    if shape["status"] not in TERMINAL_STATUSES:
        shape = await read()  # once more at the end
    return shape
