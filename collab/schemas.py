"""API shapes (docs/contract.md#http-api). Inputs reject unknown fields; outputs may grow, never shrink.

The published schema states the rules the services enforce on each input (so that the
schemathesis check's "positive data is accepted", R5 in ``tests/reliability``, holds for every
operation): lengths, patterns, the choices of a field, the bounds of a number. Where a service
checks a rule itself — so that a value outside it is that service's 400 with its own ``code``,
as it always was — the schema only states it (``stated``); the constants come from the one place
the service reads them.
"""

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AwareDatetime, ConfigDict, Field, WithJsonSchema

from accounts.limits import limit_schema
from accounts.models import PROJECT_NAME_CHARS, PROJECT_SLUG_PATTERN, Role, TokenScope, WatchPolicy
from collab.models import CANCEL, MAX_PROMPT_CHARS, STRATEGIES, AgentRole, FollowupMode, Toolset
from collab.models.sessions import SHARE_ROLES, Visibility
from collab.provider_specs import IMPLEMENTED_PROVIDERS, SCRIPT_SCHEMA
from collab.text import NOT_WHITESPACE, WHITESPACE
from collab.conf.webhook_hosts import MAX_URL_LENGTH, URL_PATTERN

NOT_BLANK = NOT_WHITESPACE  # what ``value.strip()`` leaves something of
EMPTY_OR_NOT_BLANK = f"^(?!{WHITESPACE}+$)"  # "" (absent) or not only whitespace


def stated(schema: dict) -> WithJsonSchema:
    """A string (or list) the service checks, with the rule it checks stated in the published
    schema: a value outside it is still the service's 400 with its ``code``, not a 422."""
    return WithJsonSchema(schema)


def choice_of(values, *, empty: bool = False) -> WithJsonSchema:
    """One of ``values`` (``empty``: or "", which the service reads as absent)."""
    return stated({"type": "string", "enum": [*([""] if empty else []), *values]})


class StrictIn(Schema):
    model_config = ConfigDict(extra="forbid")


class UsageOut(Schema):
    tokens_in: int
    tokens_out: int
    cost: str


class ProjectIn(StrictIn):
    slug: str = Field(pattern=PROJECT_SLUG_PATTERN)
    name: str = Field(default="", max_length=PROJECT_NAME_CHARS)


class ProjectOut(Schema):
    usage: UsageOut | None = None
    slug: str
    name: str
    role: str | None = None
    created_at: Any
    watch_policy: str | None = None
    approvals: list[str] | None = Field(default=None, description=(
        "tools whose every call, by any agent of the project, waits for a person's approval ('*': all); "
        "with an agent spec's approvals, the union (docs/contract.md#people-in-the-loop)"))


class AgentSpecIn(StrictIn):
    """``connection`` names an operator-owned model connection; ``base_url``/``api_key_env``
    are accepted only when they match one the project may use. Without a
    ``provider``, the connection's (or ``scripted``)."""

    # a provider that calls a model API needs a model name (services/specs.py)
    model_config = ConfigDict(extra="forbid", json_schema_extra={"allOf": [{
        "if": {"required": ["provider"],
               "properties": {"provider": {"enum": [p for p in IMPLEMENTED_PROVIDERS if p != "scripted"]}}},
        "then": {"required": ["model"], "properties": {"model": {"pattern": NOT_BLANK}}},
    }]})

    agent_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    provider: Annotated[str, choice_of(IMPLEMENTED_PROVIDERS, empty=True)] | None = None
    model: str = Field(default="", max_length=200)
    connection: str = Field(default="", max_length=64)
    base_url: str = Field(default="", max_length=500)
    api_key_env: str = Field(default="", pattern=r"^([A-Za-z_][A-Za-z0-9_]{0,99})?$")
    system_prompt: str = ""
    toolset: Annotated[str, choice_of(Toolset.values)] = "collab"
    role: Annotated[str, choice_of(AgentRole.values)] = "general"
    tools: list[str] = Field(default_factory=list)
    approvals: list[str] = Field(default_factory=list, description=(
        'tools whose every call waits for a person\'s approval (docs/contract.md#people-in-the-loop); ["*"]: all'))
    script: Annotated[list[Any] | dict[str, Any], stated(SCRIPT_SCHEMA)] = Field(default_factory=list)
    followup_mode: Annotated[str, choice_of(FollowupMode.values)] = "turn"
    # ``multitask_strategy``: the spec's default for turns on a busy branch
    limits: Annotated[dict[str, Any], stated({
        "type": "object",
        "properties": {"multitask_strategy": {"anyOf": [{"type": "string", "enum": list(STRATEGIES)}, {"type": "null"}]},
                       "approval_expires_s": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]}},
    })] = Field(default_factory=dict)


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
    approvals: list[str]
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
    """Who sees the session: "project", "private" or "shared". The schema names the
    three (a client, or schemathesis's R5, reads them there); any other string is still the
    service's 400 ``invalid_visibility``, not a validation error."""

    visibility: Annotated[str, choice_of(Visibility.values)] | None = None


class BranchPatch(StrictIn):
    """A maintainer marks a branch internal (hidden from agents) or not."""

    internal: bool | None = None


class ShareIn(StrictIn):
    username: str
    role: Annotated[str, choice_of(SHARE_ROLES)] = "viewer"


class ShareOut(Schema):
    username: str
    role: str
    created_at: Any


class TurnIn(StrictIn):
    """``multitask_strategy``: what happens when the branch is busy (``enqueue``, ``reject``,
    ``interrupt``, ``rollback``; default: the agent spec's, else ``enqueue``). Checked by the
    service, so a bad value is a 400 with the choices. The ``prompt`` is not blank; a ``branch``
    given (an address or a name) is not only whitespace."""

    prompt: Annotated[str, stated({"type": "string", "pattern": NOT_BLANK, "maxLength": MAX_PROMPT_CHARS})]
    branch: Annotated[str, stated({"type": "string", "pattern": EMPTY_OR_NOT_BLANK})] | None = None
    agent_id: str | None = None
    multitask_strategy: Annotated[str, choice_of(STRATEGIES, empty=True)] | None = None


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


class QueuePlaceOut(Schema):
    """Where a queued execution stands: ``position`` 1 is the oldest of its project's queued
    executions; ``waiting_for`` is ``slot`` (a worker slot), ``project_cap`` (the project's
    running cap) or ``branch`` (an earlier execution of the same agent)."""

    position: int
    waiting_for: Literal["slot", "project_cap", "branch"]


class ExecutionWaitOut(ExecutionOut):
    """``GET /api/executions/{id}``: ``waited`` is true when ``?wait=`` was given; ``queue`` says
    where a still-queued execution stands (null once it has started)."""

    waited: bool = False
    queue: QueuePlaceOut | None = None


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


ExecutionStatus = Literal["queued", "running", "stopping", "succeeded", "failed", "cancelled", "interrupted", "waiting"]


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
    """The one ``action`` is ``execution.cancel``, whose ``payload`` is empty; a ``command_id``
    is not blank (a repeated one answers what it first did)."""

    command_id: Annotated[str, stated({"type": "string", "minLength": 1, "maxLength": 100, "pattern": NOT_BLANK})] = \
        Field(min_length=1, max_length=100)
    action: Annotated[str, choice_of([CANCEL])]
    expected_version: int = Field(ge=1)
    payload: Annotated[dict[str, Any], stated({"type": "object", "maxProperties": 0})] = Field(default_factory=dict)


class CommandOut(Schema):
    execution_id: str
    status: str
    version: int
    command_id: str
    cascaded: list[str]


def limit_field(name: str):
    """A ``LimitsIn`` field: optional, its published schema ``accounts.limits.limit_schema``'s
    (read when the schema is made: the ceilings are the deployment's)."""

    def publish(schema: dict) -> None:
        schema.pop("default", None)
        schema.update(limit_schema(name))

    return Field(default=None, json_schema_extra=publish)


class LimitsIn(StrictIn):
    """A partial update: only the fields present change; null = inherit (resource limits). Each
    field's schema is what ``accounts.limits.check_limits`` accepts here, ceilings included."""

    max_spawn_depth: Any = limit_field("max_spawn_depth")
    max_messages: Any = limit_field("max_messages")
    max_spawn_fanout: Any = limit_field("max_spawn_fanout")
    max_live_per_session: Any = limit_field("max_live_per_session")
    max_queued_per_session: Any = limit_field("max_queued_per_session")
    max_jobs_per_session: Any = limit_field("max_jobs_per_session")
    max_tokens_per_job: Any = limit_field("max_tokens_per_job")
    max_cost_per_job: Any = limit_field("max_cost_per_job")
    max_runtime_seconds: Any = limit_field("max_runtime_seconds")
    max_idle_seconds: Any = limit_field("max_idle_seconds")
    max_running_jobs: Any = limit_field("max_running_jobs")
    max_active_turns: Any = limit_field("max_active_turns")
    artifact_retention_days: Any = limit_field("artifact_retention_days")


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
    role: Annotated[str, choice_of(Role.values)] = "member"


class MemberPatch(StrictIn):
    role: Annotated[str, choice_of(Role.values)]


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
    """``expires_at``: a moment in the future (and before the year 9999 in UTC), no later than
    the minting token's own expiry."""

    name: str = Field(default="", max_length=100)
    scopes: Annotated[list[str], stated({  # default: read, write, tools
        "type": "array", "minItems": 1, "items": {"type": "string", "enum": list(TokenScope.values)}})] | None = None
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
    name: Annotated[str, stated({"type": "string", "maxLength": 200, "pattern": NOT_BLANK})] | None = \
        Field(default=None, max_length=200)
    watch_policy: Annotated[str, choice_of(WatchPolicy.values)] | None = None
    approvals: list[str] | None = Field(default=None, max_length=200, description=(
        "tool names of any toolset, or '*' (every tool), whose every call waits for a person's approval; "
        "[] names none"))


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


# a URL the service reads as one (``collab.conf.webhook_hosts``); its host must also be on the
# operator's list (``TRELLIS_WEBHOOK_HOSTS``), which is this deployment's, not the schema's
WEBHOOK_URL = stated({"type": "string", "maxLength": MAX_URL_LENGTH, "pattern": URL_PATTERN,
                      "description": "http(s); the host must be on the operator's list (TRELLIS_WEBHOOK_HOSTS)"})


class WebhookIn(StrictIn):
    """A project webhook: the URL's host must be on the operator's list."""

    url: Annotated[str, WEBHOOK_URL] = Field(max_length=MAX_URL_LENGTH)
    description: str = Field(default="", max_length=200)
    active: bool = True


class WebhookPatch(StrictIn):
    url: Annotated[str, WEBHOOK_URL] | None = Field(default=None, max_length=MAX_URL_LENGTH)
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


class SearchResultOut(Schema):
    """One thing ``GET /api/search`` found (docs/api.md#search): a session by its title, a branch by
    its name or a message by its words; ``snippet`` is HTML (escaped text, matches in ``<mark>``)."""

    kind: Literal["session", "branch", "message"]
    project: str
    session: str
    session_title: str
    branch: str | None
    branch_name: str | None
    archived: bool
    message: str | None
    role: str | None
    snippet: str
    created_at: Any
    url: str


class SearchOut(Schema):
    results: list[SearchResultOut]
