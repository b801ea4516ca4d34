"""The ``openwork`` toolset (docs/contract.md#the-openwork-toolset): five control tools and the workspace tools.

Control tools are thin adapters over ``collab.services.subagents``; domain errors
become ``<code>: <message>`` results and the parent turn goes on. The workspace
tools (``read``, ``grep``, ``glob``, ``list``, ``bash``) are offered only where
the project has a workspace on the workers, ``bash`` only where bubblewrap runs
(``collab.tools.surface``); they are the explorer's whole tool set.
"""

import json

from pydantic import Field, field_validator

from collab.errors import DomainError
from collab.selectors.children import list_children
from collab.services import subagents
from collab.realtime.bounds import AGENT_WAIT_DEFAULT_MS, AGENT_WAIT_MAX_MS, AGENT_WAIT_MIN_MS
from collab.services.waiting import idle_connection
from collab.sandbox import run_bash
from collab.workspace import Workspace, WorkspaceError
from collab.tools.registry import ToolParams, ToolResult, register

OPENWORK = ("openwork",)


# The pattern is advertised in the schema; the service checks it so that a bad name answers
# ``invalid_task_name``, before anything is written.
TASK_NAME_SCHEMA = {"pattern": subagents.TASK_NAME.pattern, "maxLength": 48}


class TaskMessageParams(ToolParams):
    """A sub-agent's task name and a message for it: ``spawn_agent`` and ``followup_task``."""

    task_name: str = Field(json_schema_extra=TASK_NAME_SCHEMA, description="the sub-agent's name, unique among yours")
    message: str = Field(min_length=1, description="its task: one specific, bounded question")

    @field_validator("message")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("message must not be blank")
        return value


class WaitParams(ToolParams):
    timeout_ms: int = Field(default=AGENT_WAIT_DEFAULT_MS, ge=AGENT_WAIT_MIN_MS, le=AGENT_WAIT_MAX_MS,
                            description="how long to wait at most, in milliseconds")


class NoParams(ToolParams):
    pass


class InterruptParams(ToolParams):
    task_name: str = Field(json_schema_extra=TASK_NAME_SCHEMA, description="the sub-agent whose turn to cancel")


@register("spawn_agent", toolsets=OPENWORK, params=TaskMessageParams, example={
    "task_name": "find_auth_flow", "message": "Where is a login checked? Name the files and functions."},
    description="""
Start a read-only explorer sub-agent on one specific, bounded question and return at once; its
final answer arrives later in your conversation as an <agent_message> (before your next model
call). task_name names it for followup_task / interrupt_agent / list_agents (lowercase, digits,
underscores; unique among your sub-agents). Use it for independent codebase questions whose
research should stay out of your context; at most max_active_turns (default 3) sub-agent turns
run at once. Do not use it for a single small question, for critical-path research your next
step depends on, or to repeat a question already delegated.""")
def spawn_agent(ctx, p: TaskMessageParams) -> ToolResult:
    job = subagents.do_spawn_child(ctx, task_name=p.task_name, message=p.message)
    return ToolResult(text=json.dumps({"task_name": p.task_name}), details={"task_name": p.task_name, "execution_id": job.pk})


@register("wait_agent", toolsets=OPENWORK, params=WaitParams, example={"timeout_ms": 60000}, description="""
Wait until any sub-agent result is in your mailbox (or timeout_ms passes: default 60000, between
10000 and 600000). Returns {"delivered": bool, "timed_out": bool}, never the result itself: results
appear in your conversation before your next model call. Use it only when waiting is the next
useful action. Three timeouts in a row end your turn (doom loop).""")
def wait_agent(ctx, p: WaitParams) -> ToolResult:
    delivered = subagents.wait_for_mail(ctx, p.timeout_ms)
    turn = ctx.turn
    if turn is not None:
        turn.count_wait(delivered)
    answer = {"delivered": delivered, "timed_out": not delivered}
    return ToolResult(text=json.dumps(answer), details=answer)


@register("list_agents", toolsets=OPENWORK, params=NoParams, example={}, description="""
Your sub-agents, sorted by task_name: [{"task_name", "status", "started_at"}]; status is one of
idle, running, completed, failed, cancelled.""")
def list_agents(ctx, p: NoParams) -> ToolResult:
    rows = list_children(ctx.branch)
    return ToolResult(text=json.dumps(rows), details={"agents": rows})


@register("followup_task", toolsets=OPENWORK, params=TaskMessageParams, example={
    "task_name": "find_auth_flow", "message": "And where does a session expire?"}, description="""
Give an idle sub-agent a new task (a new turn with its existing context); its answer arrives as
an <agent_message> like the first one. Fails with agent_turn_start_failed while it is still
running. Shares the limit of max_active_turns (default 3) concurrent sub-agent turns. Reuse an
explorer when its context helps; do not re-ask a question it could not answer.""")
def followup_task(ctx, p: TaskMessageParams) -> ToolResult:
    job = subagents.do_followup_child(ctx, task_name=p.task_name, message=p.message)
    return ToolResult(text="Follow-up task started", details={"task_name": p.task_name, "execution_id": job.pk})


@register("interrupt_agent", toolsets=OPENWORK, params=InterruptParams, example={"task_name": "find_auth_flow"},
          description="""
Cancel a sub-agent's running turn (it reports back as interrupted). Fails with
agent_interrupt_failed when it has no running turn.""")
def interrupt_agent(ctx, p: InterruptParams) -> ToolResult:
    job = subagents.do_interrupt_child(ctx, task_name=p.task_name)
    return ToolResult(text="Interrupt requested", details={"task_name": p.task_name, "execution_id": job.pk})


# --- the workspace: read-only file tools and a sandboxed bash ---------------------------------


def _workspace(ctx) -> Workspace:
    try:
        return Workspace(ctx.session.project.workspace)
    except WorkspaceError as exc:
        raise DomainError(exc.detail, code=exc.code) from None


def _run(fn, *args, **kwargs) -> ToolResult:
    try:
        return ToolResult(text=fn(*args, **kwargs))
    except WorkspaceError as exc:
        raise DomainError(exc.detail, code=exc.code) from None


WORKSPACE_PATH = "a path relative to the workspace root"


class ReadParams(ToolParams):
    path: str = Field(min_length=1, max_length=4096, description=f"the file: {WORKSPACE_PATH}")
    offset: int = Field(default=1, ge=1, description="the first line to read (1-based)")
    limit: int = Field(default=2000, ge=1, le=2000, description="how many lines to read at most")


class PathParams(ToolParams):
    path: str = Field(default=".", max_length=4096, description=f"the directory: {WORKSPACE_PATH}")


class GlobParams(ToolParams):
    pattern: str = Field(min_length=1, max_length=500, description="a glob pattern such as **/*.py")
    path: str = Field(default=".", max_length=4096, description=f"the directory to search in: {WORKSPACE_PATH}")


class GrepParams(ToolParams):
    pattern: str = Field(min_length=1, max_length=1000, description="a regular expression (RE2: no backreferences)")
    path: str = Field(default=".", max_length=4096, description=f"the directory or file to search: {WORKSPACE_PATH}")
    glob: str | None = Field(default=None, max_length=500, description="only files matching this glob pattern")
    ignore_case: bool = Field(default=False, description="match letters in either case")
    max_matches: int = Field(default=200, ge=1, le=1000, description="stop after this many matching lines")


class BashParams(ToolParams):
    command: str = Field(min_length=1, max_length=20_000, description="the shell command, run in the workspace")
    timeout_ms: int = Field(default=30_000, ge=1_000, le=600_000, description="its time limit, in milliseconds")


@register("read", toolsets=OPENWORK, params=ReadParams, needs="workspace", example={"path": "README.md", "limit": 100},
          description="""
Read a text file of the workspace (path relative to the workspace root), with line numbers;
offset (1-based) and limit select lines.""")
def read(ctx, p: ReadParams) -> ToolResult:
    return _run(_workspace(ctx).read, p.path, offset=p.offset, limit=p.limit)


@register("list", toolsets=OPENWORK, params=PathParams, needs="workspace", example={"path": "docs"}, description="""
List a directory of the workspace (directories end with /).""")
def list_dir(ctx, p: PathParams) -> ToolResult:
    return _run(_workspace(ctx).list, p.path)


@register("glob", toolsets=OPENWORK, params=GlobParams, needs="workspace", example={"pattern": "**/*.py"},
          description="""
Find workspace files matching a glob pattern such as **/*.py (paths relative to the root).""")
def glob(ctx, p: GlobParams) -> ToolResult:
    return _run(_workspace(ctx).glob, p.pattern, p.path)


@register("grep", toolsets=OPENWORK, params=GrepParams, needs="workspace",
          example={"pattern": "def login", "glob": "*.py", "ignore_case": True}, description="""
Search workspace files for a regular expression; answers path:line: text. glob narrows the files.""")
def grep(ctx, p: GrepParams) -> ToolResult:
    return _run(_workspace(ctx).grep, p.pattern, p.path, glob=p.glob, ignore_case=p.ignore_case,
                max_matches=p.max_matches)


@register("bash", toolsets=OPENWORK, params=BashParams, needs="sandbox", example={"command": "git log --oneline -5"},
          description="""
Run a shell command in the workspace inside a sandbox: the workspace is read-only, /tmp is
writable and private, there is no network. Good for git log, ls, wc, running read-only scripts.
A refused write cannot be approved by anyone: investigate, do not modify.""")
def bash(ctx, p: BashParams) -> ToolResult:
    workspace = _workspace(ctx)
    idle_connection()  # the command's time is not the database's: the connection goes back to the pool
    try:
        result = run_bash(workspace, p.command, timeout_ms=p.timeout_ms)
    except WorkspaceError as exc:
        raise DomainError(exc.detail, code=exc.code) from None
    return ToolResult(
        text=result.as_text(),
        details={"exit_code": result.exit_code, "timed_out": result.timed_out,
                 "process_limit_hit": result.process_limit_hit},
        is_error=result.failed,
    )
