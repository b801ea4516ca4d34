"""The tool gateway in the web process (``POST /api/branches/{address}/tools/{tool}``, docs/contract.md#http-api;
the MCP server at ``/mcp``, ``collab.mcp_server``, calls the same functions).

Sync views under daphne share one thread per process (asgiref's thread-sensitive mode), so a
tool that waits — ``job_output`` with ``block``, ``wait_agent``, ``bash`` — would freeze every
page and API call of that process. The gateway route is async instead: each call runs in a
thread of its own pool and closes its database connections when done (the waits themselves
hold none while they sleep, see ``collab.realtime.changes``). Blocking calls are bounded per
user and per web process (``TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER``); past the bound the call
is refused with 429 ``too_many_blocking_calls`` before anything runs.

No agent turn runs here. A foreground ``agent`` call (no ``to``, not in the background) admits
its child as a job like any other — a worker runs it, within the project's running cap and
the session's live cap — and the call then waits for that job to end as ``?wait=`` does: a
coroutine parked on the channel layer, holding no thread and no database connection (an open
wait of the user's, ``TRELLIS_MAX_OPEN_STREAMS_PER_USER``). Its answer is the child's final reply,
as before; no follow-up carries it again (``Job.answers_call``).
"""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.core.handlers.asgi import ASGIRequest

from collab.access import access_branch, require_can_act_as
from collab.realtime.bounds import GATEWAY_REREAD_SECONDS, InFlight, Slot, open_wait
from collab.realtime.subscription import until_terminal
from collab.realtime.threads import briefly, closing, give_back_request_connection
from collab.errors import DomainError
from collab.models import TERMINAL_STATUSES
from collab.selectors.jobs import has_ended, job_status
from collab.services.acting import gateway_actor
from collab.realtime.changes import wait_for_change
from collab.tools.registry import Tool, ToolResult, run_tool
from collab.tools.surface import branch_tools



class TooManyBlockingCalls(DomainError):
    status = 429
    code = "too_many_blocking_calls"


def is_blocking(tool: str, arguments) -> bool:
    """Whether a call may hold a thread for a long time (judged before its arguments are validated)."""
    args = arguments if isinstance(arguments, dict) else {}
    if tool in ("wait_agent", "bash"):
        return True
    if tool == "job_output":
        return args.get("block", True) is not False
    return False


def awaits_a_child(tool: str, arguments) -> bool:
    """Whether a call is a foreground ``agent``: it waits too, in no thread (an open wait)."""
    args = arguments if isinstance(arguments, dict) else {}
    return tool == "agent" and not args.get("run_in_background") and not str(args.get("to") or "").strip()


def _too_many_blocking_calls(limit: int) -> DomainError:
    return TooManyBlockingCalls(
        f"you already have {limit} blocking tool calls waiting in this web process "
        "(TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER); retry when one has answered",
        retryable=True,
    )


IN_FLIGHT = InFlight(_too_many_blocking_calls)
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(settings.TRELLIS_GATEWAY_THREADS, thread_name_prefix="trellis-gateway")
        return _executor


def acting_branch(user, address: str):
    """The branch at ``address``, if ``user`` may act as it from outside a turn (docs/contract.md#http-api:
    members as branches they started, maintainers as any; outsiders "not found")."""
    branch = access_branch(user, address)
    require_can_act_as(user, branch)
    return branch


def surface_of(user, address: str) -> list[Tool]:
    """The tools ``user`` may call as the branch at ``address``: exactly what ``run_as_branch``
    dispatches (for listings such as the MCP server's ``tools/list``)."""
    return branch_tools(acting_branch(user, address))


def start_as_branch(user, address: str, tool: str, arguments) -> ToolResult:
    """Authorize and run one tool call as the branch at ``address`` (the call continues the
    branch's chain). A result that ``awaits`` an execution is the call's answer only once that
    execution has ended (``awaited_answer``)."""
    branch = acting_branch(user, address)
    return run_tool(gateway_actor(user, branch), tool, arguments, tools=branch_tools(branch))


def run_as_branch(user, address: str, tool: str, arguments) -> dict:
    """The whole call on this thread: ``start_as_branch``, then (a foreground ``agent``) a wait
    for the worker to end the child — this thread waits, holding no connection between reads."""
    result = start_as_branch(user, address, tool, arguments)
    return (result if result.awaits is None else wait_for_answer(result)).as_dict()


def wait_for_answer(result: ToolResult) -> ToolResult:
    """``awaited_answer`` once the execution has ended or the bound passed; this thread waits."""
    awaits = result.awaits
    wait_for_change(lambda: has_ended(awaits.execution_id), settings.TRELLIS_GATEWAY_FOREGROUND_WAIT_SECONDS,
                    sessions=[awaits.session_id])
    return awaited_answer(result)


def awaited_answer(result: ToolResult) -> ToolResult:
    """The answer of a call whose result ``awaits`` an execution: once it has ended, its answer;
    if it still runs (the wait's bound passed), the result so far (its id, for job_output)."""
    gone = ToolResult.error("not_found", f"execution {result.awaits.execution_id} no longer exists")
    status = job_status(result.awaits.execution_id)
    if status is None:  # its session was deleted meanwhile
        return gone
    if status not in TERMINAL_STATUSES:
        return result
    try:
        return result.awaits.answer()
    except ObjectDoesNotExist:  # deleted between the two reads
        return gone


def _start_in_pool_thread(slot: Slot, user, address: str, tool: str, arguments) -> ToolResult | None:
    if not slot.start():
        return None  # the caller hung up before this thread got to it
    try:
        return closing(start_as_branch)(user, address, tool, arguments)  # a pool thread outlives the request
    finally:
        slot.free()


async def _in_pool(fn, *args):
    return await sync_to_async(closing(fn), thread_sensitive=False, executor=_pool())(*args)


async def _answer_when_ended(request, result: ToolResult) -> ToolResult:
    """Wait, holding no thread, until the execution ``result`` awaits has ended (or the bound
    passes); then its answer. Without a channel layer a pool thread waits instead."""
    awaits = result.awaits
    if get_channel_layer() is None:
        return await _in_pool(wait_for_answer, result)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.TRELLIS_GATEWAY_FOREGROUND_WAIT_SECONDS

    async def read() -> dict:
        return {"status": await briefly(job_status, awaits.execution_id)}

    while loop.time() < deadline:
        now = await until_terminal(request, awaits.session_id, awaits.execution_id,
                                   min(GATEWAY_REREAD_SECONDS, deadline - loop.time()), read, slot=Slot())
        if now["status"] in TERMINAL_STATUSES or now["status"] is None:
            break
    return await briefly(awaited_answer, result)


async def call_tool(request, address: str, tool: str, arguments) -> dict:
    """The REST gateway call (``request.auth`` acts); see ``call_tool_as``."""
    await give_back_request_connection(request)
    return await call_tool_as(request.auth, address, tool, arguments, own_thread=not isinstance(request, ASGIRequest),
                              request=request)


async def call_tool_as(user, address: str, tool: str, arguments, *, own_thread: bool = False, request=None) -> dict:
    """One gateway call as the branch at ``address``, for every face that offers the tools to
    outside agents (the REST route, the MCP server); blocking tools count against the user's
    bound in this process (``TooManyBlockingCalls`` before anything runs).

    Under ASGI the call runs in the gateway's own thread pool, never on the thread all sync
    views share. ``own_thread``: the caller already has a thread of its own (WSGI, Django's
    test client), so the call stays on it (and on its database connection and transaction).
    ``request``: the Django request making the call, whose thread a long wait lets go."""
    blocking = is_blocking(tool, arguments)
    slot = IN_FLIGHT.take(user.pk, settings.TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER) if blocking else Slot()
    if own_thread:
        try:
            return await sync_to_async(run_as_branch)(user, address, tool, arguments)
        finally:
            slot.free()
    # a foreground agent's wait is one of the user's open waits: taken before its child is admitted,
    # so past the bound the call is refused (429) with nothing started
    waiting = open_wait(user) if awaits_a_child(tool, arguments) else Slot()
    try:
        run = sync_to_async(_start_in_pool_thread, thread_sensitive=False, executor=_pool())
        try:
            result = await run(slot, user, address, tool, arguments)
        except asyncio.CancelledError:
            slot.abandon()
            raise
        if result is not None and result.awaits is not None:
            result = await _answer_when_ended(request, result)
        return None if result is None else result.as_dict()
    finally:
        waiting.free()
