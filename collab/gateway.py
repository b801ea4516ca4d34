"""The tool gateway in the web process (``POST /api/branches/{address}/tools/{tool}``, P-SEC-4;
the MCP server at ``/mcp``, ``collab.mcp_server``, calls the same functions).

Sync views under daphne share one thread per process (asgiref's thread-sensitive mode), so a
tool that waits — ``job_output`` with ``block``, ``wait_agent``, ``bash``, a foreground
``agent`` — would freeze every page and API call of that process. The gateway route is async
instead: each call runs in a thread of its own pool and closes its database connections when
done (the waits themselves hold none while they sleep, see ``collab.services.waiting``).
Blocking calls are bounded per user and per web process (``TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER``);
past the bound the call is refused with 429 ``too_many_blocking_calls`` before anything runs.
"""

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connections

from collab.access import access_branch, require_can_act_as
from collab.errors import DomainError
from collab.services.acting import gateway_actor
from collab.tools.registry import Tool, run_tool
from collab.tools.surface import branch_tools


class TooManyBlockingCalls(DomainError):
    status = 429
    code = "too_many_blocking_calls"


def is_blocking(tool: str, arguments) -> bool:
    """Whether a call may wait for a long time (judged before its arguments are validated)."""
    args = arguments if isinstance(arguments, dict) else {}
    if tool in ("wait_agent", "bash"):
        return True
    if tool == "job_output":
        return args.get("block", True) is not False
    if tool == "agent":
        return not args.get("run_in_background") and not str(args.get("to") or "").strip()
    return False


def _too_many_blocking_calls(limit: int) -> DomainError:
    return TooManyBlockingCalls(
        f"you already have {limit} blocking tool calls waiting in this web process "
        "(TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER); retry when one has answered",
        retryable=True,
    )


class InFlight:
    """Long-lived calls per user in this process (blocking tool calls here; open waits and
    event streams in ``collab.awaiting``). Per process, not per deployment: N web processes
    admit up to N times the bound. ``refusal(limit)`` is the error past the bound."""

    def __init__(self, refusal=_too_many_blocking_calls):
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


IN_FLIGHT = InFlight()
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(settings.TRELLIS_GATEWAY_THREADS, thread_name_prefix="trellis-gateway")
        return _executor


def acting_branch(user, address: str):
    """The branch at ``address``, if ``user`` may act as it from outside a turn (P-SEC-7:
    members as branches they started, maintainers as any; outsiders "not found")."""
    branch = access_branch(user, address)
    require_can_act_as(user, branch)
    return branch


def surface_of(user, address: str) -> list[Tool]:
    """The tools ``user`` may call as the branch at ``address``: exactly what ``run_as_branch``
    dispatches (for listings such as the MCP server's ``tools/list``)."""
    return branch_tools(acting_branch(user, address))


def run_as_branch(user, address: str, tool: str, arguments) -> dict:
    """Authorize and run one tool call as the branch at ``address`` (the call continues the
    branch's chain)."""
    branch = acting_branch(user, address)
    return run_tool(gateway_actor(user, branch), tool, arguments, tools=branch_tools(branch)).as_dict()


def _run_in_pool_thread(slot: Slot, user, address: str, tool: str, arguments) -> dict | None:
    if not slot.start():
        return None  # the caller hung up before this thread got to it
    try:
        return run_as_branch(user, address, tool, arguments)
    finally:
        connections.close_all()  # a pool thread outlives the request: give its connections back
        slot.free()


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


async def call_tool(request, address: str, tool: str, arguments) -> dict:
    """The REST gateway call (``request.auth`` acts); see ``call_tool_as``."""
    await give_back_request_connection(request)
    return await call_tool_as(request.auth, address, tool, arguments, own_thread=not isinstance(request, ASGIRequest))


async def call_tool_as(user, address: str, tool: str, arguments, *, own_thread: bool = False) -> dict:
    """One gateway call as the branch at ``address``, for every face that offers the tools to
    outside agents (the REST route, the MCP server); blocking tools count against the user's
    bound in this process (``TooManyBlockingCalls`` before anything runs).

    Under ASGI the call runs in the gateway's own thread pool, never on the thread all sync
    views share. ``own_thread``: the caller already has a thread of its own (WSGI, Django's
    test client), so the call stays on it (and on its database connection and transaction)."""
    blocking = is_blocking(tool, arguments)
    slot = IN_FLIGHT.take(user.pk, settings.TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER) if blocking else Slot()
    if own_thread:
        try:
            return await sync_to_async(run_as_branch)(user, address, tool, arguments)
        finally:
            slot.free()
    run = sync_to_async(_run_in_pool_thread, thread_sensitive=False, executor=_pool())
    try:
        return await run(slot, user, address, tool, arguments)
    except asyncio.CancelledError:
        slot.abandon()
        raise
