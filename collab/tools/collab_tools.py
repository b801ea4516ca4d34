"""The ``collab`` toolset (docs/contract.md#the-collab-toolset): thin adapters over services and selectors.

Every handler takes the acting context (principal, branch, running job) and
returns text for the model plus structured ``details``. Domain errors become
``<code>: <reason>`` results in the registry; the calling turn goes on.
"""

from typing import Literal

from pydantic import Field

from collab.access import access_branch, access_owned_job, access_session, require_can_archive
from collab.errors import Invalid, NotFound
from collab.models import TERMINAL_STATUSES, HeldDelivery, Job, Todo, format_address
from collab.selectors.agents import list_agents as select_agents
from collab.selectors.agents import render_agents
from collab.selectors.jobs import ended_job, jobs_dispatched_by
from collab.selectors.pages import shown_branch
from collab.selectors.shapes import job_summary
from collab.selectors.transcript import DEFAULT_MAX_CHARS, MAX_MAX_CHARS, MIN_MAX_CHARS, render_transcript
from collab.services.archive import do_archive_branch
from collab.services.deliver import do_delegate, do_send_message
from collab.services.results import result_limit_for
from collab.text import bound_text
from collab.services.spawn import do_spawn
from collab.services.todos import do_create_todo, do_update_todo
from collab.realtime.bounds import JOB_OUTPUT_DEFAULT_MS, JOB_OUTPUT_MAX_MS
from collab.realtime.changes import wait_for_change
from collab.services.listing import do_record_agents_listed
from collab.tools.registry import Awaits, ToolParams, ToolResult, reading_spec, register

COLLAB = ("collab",)
BOTH = ("collab", "openwork")  # the plan tools: OpenWork roots have them too, explorers never


def _job_line(job: Job) -> str:
    where = job.branch.display_name
    return f"{job.pk} {job.kind} on {where!r}: {job.status}" + (f" ({job.error_code})" if job.is_error else "")


def _held(hold) -> ToolResult:
    return ToolResult(
        text=(f"held for confirmation: this project's watch policy holds deliveries until a member approves "
              f"them (hold {hold.pk}); you will get the result or the rejection."),
        details={"held": True, "hold_id": hold.pk, "execution_id": None, "delivery_id": None},
    )


# --- entities: agent, list_agents, archive_agent ------------------------------------------


class AgentParams(ToolParams):
    prompt: str = Field(min_length=1, description="the task or question for the agent")
    description: str = Field(default="", description="a short name for the new agent (its branch)")
    agent_id: str = Field(default="", description="the project's agent spec the new agent runs; empty: yours")
    start_from: str = Field(default="clean", description=(
        '"clean" (a new conversation), "inherit" (a fork of yours, here) or "SID:MSG" (a fork at that message)'))
    run_in_background: bool = Field(default=False, description="answer at once; the result comes back by itself")
    to: str = Field(default="", description='an existing agent ("SID:HEAD" or a name) to give the task to instead')
    archive_when_done: bool = Field(default=False, description="archive the new agent when its turn ends")


@register("agent", toolsets=COLLAB, params=AgentParams, example={
    "prompt": "List the open questions in the design notes, one line each.", "description": "researcher",
    "agent_id": "researcher", "run_in_background": True}, description="""
Create a new agent (a branch) and run `prompt` on it, or give an existing agent a task.
Without `to`: `start_from` is "clean" (new conversation), "inherit" (fork here) or "SID:MSG"
(fork at that node); `description` names the branch. Foreground (default) waits and returns the
final reply; `run_in_background=true` returns an execution_id at once and the result comes back
to you automatically. With `to` ("SID:HEAD" or a name): a task on that existing agent, queued if
it is busy; its final reply returns to you automatically. `start_from` and `archive_when_done`
only apply when creating.""")
def agent(ctx, p: AgentParams) -> ToolResult:
    if p.to.strip():
        if p.start_from.strip() not in ("", "clean"):
            raise Invalid("start_from cannot be combined with to: to addresses an existing agent", code="invalid_arguments")
        if p.archive_when_done:
            raise Invalid("archive_when_done only applies when creating an agent, not with to", code="invalid_arguments")
        job = do_delegate(ctx, to=p.to, prompt=p.prompt)
        if isinstance(job, HeldDelivery):
            return _held(job)
        state = "queued behind its current turn" if job.prompt_msg_id is None else "started"
        return ToolResult(
            text=f"task {job.pk} delivered to {job.branch.display_name!r} ({state}); its final reply will come back to you automatically.",
            details={"execution_id": job.pk, "status": job.status, "to": job.branch.address or p.to, "queued": job.prompt_msg_id is None},
        )
    job = do_spawn(
        ctx, prompt=p.prompt, description=p.description, agent_id=p.agent_id, start_from=p.start_from,
        run_in_background=p.run_in_background, archive_when_done=p.archive_when_done,
    )
    branch = job.branch
    if p.run_in_background:
        return ToolResult(
            text=f"started agent {branch.display_name!r} in the background: execution {job.pk}; its result will come back to you automatically.",
            details={"execution_id": job.pk, "status": job.status, "name": branch.display_name,
                     "address": format_address(branch.session_id, job.prompt_msg_id), "session_id": branch.session_id},
        )
    if job.answers_call:  # from outside a turn: a worker runs it, the call waits (collab.gateway)
        return ToolResult(
            text=f"agent {branch.display_name!r} is still running: execution {job.pk}; read its result with job_output.",
            details={"execution_id": job.pk, "status": job.status, "name": branch.display_name,
                     "address": format_address(branch.session_id, job.prompt_msg_id), "session_id": branch.session_id,
                     "still_running": True},
            awaits=Awaits(job.pk, branch.session_id, lambda: foreground_answer(ctx, ended_job(job.pk))),
        )
    ctx.turn.run_foreground(job)  # the calling turn runs it in its own slot (collab.runtime.loop)
    return foreground_answer(ctx, job)


def foreground_answer(ctx, job) -> ToolResult:
    """A foreground ``agent`` call's answer: the ended child's final reply (or how it failed)."""
    branch = job.branch
    branch.refresh_from_db()
    if job.status == "waiting":  # it waits for a person: now a background child (collab.services.asks)
        return ToolResult(
            text=(f"agent {branch.display_name!r} is waiting for a person's decision: execution {job.pk}; "
                  "its result will come back to you automatically."),
            details={"execution_id": job.pk, "status": job.status, "name": branch.display_name,
                     "address": branch.address, "session_id": branch.session_id, "waiting_for_person": True})
    summary, truncated = bound_text(job.result, result_limit_for(reading_spec(ctx)))
    return ToolResult(
        text=summary if job.status == "succeeded" else f"agent {branch.display_name!r} {job.status}: {job.error_reason or summary}",
        details={"execution_id": job.pk, "status": job.status, "is_error": job.is_error, "error_code": job.error_code,
                 "name": branch.display_name, "address": branch.address, "session_id": branch.session_id,
                 "truncated": truncated},
        is_error=job.is_error,
    )


class ListAgentsParams(ToolParams):
    scope: Literal["session", "all", "archived"] = Field(default="session", description=(
        '"session": this session\'s agents; "all": every session you may see; "archived": this session\'s archived ones'))
    limit: int = Field(default=20, ge=1, le=200, description="how many to list at most")
    agent_id: str | None = Field(default=None, description="only agents running this agent spec")
    source: str | None = Field(default=None, description='with scope "all": only this session id')


@register("list_agents", toolsets=COLLAB, params=ListAgentsParams, example={"scope": "session"}, description="""
List the agents (branches) you can address, grouped by session, each with a ready-to-use
to="SID:HEAD", its size (turns, chars) and a tail preview. scope: "session" (this session),
"all" (every session you may see, most recently active first, no previews), "archived".""")
def list_agents(ctx, p: ListAgentsParams) -> ToolResult:
    listing = select_agents(ctx.user, ctx.session, scope=p.scope, limit=p.limit, agent_id=p.agent_id, source=p.source)
    text, details = render_agents(listing)
    do_record_agents_listed(ctx.session.pk, user=ctx.user, by=ctx.address, scope=p.scope,
                            session_ids=[d["session_id"] for d in details["sessions"]])
    return ToolResult(text=text, details=details)


class ArchiveParams(ToolParams):
    to: str = Field(min_length=1, description='the agent to archive ("SID:HEAD" or a name)')
    reason: str = Field(default="", description="why, shown with the archived agent")


@register("archive_agent", toolsets=COLLAB, params=ArchiveParams,
          example={"to": "researcher", "reason": "its findings are in the summary"}, description="""
Archive an existing agent: it stops receiving deliveries and leaves the normal listings; its
history stays readable and forkable, and a turn it is running is not cancelled. Idempotent.""")
def archive_agent(ctx, p: ArchiveParams) -> ToolResult:
    branch = access_branch(ctx.user, p.to, caller=ctx.caller)
    require_can_archive(ctx.user, branch)
    branch = do_archive_branch(branch, user=ctx.user, reason=p.reason)
    return ToolResult(
        text=f"archived {branch.display_name!r} ({branch.address}) at {branch.archived_at.isoformat()}",
        details={"address": branch.address, "archived": True, "archived_at": branch.archived_at.isoformat(),
                 "reason": branch.archive_reason},
    )


# --- communication: send_message, read_conversation --------------------------------------


class SendMessageParams(ToolParams):
    message: str = Field(min_length=1, description="the text to send")
    to: str = Field(min_length=1, description='the recipient, an existing agent ("SID:HEAD" or a name)')
    agent_id: str = Field(default="main", description=(
        'the recipient\'s own saved configuration: leave it as "main"; any other value must be the '
        "recipient's agent_id (a message never changes who answers or how)"))


@register("send_message", toolsets=COLLAB, params=SendMessageParams,
          example={"to": "critic", "message": "The draft is updated; have another look when you are free."},
          description="""
Send a plain message to an existing agent ("SID:HEAD" or a name). It runs a turn now if the agent
is idle, or after its current turn if busy. No result comes back automatically; the recipient
may reply with send_message.""")
def send_message(ctx, p: SendMessageParams) -> ToolResult:
    receipt = do_send_message(ctx, to=p.to, message=p.message, agent_id=p.agent_id)
    if receipt.hold is not None:
        return _held(receipt.hold)
    target = receipt.target
    if receipt.delivered:
        return ToolResult(
            text=f"delivered to {target.display_name!r}; it is running a turn on it now (delivery {receipt.job.pk}).",
            details={"delivery_id": receipt.job.pk, "queued": False, "to": target.address},
        )
    text = (f"{target.display_name!r} is busy: your message is queued and will be processed after its current turn "
            f"(inbox entry {receipt.inbox_entry.pk}).")
    if receipt.dropped:
        text += " Its inbox was full, so its oldest queued message was dropped."
    return ToolResult(text=text, details={"delivery_id": None, "queued": True, "inbox_entry": receipt.inbox_entry.pk,
                                          "to": target.address})


class ReadConversationParams(ToolParams):
    session_id: str = Field(min_length=1, description='the agent ("SID:HEAD" or a name) or a session id')
    start_turn: int = Field(default=0, description="the first turn to read, from 0; negative counts from the end")
    end_turn: int | None = Field(default=None, description="the turn to stop before; negative counts from the end")
    include_function_calls: bool = Field(default=True, description="show tool calls and their results")
    max_chars: int = Field(default=DEFAULT_MAX_CHARS, ge=MIN_MAX_CHARS, le=MAX_MAX_CHARS,
                           description="later turns past this many characters are left out")


@register("read_conversation", toolsets=COLLAB, params=ReadConversationParams,
          example={"session_id": "researcher", "start_turn": -5}, description="""
Read an agent's conversation ("SID:HEAD", a name, or a session id) as a transcript without
running it. Turns count from 0; negative start_turn/end_turn count from the end (start_turn=-10:
the last ten turns). Later turns beyond max_chars are dropped. Archived agents are readable.""")
def read_conversation(ctx, p: ReadConversationParams) -> ToolResult:
    branch = read_target(ctx, p.session_id)
    rendered = render_transcript(
        branch, viewer=ctx.caller.user, start_turn=p.start_turn, end_turn=p.end_turn,
        include_function_calls=p.include_function_calls, max_chars=p.max_chars,
    )
    text = rendered.pop("text")
    return ToolResult(text=text, details=rendered)


def read_target(ctx, ref: str):
    """A branch to read: an address or name (``access_branch``), or a whole session id (its
    selected branch, ``access_session``), found only where the agent may look (its project)."""
    if ":" not in ref:
        try:
            session = access_session(ctx.user, ref, project_id=ctx.session.project_id)
        except NotFound:
            session = None  # not a session it may see: perhaps a branch name
        if session is not None:
            branch = shown_branch(session)
            if branch is None:
                raise NotFound()
            return branch
    return access_branch(ctx.user, ref, caller=ctx.caller)


# --- plan: todo_* --------------------------------------------------------------------------


def _todo_details(todo: Todo) -> dict:
    return {"todo_id": todo.pk, "subject": todo.subject, "status": todo.status,
            "blocked_by": sorted(todo.blocked_by.values_list("pk", flat=True))}


class TodoCreateParams(ToolParams):
    subject: str = Field(min_length=1, description="the plan item, in a line")
    description: str = Field(default="", description="more detail")
    blocked_by: list[int] = Field(default_factory=list, description="ids of the items that must be done first")


@register("todo_create", toolsets=BOTH, params=TodoCreateParams,
          example={"subject": "Summarise the review", "blocked_by": [1]}, description="""
Write a plan item for this session. It records intent only; nothing starts running.""")
def todo_create(ctx, p: TodoCreateParams) -> ToolResult:
    todo = do_create_todo(ctx.session, ctx.branch, subject=p.subject, description=p.description, blocked_by=p.blocked_by, user=ctx.user)
    return ToolResult(text=f"todo {todo.pk} created: {todo.subject}", details=_todo_details(todo))


class TodoUpdateParams(ToolParams):
    todo_id: int = Field(description="the item to change")
    status: Literal["pending", "in_progress", "completed"] | None = Field(default=None, description="its new status")
    subject: str | None = Field(default=None, description="its new subject")
    description: str | None = Field(default=None, description="its new description")
    blocked_by: list[int] | None = Field(default=None, description="its new blockers (replacing the old ones)")


@register("todo_update", toolsets=BOTH, params=TodoUpdateParams, example={"todo_id": 1, "status": "completed"},
          description="""
Update a plan item: status ("pending", "in_progress", "completed"), subject, description, blocked_by.""")
def todo_update(ctx, p: TodoUpdateParams) -> ToolResult:
    todo = do_update_todo(ctx.session, p.todo_id, status=p.status, subject=p.subject, description=p.description,
                          blocked_by=p.blocked_by, user=ctx.user)
    return ToolResult(text=f"todo {todo.pk} is {todo.status}: {todo.subject}", details=_todo_details(todo))


class TodoListParams(ToolParams):
    pass


@register("todo_list", toolsets=BOTH, params=TodoListParams, example={},
          description="List this session's plan items.")
def todo_list(ctx, p: TodoListParams) -> ToolResult:
    todos = list(ctx.session.todos.prefetch_related("blocked_by").order_by("created_at", "id"))
    lines = []
    for t in todos:
        blockers = [b.pk for b in t.blocked_by.all()]
        lines.append(f"[{t.status}] {t.pk}. {t.subject}" + (f" (blocked by {', '.join(map(str, blockers))})" if blockers else ""))
    return ToolResult(
        text="\n".join(lines) or "no todos",
        details={"todos": [{"todo_id": t.pk, "subject": t.subject, "status": t.status,
                            "blocked_by": [b.pk for b in t.blocked_by.all()]} for t in todos]},
    )


# --- execution: list_jobs, job_output -------------------------------------------------------


class ListJobsParams(ToolParams):
    status: Literal["queued", "running", "stopping", "succeeded", "failed", "cancelled", "interrupted"] | None = Field(
        default=None, description="only jobs in this status")
    limit: int = Field(default=20, ge=1, le=200, description="how many to list at most")


@register("list_jobs", toolsets=COLLAB, params=ListJobsParams, example={"status": "running"}, description="""
List the jobs (executions) this session dispatched and their descendants, newest first.""")
def list_jobs(ctx, p: ListJobsParams) -> ToolResult:
    ctx.require("project.read")
    jobs = jobs_dispatched_by(ctx.session, user=ctx.user, status=p.status, limit=p.limit)
    return ToolResult(
        text="\n".join(_job_line(j) for j in jobs) or "no jobs",
        details={"jobs": [{**job_summary(j), "branch": j.branch.display_name} for j in jobs]},
    )


class JobOutputParams(ToolParams):
    job_id: str = Field(min_length=1, description="the job (execution) id, as list_jobs or agent gave it")
    block: bool = Field(default=True, description="wait for the job to end")
    timeout: int = Field(default=JOB_OUTPUT_DEFAULT_MS, ge=0, le=JOB_OUTPUT_MAX_MS,
                         description="how long to wait, in milliseconds")


@register("job_output", toolsets=COLLAB, params=JobOutputParams, example={"job_id": "EXECUTION_ID", "timeout": 60000},
          description="""
The result of a job this session (or an ancestor of it) dispatched. block=true waits up to
`timeout` ms (max 600000) for it to finish.""")
def job_output(ctx, p: JobOutputParams) -> ToolResult:
    job = access_owned_job(ctx.user, p.job_id, ctx.session)
    if p.block and job.status not in TERMINAL_STATUSES:

        def finished() -> bool:
            job.refresh_from_db()
            return job.status in TERMINAL_STATUSES

        def calling_turn_stopping() -> bool:
            if ctx.job is None:
                return False
            ctx.job.refresh_from_db(fields=["status"])
            return ctx.job.status != "running"

        sessions = [job.session_id, ctx.session.pk, ctx.job.session_id if ctx.job is not None else None]
        wait_for_change(finished, p.timeout / 1000, sessions=sessions, stop=calling_turn_stopping)
    summary, truncated = bound_text(job.result, result_limit_for(reading_spec(ctx)))
    done = job.status in TERMINAL_STATUSES
    if not done:
        text = f"job {job.pk} is still {job.status}"
    elif job.is_error:
        text = f"job {job.pk} {job.status}: {job.error_reason or summary}"
    else:
        text = summary
    return ToolResult(
        text=text,
        details={**job_summary(job), "done": done, "truncated": truncated},
    )
