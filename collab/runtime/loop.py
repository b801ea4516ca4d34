"""The turn loop (docs/contract.md#concepts): model call → tool calls → tool results → next call.

``run_job`` is what a worker runs for one job. It claims the job (or returns if
it lost the claim), drives the provider until a final answer, the tool-call cap,
a stop request or an error, and ends the job in one completion transaction.

The loop only sequences; each concern has its module: what the turn may
spend (``policy``), what the model is told (``prompts``), streamed text (``streaming``) and how a
turn that does not answer ends (``failures``, one path for every kind of failure).

A worker process runs many turns at once, each on a slot thread (``slots``; ``hand_to_slot`` is
the worker task's part). While a turn waits — on a model call, a ``sleep_ms``, a blocking tool —
it holds no database connection: it gives it back to the pool before it waits
(``idle_connection``). It learns of a stop request from the process's stop watch
(``collab.services.liveness``) instead of asking the database, and a model call in flight when
the stop comes is aborted.
"""

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import close_old_connections, transaction

from collab.infra import tracing
from collab.models import Job, JobKind, JobStatus, Message, MessageRole, PersonAsk
from collab.runtime import prompts
from collab.runtime.failures import (
    LimitExceeded,
    TurnStopped,
    archived_before_start,
    end_failed,
    failure_of,
    unstorable_answer,
)
from collab.runtime.policy import DoomLoop, TurnPolicy, enforce_clock, enforce_spend, policy_for
from collab.runtime.providers import get_provider
from collab.runtime.slots import SLOT_WAIT_SECONDS, process_slots
from collab.runtime.streaming import DeltaBatcher
from collab.services.acting import Actor
from collab.services.budgets import DELEGATION_TOOLS, messages_left
from collab.services.execution import claim_for_slot, claim_job, current_status, finish_job
from collab.services.followup import drain_mailbox
from collab.services.admission import enqueue_job
from collab.services.asks import Paused, ask_kind_for, call_result, pause_for_person
from collab.services.liveness import StopSignal, running
from collab.services.locking import kept_on_rollback, refresh_from_row
from collab.services.messages import append_message
from collab.services.retry import retry_on_deadlock
from collab.services.waiting import idle_connection
from collab.runtime.providers.base import ToolCall
from collab.tools.people import question_of
from collab.tools.registry import ToolResult, run_tool
from collab.tools.surface import agent_role_of, branch_tools, spec_toolset

log = logging.getLogger(__name__)

STOP_CHECK_SECONDS = 0.2


@dataclass
class TurnContext:
    """One running turn: what providers read (the job, its branch and spec, the prompt, the
    history, the tools) and what it has spent so far."""

    job: Any
    branch: Any
    spec: Any
    inline_parents: tuple = ()  # the jobs waiting on this one in this worker (foreground ``agent`` calls)
    stop_signal: StopSignal | None = None  # set by this process's stop watch (None: ask the database)
    provider_state: dict = field(default_factory=dict)
    mailbox_text: str = ""
    last_result: ToolResult | None = None
    model_calls: int = 0
    tool_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    _tools: list | None = None
    _policy: TurnPolicy | None = None
    _doom_loop: DoomLoop | None = None
    _stream: DeltaBatcher | None = None
    _last_check: float = 0.0
    _started: float = field(default_factory=time.monotonic)
    _last_progress: float = field(default_factory=time.monotonic)

    @property
    def project(self):
        return self.job.project

    @property
    def prompt(self) -> str:
        return self.job.prompt_text  # the job row's, or its prompt node's once written

    @property
    def address(self) -> str | None:
        return self.branch.address

    @property
    def toolset(self) -> str:
        return spec_toolset(self.spec)  # the job's spec: the one it was admitted with

    @property
    def role(self) -> str:
        return agent_role_of(self.branch)

    @property
    def policy(self) -> TurnPolicy:
        if self._policy is None:
            self._policy = policy_for(self.role, self.toolset, self.spec)
        return self._policy

    @property
    def doom_loop(self) -> DoomLoop:
        if self._doom_loop is None:
            self._doom_loop = DoomLoop(self.policy.doom_loop_threshold)
        return self._doom_loop

    @property
    def system_prompt(self) -> str:
        return prompts.system_prompt(self.spec, role=self.role, toolset=self.toolset, tools=self.tools,
                                     project=self.project)

    def history(self) -> list[Message]:
        return prompts.history(self.spec, self.branch.tip)

    @property
    def tools(self):
        """The turn's tool surface, by the spec it runs with: offered and dispatched (collab.tools.surface)."""
        if self._tools is None:
            self._tools = branch_tools(self.branch, self.spec)
        return self._tools

    def available_tools(self):
        """The tools offered to the model this turn: the toolset narrowed by the spec's
        allow-list, without delegation tools once the chain's message budget is spent."""
        tools = self.tools
        if not messages_left(self.project, self.job.chain_messages):
            tools = [t for t in tools if t.name not in DELEGATION_TOOLS]
        return tools

    def count_wait(self, delivered: bool) -> None:
        """wait_agent's timeout streak: a delivery resets it."""
        self.doom_loop.count_wait(delivered)

    def check_stop(self, force: bool = False) -> None:
        """Raise ``TurnStopped`` once the job is asked to stop, ``LimitExceeded`` past the
        project's clock limits. Unless ``force`` (the fence before a tool call: the database's
        answer now), the stop watch's signal answers, which is at most ``STOP_CHECK_SECONDS``
        old; a turn without one asks the database at most that often."""
        signal = self.stop_signal
        if not force and signal is not None and signal.is_set():
            raise TurnStopped(signal.status)
        now = time.monotonic()
        if not force and now - self._last_check < STOP_CHECK_SECONDS:
            return
        self._last_check = now
        if force or signal is None or signal.unseen:
            status = current_status(self.job)
            if status != JobStatus.RUNNING:
                raise TurnStopped(status)
        self.check_clock()

    def aborting(self, abort):
        """A block during which a stop request calls ``abort()`` (a model call's sockets' shutdown)
        from the stop watch's thread, so a call in flight ends within a beat."""
        return self.stop_signal.aborting(abort) if self.stop_signal is not None else nullcontext()

    def raise_if_stopped(self) -> None:
        """After a call failed: ``TurnStopped`` if a stop request aborted it (not a failure to
        retry or report)."""
        if self.stop_signal is not None and self.stop_signal.is_set():
            raise TurnStopped(self.stop_signal.status)

    def check_clock(self) -> None:
        """Raise ``LimitExceeded`` past the project's clock limits (no query)."""
        now = time.monotonic()
        enforce_clock(self.project, running_for=now - self._started, idle_for=now - self._last_progress)

    def progressed(self) -> None:
        self._last_progress = time.monotonic()

    def run_foreground(self, job) -> None:
        """Run the foreground child ``job`` this turn's ``agent`` call admitted, inline, in this
        turn's slot (``run_foreground``): the tool asks its turn, it never imports the loop."""
        run_foreground(job, self)

    def on_text_delta(self, text: str) -> None:
        """A streaming provider's text fragment (batched into ``message.delta`` events)."""
        self.stream.add(text, self.model_calls)

    def flush_delta(self) -> None:
        self.stream.flush(self.model_calls)

    @property
    def stream(self) -> DeltaBatcher:
        if self._stream is None:
            self._stream = DeltaBatcher(self.job.session_id, self.job.pk, self.branch.pk)
        return self._stream

    def sleep(self, seconds: float) -> None:
        """Wait like a slow model would, holding no database connection, woken by a stop
        request at once (the stop watch's signal; without one, noticed within ~0.2 s)."""
        deadline = time.monotonic() + seconds
        idle_connection()
        while True:
            self.check_stop()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.stop_signal is not None:
                self.stop_signal.wait(min(left, 1.0))  # and the clock limits every second
            else:
                time.sleep(min(left, STOP_CHECK_SECONDS))

    def resume_usage(self) -> None:
        """A resumed turn (it waited for a person) counts on from what it had spent, as its job
        row keeps it (``collab.services.asks.pause_for_person``)."""
        job = self.job
        self.model_calls, self.tool_calls = job.model_calls, job.tool_calls
        self.tokens_in, self.tokens_out, self.cost = job.tokens_in, job.tokens_out, Decimal(job.cost or 0)

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
    return run_claimed(job, tuple(inline_parents))


def run_claimed(job, inline_parents: tuple[str, ...] = ()) -> str:
    """Run a job this process claimed to its end, its lease renewed and its stop requests
    watched by the process meanwhile (collab/services/liveness.py)."""
    with running(job.pk) as signal:
        return _run_claimed(job, inline_parents, signal)


def hand_to_slot(job_id: str) -> str | None:
    """The worker task's part of a turn (``collab.tasks.run_turn``): take a slot of this process
    (waiting while all are in use), claim the job — or, while this process's slots are contended,
    the fairest queued job (``execution.claim_for_slot``) — and start its turn on the slot's thread.
    Returns at once after that: ``"started"``; None if the claim won nothing (another worker has
    the job, it is no longer queued, or it waits for its branch or its project's cap); or
    ``"requeued"`` when no slot came free in ``SLOT_WAIT_SECONDS`` — the job, untouched and still
    queued, is handed to the broker again, and another process (or this one, later) takes it."""
    slots = process_slots()
    if not slots.take(timeout=SLOT_WAIT_SECONDS):
        enqueue_job(job_id)
        return "requeued"
    try:
        job = claim_for_slot(job_id, contended=slots.contended())
    except BaseException:
        slots.give_back()
        raise
    if job is None:
        slots.give_back()
        return None
    slots.start(job.pk, lambda: run_claimed(job), after=close_old_connections)
    return "started"


def run_foreground(job, caller: TurnContext | None) -> None:
    """Run a foreground ``agent`` call's child job (admitted by ``do_spawn``, not enqueued) inline,
    in the caller's worker, and refresh ``job`` with how it ended. ``caller`` is the calling turn
    (None for a gateway call); it and the jobs waiting on it are the child's inline parents, whose
    leases this process renews."""
    parents = () if caller is None else (caller.job.pk, *caller.inline_parents)
    run_job(job.pk, inline_parents=parents, inline=True)
    ended = Job.objects.with_result().get(pk=job.pk)  # job.refresh_from_db(), its result read with it
    refresh_from_row(job, ended)
    job.final_answer = ended.final_answer


def _run_claimed(job, inline_parents: tuple[str, ...], signal: StopSignal | None = None) -> str:
    turn = TurnContext(job=job, branch=job.branch, spec=job.agent_spec, inline_parents=inline_parents,
                       stop_signal=signal)
    spent_before = {name: getattr(job, name) for name in RUN_USAGE}  # a resumed turn's, as claimed
    with traced_run(turn) as span:
        status = _run_turn(turn)
        span.ended(status=status, error_code=job.error_code,
                   **{name: max(getattr(turn, name) - spent_before[name], 0) for name in RUN_USAGE})
    return status


RUN_USAGE = ("tokens_in", "tokens_out", "model_calls", "tool_calls")  # what one run's span counts: its own spending


def traced_run(turn: TurnContext):
    """This run's ``invoke_agent`` span (docs/operations.md#traces), under the span that admitted
    the job (its ``trace_context``); a no-op while tracing is off."""
    job, spec = turn.job, turn.spec
    return tracing.invoke_agent(
        carried=job.trace_context, person_turn=job.kind == JobKind.USER, execution_id=job.pk, kind=job.kind,
        agent_name=turn.branch.display_name, branch_id=turn.branch.pk, session_id=job.session_id,
        spec_agent_id=getattr(spec, "agent_id", ""), provider=getattr(spec, "provider", ""),
        model=getattr(spec, "model", ""))


def _run_turn(turn: TurnContext) -> str:
    """The run's part between its claim and its end: the turn driven to its answer and the job
    ended (``finish_job``), or ended failed; or paused for a person. Returns how it ended."""
    job = turn.job
    if job.branch.archived:
        end_failed(job, archived_before_start(job))
        return JobStatus.FAILED
    try:
        text = drive(turn)
    except Paused:  # waits for a person: the job is ``waiting``; a decision queues it again
        return JobStatus.WAITING
    except Exception as exc:
        end_failed(job, failure_of(exc, job.pk), usage=turn.usage())
        return job.status
    try:
        finish_job(job, status=JobStatus.SUCCEEDED, final_text=text, result_text=text, usage=turn.usage())
    except Exception as exc:
        end_failed(job, unstorable_answer(exc, job.pk), usage=turn.usage())
    return job.status


def drive(turn: TurnContext) -> str:
    """Call the model until it answers; run the tools it asks for in between."""
    provider = get_provider(turn.spec)
    turn._last_check = time.monotonic()  # the claim just renewed the lease and saw "running"
    if turn.job.model_calls:  # a turn that waited for a person: it goes on where it stopped
        turn.resume_usage()
        resume_paused_step(turn)
    while True:
        turn.check_stop(force=turn.model_calls > 0)
        drain(turn)
        turn.policy.enforce_model_calls(turn.model_calls)
        idle_connection()  # the model's time is not the database's: the connection goes back to the pool
        with tracing.chat(provider=getattr(turn.spec, "provider", ""), model=getattr(turn.spec, "model", ""),
                          execution_id=turn.job.pk, session_id=turn.job.session_id) as call:
            response = provider.complete(turn)
            call.answered(tokens_in=response.tokens_in, tokens_out=response.tokens_out,
                          tool_calls=bool(response.tool_calls))
        turn.flush_delta()
        turn.model_calls += 1
        turn.tokens_in += response.tokens_in
        turn.tokens_out += response.tokens_out
        turn.cost += Decimal(str(getattr(response, "cost", 0) or 0))
        turn.progressed()
        enforce_spend(turn.project, tokens=turn.tokens_in + turn.tokens_out, cost=turn.cost)
        if not response.tool_calls:
            # a cancel that came during the last model call wins, without a read here: the
            # completion reads the job under its row lock and ends a ``stopping`` job
            # ``cancelled`` with the answer not kept (``finish_job``) — the end ``TurnStopped``
            # would give it — and leaves alone a job someone else ended
            turn.check_clock()
            return response.text
        turn.policy.enforce_tool_calls(turn.tool_calls, len(response.tool_calls))
        run_tool_step(turn, response)


def drain(turn: TurnContext) -> None:
    """Before every model call, after all tool results: results owed to this branch join the turn."""
    reconciling = turn.model_calls == 0 and turn.job.kind == JobKind.USER
    # the first drain follows the claim at once: what the claim's UPDATE read is the answer (a
    # result owed after it waits for the next drain, or the completion's delivery, as one owed
    # after a lookup here would)
    owed = getattr(turn.job, "results_owed", None) if turn.model_calls == 0 else None
    for message in drain_mailbox(turn.branch, turn.job, reconciling=reconciling, owed=owed):
        turn.mailbox_text += (("\n\n" if turn.mailbox_text else "") + message.text)


CANCELLED_RESULT = "cancelled: the execution was cancelled before this tool call ran"
INTERRUPTED_RESULT = "cancelled: the execution was cancelled while this tool call ran; it may have partly taken effect"


def run_tool_step(turn: TurnContext, response) -> None:
    """Write the model's tool-call node, then run its calls one by one, each result written as
    it comes. Before each call the turn checks it may go on (docs/contract.md#the-cancel-fence): once
    it is asked to stop, no further call runs, and every call left gets a "cancelled" result, so
    each tool call in the transcript has its result (what providers require of a history).
    A call that waits for a person pauses the turn there (``run_calls``)."""
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls]
    write_turn_node(turn, role=MessageRole.ASSISTANT, text=response.text, tool_calls=calls)
    run_calls(turn, turn.branch.tip, list(response.tool_calls))


def run_calls(turn: TurnContext, node, calls: list, start: int = 0, decided: PersonAsk | None = None) -> None:
    """Run ``calls[start:]`` of the tool-call node ``node``, each result written as it comes.
    A call of a tool the spec's or the project's ``approvals`` name, or an ``ask_person``, pauses the turn
    (``Paused``) with an ask for a person (``collab.services.asks``), unless ``decided`` is that
    call's decided ask (a resumed turn): then it runs (approved, with the arguments as
    approved), or its result is the rejection or the answer."""
    actor = Actor(user=turn.job.started_by, session=turn.job.session, branch=turn.branch, job=turn.job, turn=turn)
    first = None
    for n in range(start, len(calls)):
        call = calls[n]
        started = False
        try:
            turn.check_stop(force=True)
            kind = ask_kind_for(turn.spec, call.name, turn.project)
            ask = decided if decided is not None and decided.tool_call_id == call.id else None
            result = pause(turn, node, n, call, kind) if kind is not None and ask is None else None
            said = call_result(ask) if ask is not None else None
            if result is not None:  # an ask_person that cannot be asked: its error is the result
                pass
            elif said is not None:  # rejected, expired or answered: nothing runs
                result = ToolResult(text=said, details={"ask": ask.pk, "decision": ask.status},
                                    is_error=ask.status != "answered")
            else:
                started = True
                arguments = ask.decision.get("arguments", call.arguments) if ask is not None else call.arguments
                with tracing.execute_tool(name=call.name, call_id=call.id, execution_id=turn.job.pk,
                                          session_id=turn.job.session_id) as span:
                    result = run_tool(actor, call.name, arguments, tools=turn.tools)
                    span.returned(is_error=result.is_error, code=str((result.details or {}).get("code") or ""))
        except (TurnStopped, LimitExceeded) as exc:  # this call and the rest are answered, not run
            write_skipped_results(turn, calls[n:], exc, interrupted=started)
            raise
        turn.tool_calls += 1
        turn.progressed()
        first = first or result
        write_tool_result(turn, call, result.text, {"tool": call.name, "details": result.details,
                                                    "is_error": result.is_error})
    turn.last_result = first
    turn.doom_loop.enforce(calls)


def resume_paused_step(turn: TurnContext) -> None:
    """A turn queued again after a person's decision: the tool step it stopped in goes on from
    the call it waited on (decided now), then the turn goes on as any. Nothing is run twice: a
    call whose result is written is past."""
    ask = (PersonAsk.objects.filter(job_id=turn.job.pk).exclude(status="pending")
           .select_related("call_message").order_by("-created_at", "-pk").first())
    if ask is None or Message.objects.filter(job_id=turn.job.pk, branch_id=turn.branch.pk, role=MessageRole.TOOL,
                                             tool_call_id=ask.tool_call_id).exists():
        return
    turn.provider_state = dict(ask.provider_state or {})
    calls = [ToolCall(id=str(c.get("id")), name=str(c.get("name")), arguments=c.get("arguments") or {})
             for c in (ask.call_message.tool_calls or []) if isinstance(c, dict)]
    run_calls(turn, ask.call_message, calls, start=ask.call_index, decided=ask)


def pause(turn: TurnContext, node, index: int, call, kind: str) -> ToolResult:
    """The turn waits for a person about ``call``: ``Paused`` once its job is ``waiting``, or
    ``TurnStopped`` when a cancel came first. An ``ask_person`` whose arguments or addressee
    are wrong is no pause: its error is returned, the call's result."""
    question, choices, to_user = "", (), None
    if kind == "question":
        asked = question_of(turn.job, call.arguments)
        if isinstance(asked, ToolResult):
            return asked
        question, choices, to_user = asked
    ask = pause_for_person(turn.job, node=node, index=index, call=call, kind=kind, spec=turn.spec,
                           usage=turn.usage(), provider_state=turn.provider_state, question=question, choices=choices, to_user=to_user)
    if ask is None:
        raise TurnStopped(current_status(turn.job))
    raise Paused(ask)


def write_tool_result(turn: TurnContext, call, text: str, metadata: dict) -> None:
    write_turn_node(turn, role=MessageRole.TOOL, text=text, tool_call_id=call.id, metadata=metadata)


@retry_on_deadlock
def write_turn_node(turn: TurnContext, **fields) -> None:
    """One node of the running turn at its branch's tip, in its own transaction; the in-memory
    tip moves only if it commits, so a retry (or the next node) never hangs off a rolled-back one."""
    with transaction.atomic(), kept_on_rollback(turn.branch):
        append_message(turn.branch, job=turn.job, **fields)


def write_skipped_results(turn: TurnContext, calls, why: Exception, *, interrupted: bool = False) -> None:
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
        write_tool_result(turn, call, said, {"tool": call.name, "details": {}, "is_error": True,
                                             "cancelled": cancelled})
