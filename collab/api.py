"""REST routes (docs/contract.md#http-api). Each: authorize through ``collab.access``, call one service or selector."""

from typing import Annotated

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router, Schema, Status
from pydantic import ConfigDict

from accounts.limits import LimitError, limits_report
from accounts.models import TokenScope
from accounts.policy import member_roles, role_of, visible_projects
from collab import access
from collab.scopes import request_token, token_scope
from collab.errors import Invalid
from collab.realtime.bounds import MAX_WAIT_SECONDS, open_wait, parse_wait
from collab.realtime.subscription import Subscription, until_terminal
from collab.realtime.threads import in_thread
from collab.gateway import call_tool
from collab.models import DeliveryStatus
from collab.schemas import (
    AgentSpecIn,
    ArchiveIn,
    BranchOut,
    BranchPatch,
    CommandIn,
    CommandOut,
    LimitsIn,
    LimitsOut,
    InvitationOut,
    MemberIn,
    MemberOut,
    MemberPatch,
    HoldOut,
    NewTokenOut,
    ProjectPatch,
    SearchOut,
    TokenIn,
    TokenOut,
    ToolCallIn,
    ToolResultOut,
    TranscriptOut,
    AgentSpecOut,
    ErrorOut,
    EventsOut,
    ExecutionOut,
    ExecutionWaitOut,
    ProjectIn,
    ProjectOut,
    SessionIn,
    SessionOut,
    SessionPatch,
    ShareIn,
    ShareOut,
    TurnIn,
    TurnOut,
    NewWebhookSecretOut,
    WebhookDeliveryOut,
    WebhookIn,
    WebhookOut,
    WebhookPatch,
    NOT_BLANK,
    choice_of,
    stated,
)
from collab.selectors.events import PAGE, events_after
from collab.selectors.redact import hidden_among, redact_executions
from collab.selectors.agents import branch_rows
from collab.models import is_busy
from collab.selectors.shapes import branch_shape, branch_usage, execution_shape, project_usage, session_shape
from collab.selectors.jobs import queue_place, session_executions
from collab.selectors.pages import holds_of
from collab.selectors.search import DEFAULT_LIMIT, MAX_QUERY_CHARS, search
from collab.selectors.specs import specs_of
from collab.selectors.transcript import DEFAULT_MAX_CHARS, MAX_MAX_CHARS, MIN_MAX_CHARS, render_transcript
from collab.services.branches import do_set_internal
from collab.services.archive import do_archive_branch
from collab.services.cancel import do_execution_command
from collab.services.projects import do_create_project, do_set_limits, do_update_project
from collab.services.holds import do_decide_hold
from collab.services.members import (
    do_accept_invitation,
    do_add_member,
    do_change_role,
    do_decline_invitation,
    do_remove_member,
)
from collab.selectors.members import invitations_of, members_of
from collab.selectors.webhooks import deliveries_of, delivery_shape, webhook_shape, webhooks_of
from collab.services.webhooks import (
    do_create_webhook,
    do_delete_webhook,
    do_rotate_webhook_secret,
    do_update_webhook,
)
from collab.services.tokens import do_issue_token, do_revoke_token
from collab.selectors.tokens import tokens_of
from collab.services.sessions import do_create_session
from collab.services.specs import do_add_agent_spec
from collab.services.turns import do_start_user_turn
from collab.services.visibility import do_set_shares, do_set_visibility, do_share, do_unshare, shares_of

router = Router()
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut, 429: ErrorOut}

# A branch's address in a path: ``SID:HEAD`` or a name, not only whitespace (``access.find_branch``)
Address = Annotated[str, stated({"type": "string", "pattern": NOT_BLANK})]
BRANCH_SCOPES = ("session", "archived")


def _project_out(project, role=None) -> dict:
    return {"slug": project.slug, "name": project.name, "role": role, "created_at": project.created_at,
            "watch_policy": project.watch_policy, "approvals": project.approvals}


@router.get("projects", response=list[ProjectOut], tags=["projects"])
def list_projects(request: HttpRequest):
    roles = dict(member_roles(request.auth).values_list("project_id", "role"))
    return [_project_out(p, roles.get(p.pk)) for p in visible_projects(request.auth)]


@router.post("projects", response={201: ProjectOut, **ERRORS}, tags=["projects"])
def post_project(request: HttpRequest, payload: ProjectIn):
    """A new project, the caller its owner, with the starter agent ``assistant`` (the projects page's service)."""
    project = do_create_project(request.auth, slug=payload.slug, name=payload.name)
    return Status(201, _project_out(project, "owner"))


@router.get("projects/{slug}/agent-specs", response={200: list[AgentSpecOut], **ERRORS}, tags=["projects"])
def list_agent_specs(request: HttpRequest, slug: str):
    """The project's agent specs by ``agent_id``, each as ``POST`` answers it: every member sees
    them (a session is started with one); maintainers save them."""
    return specs_of(access.access_project(request.auth, slug))


@router.post("projects/{slug}/agent-specs", response={201: AgentSpecOut, **ERRORS}, tags=["projects"])
def post_agent_spec(request: HttpRequest, slug: str, payload: AgentSpecIn):
    project = access.access_project(request.auth, slug, "agent_spec.manage")
    return Status(201, do_add_agent_spec(request.auth, project, **payload.model_dump()))


@router.post("projects/{slug}/sessions", response={201: SessionOut, **ERRORS}, tags=["sessions"])
def post_session(request: HttpRequest, slug: str, payload: SessionIn):
    project = access.access_project(request.auth, slug, "turn.start")
    session = do_create_session(request.auth, project, title=payload.title, agent_id=payload.agent_id)
    return Status(201, session_shape(session))


@router.get("sessions/{sid}", response={200: SessionOut, **ERRORS}, tags=["sessions"])
def get_session(request: HttpRequest, sid: str):
    return session_shape(access.access_session(request.auth, sid))


@router.patch("sessions/{sid}", response={200: SessionOut, **ERRORS}, tags=["sessions"])
def patch_session(request: HttpRequest, sid: str, payload: SessionPatch):
    """Who sees the session: its creator or a maintainer sets ``visibility``."""
    session = access.access_session(request.auth, sid)
    if payload.visibility is not None:
        do_set_visibility(request.auth, session, payload.visibility)
    return session_shape(access.access_session(request.auth, sid))


def _share_out(share) -> dict:
    return {"username": share.user.username, "role": share.role, "created_at": share.created_at}


@router.get("sessions/{sid}/shares", response={200: list[ShareOut], **ERRORS}, tags=["sessions"])
def list_shares(request: HttpRequest, sid: str):
    """The members a ``shared`` session is shown to, with the most each may do in it."""
    return [_share_out(s) for s in shares_of(access.access_session(request.auth, sid))]


@router.put("sessions/{sid}/shares", response={200: list[ShareOut], **ERRORS}, tags=["sessions"])
def put_shares(request: HttpRequest, sid: str, payload: list[ShareIn]):
    """Replace the share list (each role no wider than that member's project role)."""
    session = access.access_session(request.auth, sid)
    shares = do_set_shares(request.auth, session, {s.username: s.role for s in payload})
    return [_share_out(s) for s in shares]


@router.post("sessions/{sid}/shares", response={201: list[ShareOut], **ERRORS}, tags=["sessions"])
def post_share(request: HttpRequest, sid: str, payload: ShareIn):
    session = access.access_session(request.auth, sid)
    return Status(201, [_share_out(s) for s in do_share(request.auth, session, payload.username, payload.role)])


@router.delete("sessions/{sid}/shares/{username}", response={204: None, **ERRORS}, tags=["sessions"])
def delete_share(request: HttpRequest, sid: str, username: str):
    do_unshare(request.auth, access.access_session(request.auth, sid), username)
    return Status(204, None)


def _start_turn(user, sid: str, payload: TurnIn) -> dict:
    session = access.access_session(user, sid, "turn.start")
    job = do_start_user_turn(user, session, payload.prompt, branch=payload.branch, agent_id=payload.agent_id,
                             multitask_strategy=payload.multitask_strategy)
    return {"execution_id": job.pk, "status": job.status, "version": job.version, "branch": job.branch_id,
            "session": job.session_id}


# ``?wait=`` with its bounds in the schema (outside them: 422 invalid_request naming ``wait``)
WAIT_QUERY = Query(None, ge=0, le=MAX_WAIT_SECONDS,
                   description=f"seconds to wait for a terminal status, 0 to {MAX_WAIT_SECONDS}")


def _read_execution(user, execution_id: str) -> dict:
    return redact_executions(user, [execution_shape(access.access_job(user, execution_id))])[0]


def _read_execution_in_queue(user, execution_id: str) -> dict:
    """The execution, and where it stands while it is queued (``queue_place``)."""
    job = access.access_job(user, execution_id)
    return {**redact_executions(user, [execution_shape(job)])[0], "queue": queue_place(job)}


@router.post("sessions/{sid}/turns", response={202: TurnOut, **ERRORS}, tags=["sessions"])
async def post_turn(request: HttpRequest, sid: str, payload: TurnIn, wait: float | None = WAIT_QUERY):
    """Start a turn. With ``?wait=SECONDS`` (0–60) the answer comes when the execution is
    terminal or the wait ends — still 202, with ``waited`` true and
    ``execution`` as ``GET /api/executions/{id}`` shows it then; the wait holds no thread
    and no database connection (``collab.realtime.subscription``)."""
    seconds = parse_wait(wait)
    slot = open_wait(request.auth) if seconds else None  # a user at the bound is refused before anything starts
    subscription = None
    try:
        # listening before the turn exists: its end cannot come before the subscription
        subscription = await Subscription.before(sid, seconds)
        turn = await in_thread(request, _start_turn, request.auth, sid, payload)
    except BaseException:
        if slot is not None:
            slot.free()
        if subscription is not None:
            subscription.close_soon()
        raise
    session_id = turn.pop("session")
    if subscription is not None and subscription.session_id != session_id:
        subscription.close_soon()
        subscription = None
    if seconds is None:
        return Status(202, turn)
    execution = await until_terminal(request, session_id, turn["execution_id"], seconds,
                                     lambda: in_thread(request, _read_execution, request.auth, turn["execution_id"]),
                                     slot=slot, subscription=subscription)
    return Status(202, {**turn, "status": execution["status"], "version": execution["version"], "waited": True,
                        "execution": execution})


@router.get("executions/{execution_id}", response={200: ExecutionWaitOut, **ERRORS}, tags=["executions"])
async def get_execution(request: HttpRequest, execution_id: str, wait: float | None = WAIT_QUERY):
    """One execution. With ``?wait=SECONDS`` (0–60) the answer comes when it is terminal or
    the wait ends, with ``waited`` true; nothing is held while waiting."""
    seconds = parse_wait(wait)
    execution = await in_thread(request, _read_execution_in_queue, request.auth, execution_id)
    if seconds is None:
        return execution
    execution = await until_terminal(request, execution["session"], execution_id, seconds,
                                     lambda: in_thread(request, _read_execution_in_queue, request.auth, execution_id),
                                     current=execution)
    return {**execution, "waited": True}


@router.get("executions", response={200: list[ExecutionOut], **ERRORS}, tags=["executions"])
def list_executions(request: HttpRequest, session: str, status: str | None = None, limit: int = 100):
    target = access.access_session(request.auth, session)
    jobs = session_executions(target, status=status, limit=limit)
    return redact_executions(request.auth, [execution_shape(j) for j in jobs])


@router.post("executions/{execution_id}/commands", response={202: CommandOut, **ERRORS}, tags=["executions"])
def post_command(request: HttpRequest, execution_id: str, payload: CommandIn):
    job = access.access_job(request.auth, execution_id)
    code, answer = do_execution_command(
        request.auth, job, command_id=payload.command_id, action=payload.action,
        expected_version=payload.expected_version, payload=payload.payload,
    )
    return Status(code, answer)


@router.get("sessions/{sid}/events", response={200: EventsOut, **ERRORS}, tags=["events"])
def get_events(request: HttpRequest, sid: str, after: int = 0, limit: int = PAGE):
    session = access.access_session(request.auth, sid)
    limit = max(1, min(limit, PAGE))
    after = max(0, min(after, session.last_event_seq))  # past the log's end there is nothing to read
    return {"events": events_after(session.pk, after, limit, viewer=request.auth)}


@router.get("sessions/{sid}/branches", response={200: list[BranchOut], **ERRORS}, tags=["branches"])
def get_branches(request: HttpRequest, sid: str, scope: Annotated[str, choice_of(BRANCH_SCOPES)] = "session",
                 limit: int = 200):
    session = access.access_session(request.auth, sid)
    if scope not in BRANCH_SCOPES:
        raise Invalid('scope must be "session" or "archived"', code="invalid_scope")
    rows = branch_rows([session.pk], archived=(scope == "archived"), limit=max(1, min(limit, 1000)), previews=False)
    totals = branch_usage([b.pk for b in rows])
    return [{**branch_shape(b, b.busy), "usage": totals.get(b.pk)} for b in rows]


@router.get("branches/{address}/transcript", response={200: TranscriptOut, **ERRORS}, tags=["branches"])
def get_transcript(request: HttpRequest, address: Address, start_turn: int = 0, end_turn: int | None = None,
                   include_function_calls: bool = True, max_chars: int = DEFAULT_MAX_CHARS):
    branch = access.access_branch(request.auth, address)
    return render_transcript(branch, viewer=request.auth, start_turn=start_turn, end_turn=end_turn,
                             include_function_calls=include_function_calls,
                             max_chars=max(MIN_MAX_CHARS, min(max_chars, MAX_MAX_CHARS)))


@router.post("branches/{address}/archive", response={200: BranchOut, **ERRORS}, tags=["branches"])
def post_archive(request: HttpRequest, address: Address, payload: ArchiveIn):
    branch = access.access_branch(request.auth, address)
    access.require_can_archive(request.auth, branch)
    branch = do_archive_branch(branch, user=request.auth, reason=payload.reason)
    return branch_shape(branch, busy=is_busy(branch))


@router.patch("branches/{address}", response={200: BranchOut, **ERRORS}, tags=["branches"])
def patch_branch(request: HttpRequest, address: Address, payload: BranchPatch):
    """A maintainer or owner sets ``internal`` (hidden from agents' listings and
    name resolution, shown dimmed on the session page); audited. Members get 403, outsiders 404."""
    branch = access.access_branch(request.auth, address)
    if payload.internal is not None:
        do_set_internal(request.auth, branch, payload.internal)
        branch.refresh_from_db()
    return branch_shape(branch, busy=is_busy(branch))


@router.post("branches/{address}/tools/{tool}", response={200: ToolResultOut, **ERRORS}, tags=["tools"])
@token_scope(TokenScope.TOOLS)
async def post_tool(request: HttpRequest, address: Address, tool: str, payload: ToolCallIn):
    """The tool gateway: run one of that branch's tools as that branch (for external agents and
    black-box tests); the branch's surface decides what exists (its toolset, role, workspace).
    Async so a waiting tool never holds the thread sync views share (``collab.gateway``)."""
    return await call_tool(request, address, tool, payload.arguments)


@router.get("projects/{slug}", response={200: ProjectOut, **ERRORS}, tags=["projects"])
def get_project(request: HttpRequest, slug: str):
    """The project, with token and cost totals over its executions in the sessions you may see."""
    project = access.access_project(request.auth, slug)
    role = role_of(request.auth, project)
    return {**_project_out(project, role), "usage": project_usage(project, request.auth)}


class SearchQuery(Schema):
    """``GET /api/search``'s query. ``q`` is required and not blank, as the schema says; the
    selector checks it (``collab.selectors.search.search_terms``), so a request without it, or
    with only blanks or too long a one, is its 400 ``invalid_query`` with the reason."""

    model_config = ConfigDict(json_schema_extra={"required": ["q"]})
    q: Annotated[str, stated({"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS,
                              "pattern": NOT_BLANK})] = None
    project: str | None = None
    limit: int = DEFAULT_LIMIT


@router.get("search", response={200: SearchOut, **ERRORS}, tags=["search"])
def get_search(request: HttpRequest, query: Query[SearchQuery]):
    """Messages, branch names and session titles matching ``q``, across your projects (or in
    ``project``, a slug), best first, at most ``limit`` (1–50, default 20): only what you may
    see, snippets redacted as transcripts are (docs/api.md#search)."""
    project = access.access_project(request.auth, query.project) if query.project else None
    return {"results": search(request.auth, query.q, project, query.limit)}


@router.get("projects/{slug}/limits", response={200: LimitsOut, **ERRORS}, tags=["projects"])
def get_limits(request: HttpRequest, slug: str):
    return limits_report(access.access_project(request.auth, slug))


@router.patch("projects/{slug}/limits", response={200: LimitsOut, **ERRORS}, tags=["projects"])
def patch_limits(request: HttpRequest, slug: str, payload: LimitsIn):
    project = access.access_project(request.auth, slug, "project.settings")
    try:
        do_set_limits(request.auth, project, {name: getattr(payload, name) for name in payload.model_fields_set})
    except LimitError as exc:
        raise Invalid(str(exc), code="invalid_limit", field=exc.field, **exc.extra) from None
    return limits_report(project)


@router.get("artifacts/{artifact_id}", response={200: None, **ERRORS}, tags=["executions"])
def get_artifact(request: HttpRequest, artifact_id: str):
    """The full text of a truncated result, for those who may read its execution."""
    artifact = access.access_artifact(request.auth, artifact_id)
    response = HttpResponse(artifact.content, content_type=artifact.media_type)
    response["X-Content-SHA256"] = artifact.sha256
    response["X-Execution-Id"] = artifact.job_id
    return response


def _member_out(m) -> dict:
    return {"username": m.user.username, "role": m.role, "created_at": m.created_at, "status": m.status,
            "invited_by": m.invited_by.username if m.invited_by_id else None, "accepted_at": m.accepted_at}


@router.get("projects/{slug}/members", response={200: list[MemberOut], **ERRORS}, tags=["members"])
def list_members(request: HttpRequest, slug: str):
    """Every member sees who else is in the project (as on the project page), pending invitations
    included (``status``: "pending" | "active"); owners change it."""
    project = access.access_project(request.auth, slug)
    return [_member_out(m) for m in members_of(project)]


@router.post("projects/{slug}/members", response={201: MemberOut, **ERRORS}, tags=["members"])
def post_member(request: HttpRequest, slug: str, payload: MemberIn):
    """Invite a person: the answer's ``status`` is "pending" until they accept (``DELETE`` cancels)."""
    project = access.access_project(request.auth, slug, "project.members")
    return Status(201, _member_out(do_add_member(request.auth, project, payload.username, payload.role)))


def _invitation_out(m) -> dict:
    return {"id": m.pk, "project": m.project.slug, "project_name": m.project.name, "role": m.role,
            "status": m.status, "created_at": m.created_at,
            "invited_by": m.invited_by.username if m.invited_by_id else None, "accepted_at": m.accepted_at}


@router.get("invitations", response={200: list[InvitationOut], **ERRORS}, tags=["members"])
def list_invitations(request: HttpRequest):
    """The caller's pending invitations: all they see of those projects until they accept."""
    return [_invitation_out(m) for m in invitations_of(request.auth)]


@router.post("invitations/{invitation_id}/accept", response={200: InvitationOut, **ERRORS}, tags=["members"])
def accept_invitation(request: HttpRequest, invitation_id: int):
    return _invitation_out(do_accept_invitation(request.auth, invitation_id))


@router.post("invitations/{invitation_id}/decline", response={204: None, **ERRORS}, tags=["members"])
def decline_invitation(request: HttpRequest, invitation_id: int):
    do_decline_invitation(request.auth, invitation_id)
    return Status(204, None)


@router.patch("projects/{slug}/members/{username}", response={200: MemberOut, **ERRORS}, tags=["members"])
def patch_member(request: HttpRequest, slug: str, username: str, payload: MemberPatch):
    project = access.access_project(request.auth, slug, "project.members")
    return _member_out(do_change_role(request.auth, project, username, payload.role))


@router.delete("projects/{slug}/members/{username}", response={204: None, **ERRORS}, tags=["members"])
def delete_member(request: HttpRequest, slug: str, username: str):
    project = access.access_project(request.auth, slug, "project.members")
    do_remove_member(request.auth, project, username)
    return Status(204, None)


def _token_out(t) -> dict:
    return {"id": t.pk, "name": t.name, "hint": t.hint, "created_at": t.created_at,
            "last_used_at": t.last_used_at, "revoked_at": t.revoked_at, "scopes": t.scopes,
            "expires_at": t.expires_at, "expired": t.is_expired}


@router.get("tokens", response={200: list[TokenOut], **ERRORS}, tags=["tokens"])
def list_tokens(request: HttpRequest):
    return [_token_out(t) for t in tokens_of(request.auth)]


@router.post("tokens", response={201: NewTokenOut, **ERRORS}, tags=["tokens"])
@token_scope(TokenScope.TOKENS)
def post_token(request: HttpRequest, payload: TokenIn):
    """A new token for the caller; the raw value is in this answer only (it is stored hashed).
    A bearer token needs the ``tokens`` scope and cannot grant more than it has."""
    token, raw = do_issue_token(request.auth, request.auth, name=payload.name, scopes=payload.scopes,
                                expires_at=payload.expires_at, minted_by=request_token(request))
    return Status(201, {**_token_out(token), "token": raw})


@router.delete("tokens/{token_id}", response={204: None, **ERRORS}, tags=["tokens"])
@token_scope(TokenScope.TOKENS)
def delete_token(request: HttpRequest, token_id: int):
    do_revoke_token(request.auth, access.access_token(request.auth, token_id))
    return Status(204, None)


@router.patch("projects/{slug}", response={200: ProjectOut, **ERRORS}, tags=["projects"])
def patch_project(request: HttpRequest, slug: str, payload: ProjectPatch):
    """Owners rename the project or set its watch policy ("off" | "confirm_deliveries") and the
    tools whose every call waits for a person's approval (``approvals``)."""
    project = access.access_project(request.auth, slug, "project.settings")
    project = do_update_project(request.auth, project, name=payload.name, watch_policy=payload.watch_policy,
                                approvals=payload.approvals)
    return _project_out(project, "owner")


def _hold_out(h, hidden: set = frozenset()) -> dict:
    """``hidden``: sessions the reader may not see — a hold into one says neither where nor
    which execution (``to`` and ``execution_id`` are null)."""
    into_hidden = h.target_branch.session_id in hidden
    return {"id": h.pk, "kind": h.kind, "text": h.text, "status": h.status,
            "to": None if into_hidden else h.target_branch.address,
            "sender": h.sender_branch.address, "created_at": h.created_at,
            "decided_by": h.decided_by.username if h.decided_by_id else None,
            "execution_id": None if into_hidden else h.result_job_id}


def _holds_out(user, holds) -> list[dict]:
    hidden = hidden_among(user, {h.target_branch.session_id for h in holds})
    return [_hold_out(h, hidden) for h in holds]


@router.get("sessions/{sid}/holds", response={200: list[HoldOut], **ERRORS}, tags=["watch"])
def list_holds(request: HttpRequest, sid: str, status: str = "pending", limit: int = 200):
    session = access.access_session(request.auth, sid)
    return _holds_out(request.auth, holds_of(session, status=status, limit=limit))


@router.post("holds/{hold_id}/approve", response={200: HoldOut, **ERRORS}, tags=["watch"])
@token_scope(TokenScope.HOLDS)
def approve_hold(request: HttpRequest, hold_id: int):
    return _holds_out(request.auth, [do_decide_hold(request.auth, access.access_hold(request.auth, hold_id), approve=True)])[0]


@router.post("holds/{hold_id}/reject", response={200: HoldOut, **ERRORS}, tags=["watch"])
@token_scope(TokenScope.HOLDS)
def reject_hold(request: HttpRequest, hold_id: int):
    return _holds_out(request.auth, [do_decide_hold(request.auth, access.access_hold(request.auth, hold_id), approve=False)])[0]


# --- webhooks: maintainers and owners; members 403, outsiders 404 ----------------------------


@router.get("projects/{slug}/webhooks", response={200: list[WebhookOut], **ERRORS}, tags=["webhooks"])
def list_webhooks(request: HttpRequest, slug: str):
    project = access.access_project(request.auth, slug, "project.webhooks")
    return [webhook_shape(w) for w in webhooks_of(project)]


@router.post("projects/{slug}/webhooks", response={201: NewWebhookSecretOut, **ERRORS}, tags=["webhooks"])
def post_webhook(request: HttpRequest, slug: str, payload: WebhookIn):
    """Register a URL called when an execution of the project ends. The answer's ``secret``
    (it signs every request) is shown this once; ``POST /api/webhooks/{id}/rotate-secret``
    makes a new one."""
    project = access.access_project(request.auth, slug, "project.webhooks")
    webhook, secret = do_create_webhook(request.auth, project, url=payload.url, description=payload.description,
                                        active=payload.active)
    return Status(201, {**webhook_shape(webhook), "secret": secret})


@router.get("webhooks/{webhook_id}", response={200: WebhookOut, **ERRORS}, tags=["webhooks"])
def get_webhook(request: HttpRequest, webhook_id: str):
    webhook = access.access_webhook(request.auth, webhook_id)
    return webhook_shape(webhooks_of(webhook.project).get(pk=webhook.pk))


@router.patch("webhooks/{webhook_id}", response={200: WebhookOut, **ERRORS}, tags=["webhooks"])
def patch_webhook(request: HttpRequest, webhook_id: str, payload: WebhookPatch):
    webhook = access.access_webhook(request.auth, webhook_id)
    do_update_webhook(request.auth, webhook, url=payload.url, description=payload.description, active=payload.active)
    return webhook_shape(webhooks_of(webhook.project).get(pk=webhook.pk))


@router.delete("webhooks/{webhook_id}", response={204: None, **ERRORS}, tags=["webhooks"])
def delete_webhook(request: HttpRequest, webhook_id: str):
    do_delete_webhook(request.auth, access.access_webhook(request.auth, webhook_id))
    return Status(204, None)


@router.post("webhooks/{webhook_id}/rotate-secret", response={200: NewWebhookSecretOut, **ERRORS}, tags=["webhooks"])
def rotate_webhook_secret(request: HttpRequest, webhook_id: str):
    """A new signing secret, shown in this answer only; the old one signs nothing from now on."""
    webhook, secret = do_rotate_webhook_secret(request.auth, access.access_webhook(request.auth, webhook_id))
    return {**webhook_shape(webhooks_of(webhook.project).get(pk=webhook.pk)), "secret": secret}


@router.get("webhooks/{webhook_id}/deliveries", response={200: list[WebhookDeliveryOut], **ERRORS}, tags=["webhooks"])
def list_webhook_deliveries(request: HttpRequest, webhook_id: str,
                            status: Annotated[str, choice_of(DeliveryStatus.values, empty=True)] | None = None,
                            limit: int = 50):
    """The webhook's deliveries, newest first: status, attempts, next attempt, the last HTTP
    status and Trellis's reason (never the receiver's answer text), the body sent."""
    webhook = access.access_webhook(request.auth, webhook_id)
    if status and status not in DeliveryStatus.values:
        raise Invalid(f"status must be one of {', '.join(DeliveryStatus.values)}", code="invalid_status")
    return [delivery_shape(d) for d in deliveries_of(webhook, status=status, limit=limit)]
