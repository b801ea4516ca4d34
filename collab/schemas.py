"""API shapes (SPEC §11.1). Inputs reject unknown fields; outputs may grow, never shrink."""

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AwareDatetime, ConfigDict, Field, WithJsonSchema


class StrictIn(Schema):
    model_config = ConfigDict(extra="forbid")


class UsageOut(Schema):
    tokens_in: int
    tokens_out: int
    cost: str


class ProjectIn(StrictIn):
    slug: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    name: str = Field(default="", max_length=200)


class ProjectOut(Schema):
    usage: UsageOut | None = None
    slug: str
    name: str
    role: str | None = None
    created_at: Any
    watch_policy: str | None = None


class AgentSpecIn(StrictIn):
    """``connection`` names an operator-owned model connection; ``base_url``/``api_key_env``
    are accepted only when they match one the project may use (SPEC §11.1). Without a
    ``provider``, the connection's (or ``scripted``)."""

    agent_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    provider: str | None = None
    model: str = Field(default="", max_length=200)
    connection: str = Field(default="", max_length=64)
    base_url: str = Field(default="", max_length=500)
    api_key_env: str = Field(default="", pattern=r"^([A-Za-z_][A-Za-z0-9_]{0,99})?$")
    system_prompt: str = ""
    toolset: str = "collab"
    role: str = "general"
    tools: list[str] = Field(default_factory=list)
    script: list[Any] | dict[str, Any] = Field(default_factory=list)
    followup_mode: str = "turn"
    limits: dict[str, Any] = Field(default_factory=dict)


class AgentSpecOut(Schema):
    """``base_url``/``api_key_env`` are the connection's (empty without one); never a key."""

    agent_id: str
    provider: str
    model: str
    connection: str | None
    base_url: str
    api_key_env: str
    system_prompt: str
    toolset: str
    role: str
    tools: list[str]
    script: Any
    followup_mode: str
    limits: dict[str, Any]

    @staticmethod
    def resolve_connection(spec) -> str | None:
        return spec.connection.name if spec.connection_id else None

    @staticmethod
    def resolve_base_url(spec) -> str:
        return spec.connection.base_url if spec.connection_id else ""

    @staticmethod
    def resolve_api_key_env(spec) -> str:
        return spec.connection.key_env if spec.connection_id else ""


class SessionIn(StrictIn):
    title: str = Field(default="", max_length=200)
    agent_id: str = ""


class SessionOut(Schema):
    usage: UsageOut | None = None
    id: str
    project: str
    title: str
    agent_id: str | None
    head: str | None
    parent_session: str | None
    agent_role: str | None = None
    created_at: Any
    last_active_at: Any
    last_event_seq: int
    visibility: str = "project"


class SessionPatch(StrictIn):
    """Who sees the session (issue 17): "project", "private" or "shared". The schema names the
    three (a client, or schemathesis's R5, reads them there); any other string is still the
    service's 400 ``invalid_visibility``, not a validation error."""

    visibility: Annotated[str, WithJsonSchema({"type": "string", "enum": ["project", "private", "shared"]})] | None = None


class BranchPatch(StrictIn):
    """A maintainer marks a branch internal (hidden from agents) or not (issue 14 item 6)."""

    internal: bool | None = None


class ShareIn(StrictIn):
    username: str
    role: str = "viewer"


class ShareOut(Schema):
    username: str
    role: str
    created_at: Any


class TurnIn(StrictIn):
    """``multitask_strategy``: what happens when the branch is busy (issue 16 item 2;
    ``enqueue``, ``reject``, ``interrupt``, ``rollback``; default: the agent spec's, else
    ``enqueue``). Checked by the service, so a bad value is a 400 with the choices."""

    prompt: str
    branch: str | None = None
    agent_id: str | None = None
    multitask_strategy: str | None = None


class TurnOut(Schema):
    execution_id: str
    status: str
    version: int
    branch: str | None = None  # the branch the turn runs on (a rollback's fork: a new one)
    # with ``?wait=``: true, and ``execution`` is the execution as ``GET /api/executions/{id}``
    # answers it when the wait ended (terminal, or still running when the time ran out)
    waited: bool = False
    execution: "ExecutionOut | None" = None


class ExecutionOut(Schema):
    id: str
    status: str
    version: int
    kind: str
    result: str
    is_error: bool
    error_code: str
    error_reason: str
    parent_job: str | None
    session: str
    branch: str
    caller_session: str | None
    prompt_msg: str | None
    tokens_in: int
    tokens_out: int
    cost: str
    model_calls: int
    tool_calls: int
    created_at: Any
    started_at: Any | None
    finished_at: Any | None


class ExecutionWaitOut(ExecutionOut):
    """``GET /api/executions/{id}``: ``waited`` is true when ``?wait=`` was given."""

    waited: bool = False


TurnOut.model_rebuild()  # its ``execution`` names ExecutionOut, defined after it


class EventOut(Schema):
    seq: int
    type: str
    payload: dict[str, Any]
    created_at: Any


class EventsOut(Schema):
    events: list[EventOut]


class ErrorOut(Schema):
    detail: str
    code: str


ExecutionStatus = Literal["queued", "running", "stopping", "succeeded", "failed", "cancelled", "interrupted"]


class BranchOut(Schema):
    usage: UsageOut | None = None
    id: str
    session: str
    address: str | None
    name: str
    name_stage: int
    archived: bool
    archived_at: Any | None
    archive_reason: str
    busy: bool
    turns: int
    chars: int
    internal: bool
    forked_from: str | None
    created_at: Any
    last_active_at: Any


class ArchiveIn(StrictIn):
    reason: str = Field(default="", max_length=500)


class ToolCallIn(StrictIn):
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolResultOut(Schema):
    text: str
    details: dict[str, Any]
    is_error: bool


class TranscriptOut(Schema):
    text: str
    turns: list[dict[str, Any]]
    session_id: str
    branch: str
    address: str | None
    total_turns: int
    omitted_turns: int


class CommandIn(StrictIn):
    command_id: str = Field(min_length=1, max_length=100)
    action: str
    expected_version: int = Field(ge=1)
    payload: dict[str, Any] = Field(default_factory=dict)


class CommandOut(Schema):
    execution_id: str
    status: str
    version: int
    command_id: str
    cascaded: list[str]


class LimitsIn(StrictIn):
    """A partial update: only the fields present change; null = inherit (resource limits)."""

    max_spawn_depth: Any = None
    max_messages: Any = None
    max_spawn_fanout: Any = None
    max_live_per_session: Any = None
    max_queued_per_session: Any = None
    max_jobs_per_session: Any = None
    max_tokens_per_job: Any = None
    max_cost_per_job: Any = None
    max_runtime_seconds: Any = None
    max_idle_seconds: Any = None
    max_running_jobs: Any = None
    max_active_turns: Any = None
    artifact_retention_days: Any = None


class LimitsOut(Schema):
    max_spawn_depth: int
    max_messages: int
    max_spawn_fanout: int
    max_live_per_session: int | None
    max_queued_per_session: int | None
    max_jobs_per_session: int | None
    max_tokens_per_job: int | None
    max_cost_per_job: str | None
    max_runtime_seconds: int | None
    max_idle_seconds: int | None
    max_running_jobs: int | None = None
    max_active_turns: int
    artifact_retention_days: int
    ceilings: dict = {}  # the operator's TRELLIS_MAX_* (null = none)
    effective: dict = {}  # the values in force: min(project, ceiling)


class MemberIn(StrictIn):
    username: str = Field(min_length=1, max_length=150)
    role: str = "member"


class MemberPatch(StrictIn):
    role: str


class MemberOut(Schema):
    username: str
    role: str
    created_at: Any
    status: str = "active"  # "pending" until the person accepts the invitation
    invited_by: str | None = None
    accepted_at: Any | None = None


class InvitationOut(Schema):
    id: int
    project: str  # the slug
    project_name: str
    role: str
    status: str
    invited_by: str | None
    created_at: Any
    accepted_at: Any | None = None


class TokenIn(StrictIn):
    name: str = Field(default="", max_length=100)
    scopes: list[str] | None = None  # default: read, write, tools
    expires_at: AwareDatetime | None = None  # default: never


class TokenOut(Schema):
    id: int
    name: str
    hint: str
    created_at: Any
    last_used_at: Any | None
    revoked_at: Any | None
    scopes: list[str] = []
    expires_at: Any | None = None
    expired: bool = False


class NewTokenOut(TokenOut):
    token: str


class ProjectPatch(StrictIn):
    name: str | None = Field(default=None, max_length=200)
    watch_policy: str | None = None


class HoldOut(Schema):
    id: int
    kind: str
    text: str
    status: str
    to: str | None
    sender: str
    created_at: Any
    decided_by: str | None
    execution_id: str | None


class WebhookIn(StrictIn):
    """A project webhook (issue 16 item 4): the URL's host must be on the operator's list."""

    url: str = Field(max_length=2000)
    description: str = Field(default="", max_length=200)
    active: bool = True


class WebhookPatch(StrictIn):
    url: str | None = Field(default=None, max_length=2000)
    description: str | None = Field(default=None, max_length=200)
    active: bool | None = None


class WebhookOut(Schema):
    id: str
    project: str
    url: str
    description: str
    active: bool
    created_at: Any
    updated_at: Any
    secret_rotated_at: Any | None
    last_status: str | None = None
    last_delivery_at: Any | None = None


class NewWebhookSecretOut(WebhookOut):
    """The create and rotate answers: ``secret`` is shown here only."""

    secret: str


class WebhookDeliveryOut(Schema):
    id: str
    webhook: str
    event: str
    execution: str
    status: str
    attempts: int
    max_attempts: int
    next_attempt_at: Any | None
    last_attempt_at: Any | None
    last_status_code: int | None
    last_error_code: str
    last_error: str
    history: list[dict[str, Any]]
    delivered_at: Any | None
    created_at: Any
    payload: dict[str, Any]
