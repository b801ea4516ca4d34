"""The turn loop (SPEC §10): model call → tool calls → tool results → next call.

``run_job`` is what a worker runs for one job. It claims the job (or returns if
it lost the claim), drives the provider until a final answer, the tool-call cap,
a stop request or an error, and ends the job in one completion transaction.
"""

import logging
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction

from accounts.limits import effective_limit

from collab.models import JobKind, JobStatus, Message, MessageRole
from collab.runtime.providers import ProviderError, get_provider
from collab.events import send_event_on_commit
from collab.services.acting import Actor
from collab.services.execution import claim_job, current_status, finish_job
from collab.services.followup import drain_mailbox
from collab.services.liveness import running
from collab.services.locking import kept_on_rollback
from collab.services.messages import append_message
from collab.services.retry import retry_on_deadlock
from collab.tools.registry import ToolResult, run_tool
from collab.tools.surface import branch_tools, role_of

log = logging.getLogger(__name__)

STOP_CHECK_SECONDS = 0.2
EXPLORER_MAX_MODEL_CALLS = 15
OPENWORK_MAX_MODEL_CALLS = 20
DOOM_LOOP_THRESHOLD = 3
DELTA_FLUSH_SECONDS = 0.25
DELTA_FLUSH_CHARS = 400


class TurnStopped(Exception):
    """The job was asked to stop (cancel); the loop unwinds and the job ends cancelled."""


class ToolCallLimit(Exception):
    pass


class LimitExceeded(Exception):
    """A resource limit of the project (tokens, runtime, idle time) ended the turn."""

    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class TurnContext:
    """Everything one running turn knows; providers read from it."""

    job: Any
    branch: Any
    spec: Any
    inline_parents: tuple = ()
    provider_state: dict = field(default_factory=dict)
    mailbox_text: str = ""
    last_result: ToolResult | None = None
    model_calls: int = 0
    tool_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    wait_timeouts: int = 0
    _tools: list | None = None
    _recent_calls: list = field(default_factory=list)
    _last_check: float = 0.0
    _delta: list = field(default_factory=list)
    _delta_flushed: float = 0.0
    _started: float = field(default_factory=time.monotonic)
    _last_progress: float = field(default_factory=time.monotonic)

    @property
    def project(self):
        return self.job.project

    @property
    def prompt(self) -> str:
        return self.job.prompt

    @property
    def address(self) -> str:
        return self.branch.address

    @property
    def toolset(self) -> str:
        return getattr(self.spec, "toolset", "collab") or "collab"

    @property
    def role(self) -> str:
        return role_of(self.branch)

    @property
    def policy(self) -> tuple[int | None, int | None]:
        """(max model calls, doom-loop threshold) of this turn (OW §4, §5.1): an explorer has
        15 and 3; an OpenWork root 20 (``limits.max_model_calls`` overrides) and 3; collab none."""
        if self.role == "explorer":
            return EXPLORER_MAX_MODEL_CALLS, DOOM_LOOP_THRESHOLD
        if self.toolset == "openwork":
            limits = getattr(self.spec, "limits", None) or {}
            value = limits.get("max_model_calls") if isinstance(limits, dict) else None
            return (value if isinstance(value, int) and value > 0 else OPENWORK_MAX_MODEL_CALLS), DOOM_LOOP_THRESHOLD
        return None, None

    @property
    def system_prompt(self) -> str:
        """The spec's prompt; an explorer's role prompt; an OpenWork root's ends with the
        delegation rules (OW §5.3) carrying the project's ``max_active_turns``."""
        from collab.runtime.prompts import delegation_rules, explorer_prompt

        base = (getattr(self.spec, "system_prompt", "") or "").strip()
        if self.role == "explorer":
            return explorer_prompt()
        if self.toolset == "openwork" and any(t.name == "spawn_agent" for t in self.tools):
            return "\n\n".join(part for part in (base, delegation_rules(effective_limit(self.project, "max_active_turns"))) if part)
        return base

    @property
    def tools(self):
        """The branch's tool surface: offered and dispatched (collab.tools.surface)."""
        if self._tools is None:
            self._tools = branch_tools(self.branch)
        return self._tools

    def count_wait(self, delivered: bool) -> None:
        """wait_agent's timeout streak (OW §5.1): a delivery resets it."""
        self.wait_timeouts = 0 if delivered else self.wait_timeouts + 1

    def check_doom_loop(self, calls) -> None:
        """Three timeouts of wait_agent in a row, or the same tool call (not wait_agent) three
        times in a row, end the turn as ``doom_loop`` (OW §4, §5.1)."""
        _, threshold = self.policy
        if not threshold:
            return
        if self.wait_timeouts >= threshold:
            raise LimitExceeded("doom_loop", f"wait_agent timed out {self.wait_timeouts} times in a row")
        for call in calls:
            if call.name == "wait_agent":
                continue
            self._recent_calls = (self._recent_calls + [(call.name, repr(call.arguments))])[-threshold:]
            if len(self._recent_calls) == threshold and len(set(self._recent_calls)) == 1:
                raise LimitExceeded("doom_loop", f"the same {call.name} call was repeated {threshold} times in a row")

    def history(self) -> list[Message]:
        """The branch's messages from the root to the tip (for providers that send history),
        cut to fit the model's context window when the spec declares one (runtime/compaction.py)."""
        from collab.runtime.compaction import compacted, history_budget
        from collab.selectors.transcript import lineage

        limits = getattr(self.spec, "limits", None) or {}
        window = limits.get("context_window") if isinstance(limits, dict) else None
        return compacted(lineage(self.branch.tip), history_budget(window if isinstance(window, int) else None))

    def check_stop(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_check < STOP_CHECK_SECONDS:
            return
        self._last_check = now
        status = current_status(self.job)
        if status != JobStatus.RUNNING:
            raise TurnStopped(status)
        # bounded by the operator's ceilings too, so no script (a sleep_ms step) outlasts them
        runtime = effective_limit(self.project, "max_runtime_seconds")
        idle = effective_limit(self.project, "max_idle_seconds")
        if runtime and now - self._started > runtime:
            raise LimitExceeded("quota.runtime_exceeded", f"the turn ran longer than {runtime} s (max_runtime_seconds)")
        if idle and now - self._last_progress > idle:
            raise LimitExceeded("quota.idle_exceeded", f"the turn made no progress for {idle} s (max_idle_seconds)")

    def progressed(self) -> None:
        self._last_progress = time.monotonic()

    def on_text_delta(self, text: str) -> None:
        """A streaming provider's text fragment. Fragments are batched into ``message.delta``
        events (about four a second, or every 400 characters), never one event per token."""
        self._delta.append(text)
        now = time.monotonic()
        if now - self._delta_flushed >= DELTA_FLUSH_SECONDS or sum(map(len, self._delta)) >= DELTA_FLUSH_CHARS:
            self.flush_delta()

    def flush_delta(self) -> None:
        if not self._delta:
            return
        chunk, self._delta = "".join(self._delta), []
        self._delta_flushed = time.monotonic()
        with transaction.atomic():
            send_event_on_commit(
                self.job.session_id, "message.delta",
                {"job": self.job.pk, "branch": self.branch.pk, "call": self.model_calls, "text": chunk},
            )

    def available_tools(self):
        """The tools offered to the model this turn: the toolset narrowed by the spec's
        allow-list, without delegation tools once the chain's message budget is spent."""
        from collab.services.limits import DELEGATION_TOOLS, messages_left

        tools = self.tools
        if not messages_left(self.project, self.job.chain_messages):
            tools = [t for t in tools if t.name not in DELEGATION_TOOLS]
        return tools

    def sleep(self, seconds: float) -> None:
        """Wait like a slow model would, noticing a stop request within ~0.2 s."""
        deadline = time.monotonic() + seconds
        while True:
            self.check_stop()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, STOP_CHECK_SECONDS))

    def usage(self) -> dict:
        return {
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost": self.cost.quantize(Decimal("0.000001")),
        }


def run_job(job_id: str, inline_parents: tuple[str, ...] = (), inline: bool = False) -> str | None:
    """Run one job to its end. Returns the final status, or None if this worker did not claim it.

    ``inline_parents`` are the jobs waiting on this one in the same worker (foreground
    ``agent`` calls). While the job runs here, this process renews its lease whatever the
    turn is blocked on (collab/services/liveness.py).
    """
    job = claim_job(job_id, inline=inline)
    if job is None:
        return None
    with running(job.pk):
        return _run_claimed(job, inline_parents)


def run_foreground(job, caller_job) -> None:
    """Run a foreground ``agent`` call's child job (admitted by ``do_spawn``, not enqueued) inline,
    in the caller's worker, and refresh ``job`` with how it ended. ``caller_job`` (None outside a
    turn) and the jobs waiting on it are the child's inline parents, whose leases this process renews."""
    parents = () if caller_job is None else (caller_job.pk, *getattr(caller_job, "inline_parents", ()))
    run_job(job.pk, inline_parents=parents, inline=True)
    job.refresh_from_db()


def _run_claimed(job, inline_parents: tuple[str, ...]) -> str:
    job_id = job.pk
    job.inline_parents = tuple(inline_parents)
    ctx = TurnContext(job=job, branch=job.branch, spec=job.agent_spec, inline_parents=tuple(inline_parents))
    if job.branch.archived:
        # accepted before the branch was archived, started after: refused, with the reason on record
        reason = f"agent {job.branch.display_name!r} was archived before this delivery started"
        finish_job(job, status=JobStatus.FAILED, final_text=None, result_text=reason, is_error=True,
                   error_code="archived", error_reason=reason)
        return JobStatus.FAILED
    try:
        text = drive(ctx)
    except TurnStopped:
        finish_job(
            job, status=JobStatus.CANCELLED, final_text=None, result_text="cancelled",
            is_error=True, error_code="cancelled", error_reason="the execution was cancelled", usage=ctx.usage(),
        )
    except LimitExceeded as exc:
        finish_job(
            job, status=JobStatus.FAILED, final_text=None, result_text=exc.reason,
            is_error=True, error_code=exc.code, error_reason=exc.reason, usage=ctx.usage(),
        )
    except ToolCallLimit as exc:
        finish_job(
            job, status=JobStatus.FAILED, final_text=None, result_text=str(exc),
            is_error=True, error_code="tool_call_limit", error_reason=str(exc), usage=ctx.usage(),
        )
    except ProviderError as exc:
        finish_job(
            job, status=JobStatus.FAILED, final_text=None, result_text=exc.reason,
            is_error=True, error_code=exc.code, error_reason=exc.reason, usage=ctx.usage(),
        )
    except Exception as exc:
        log.exception("turn %s crashed", job_id)
        reason = f"internal error: {type(exc).__name__}"
        finish_job(
            job, status=JobStatus.FAILED, final_text=None, result_text=reason,
            is_error=True, error_code="internal_error", error_reason=reason, usage=ctx.usage(),
        )
    else:
        try:
            finish_job(job, status=JobStatus.SUCCEEDED, final_text=text, result_text=text, usage=ctx.usage())
        except Exception as exc:  # the answer could not be stored: the job still ends, never stays running
            log.exception("turn %s could not store its answer", job_id)
            reason = f"internal error: the final answer could not be stored ({type(exc).__name__})"
            finish_job(
                job, status=JobStatus.FAILED, final_text=None, result_text=reason,
                is_error=True, error_code="internal_error", error_reason=reason, usage=ctx.usage(),
            )
    return job.status


def drive(ctx: TurnContext) -> str:
    """Call the model until it answers; run the tools it asks for in between."""
    provider = get_provider(ctx.spec)
    limit = settings.TRELLIS_MAX_TOOL_CALLS
    ctx._last_check = time.monotonic()  # the claim just renewed the lease and saw "running"
    max_calls, _ = ctx.policy
    while True:
        ctx.check_stop(force=ctx.model_calls > 0)
        drain(ctx)
        if max_calls and ctx.model_calls >= max_calls:
            raise LimitExceeded("max_model_calls", f"the turn used its {max_calls} model calls without a final answer")
        response = provider.complete(ctx)
        ctx.flush_delta()
        ctx.model_calls += 1
        ctx.tokens_in += response.tokens_in
        ctx.tokens_out += response.tokens_out
        ctx.cost += Decimal(str(getattr(response, "cost", 0) or 0))
        ctx.progressed()
        limit_tokens = effective_limit(ctx.project, "max_tokens_per_job")
        if limit_tokens and ctx.tokens_in + ctx.tokens_out > limit_tokens:
            raise LimitExceeded("quota.tokens_exhausted", f"the turn used more than {limit_tokens} tokens (max_tokens_per_job)")
        limit_cost = effective_limit(ctx.project, "max_cost_per_job")
        if limit_cost and ctx.cost > limit_cost:
            raise LimitExceeded("quota.cost_exhausted", f"the turn cost more than ${limit_cost} (max_cost_per_job)")
        if not response.tool_calls:
            ctx.check_stop(force=True)  # a cancel that came during the last model call wins
            return response.text
        if ctx.tool_calls + len(response.tool_calls) > limit:
            raise ToolCallLimit(f"the turn reached its limit of {limit} tool calls")
        run_tool_step(ctx, response)


def drain(ctx: TurnContext) -> None:
    """Before every model call, after all tool results: results owed to this branch join the turn."""
    reconciling = ctx.model_calls == 0 and ctx.job.kind == JobKind.USER
    for message in drain_mailbox(ctx.branch, ctx.job, reconciling=reconciling):
        ctx.mailbox_text += (("\n\n" if ctx.mailbox_text else "") + message.text)


CANCELLED_RESULT = "cancelled: the execution was cancelled before this tool call ran"
INTERRUPTED_RESULT = "cancelled: the execution was cancelled while this tool call ran; it may have partly taken effect"


def run_tool_step(ctx: TurnContext, response) -> None:
    """Write the model's tool-call node, then run its calls one by one, each result written as
    it comes. Before each call the turn checks it may go on (SPEC §7: cancel is a fence): once
    it is asked to stop, no further call runs, and every call left gets a "cancelled" result, so
    each tool call in the transcript has its result (what providers require of a history)."""
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls]
    write_turn_node(ctx, role=MessageRole.ASSISTANT, text=response.text, tool_calls=calls, metadata={"job": ctx.job.pk})
    tool_ctx = Actor(user=ctx.job.started_by, session=ctx.job.session, branch=ctx.branch, job=ctx.job, turn=ctx)
    first = None
    for n, call in enumerate(response.tool_calls):
        started = False
        try:
            ctx.check_stop(force=True)
            started = True
            result = run_tool(tool_ctx, call.name, call.arguments, tools=ctx.tools)
        except (TurnStopped, LimitExceeded) as exc:  # this call and the rest are answered, not run
            write_skipped_results(ctx, response.tool_calls[n:], exc, interrupted=started)
            raise
        ctx.tool_calls += 1
        ctx.progressed()
        first = first or result
        write_tool_result(ctx, call, result.text, {"tool": call.name, "details": result.details,
                                                   "is_error": result.is_error})
    ctx.last_result = first
    ctx.check_doom_loop(response.tool_calls)


def write_tool_result(ctx: TurnContext, call, text: str, metadata: dict) -> None:
    write_turn_node(ctx, role=MessageRole.TOOL, text=text, tool_call_id=call.id, metadata=metadata)


@retry_on_deadlock
def write_turn_node(ctx: TurnContext, **fields) -> None:
    """One node of the running turn at its branch's tip, in its own transaction; the in-memory
    tip moves only if it commits, so a retry (or the next node) never hangs off a rolled-back one."""
    with transaction.atomic(), kept_on_rollback(ctx.branch):
        append_message(ctx.branch, job=ctx.job, **fields)


def write_skipped_results(ctx: TurnContext, calls, why: Exception, *, interrupted: bool = False) -> None:
    """The tool calls of a step that were not run (or not finished) because the turn was
    cancelled or hit a limit: each gets a result saying so. With ``interrupted`` the first
    call had started when the stop came: its result says it may have partly taken effect,
    not that it never ran."""
    cancelled = isinstance(why, TurnStopped)
    text = CANCELLED_RESULT if cancelled else f"not run: {why.reason} ({why.code})"
    for n, call in enumerate(calls):
        if n == 0 and interrupted:
            said = INTERRUPTED_RESULT if cancelled else f"stopped while running: {why.reason} ({why.code}); it may have partly taken effect"
        else:
            said = text
        write_tool_result(ctx, call, said, {"tool": call.name, "details": {}, "is_error": True,
                                            "cancelled": cancelled})
