"""HTMX pages. Each view: authorize through ``collab.access``, call one service or selector, render.
htmx requests get the partial, plain requests the whole page."""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.limits import FIELDS as LIMIT_FIELDS
from accounts.limits import LimitError, limits_of
from accounts.models import DEFAULT_TOKEN_SCOPES, TokenScope
from accounts.policy import member_roles, visible_projects
from accounts.services import note_home_visit
import json
import uuid
from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.http import HttpResponse, StreamingHttpResponse

from collab import access
from collab.errors import DomainError, Forbidden, Invalid, NotFound
from collab.forms import AgentSpecForm, DecisionForm
from collab.inbox_api import decide_inbox_item
from collab.selectors.inbox import inbox_items
from collab.models import AgentRole, FollowupMode, Toolset
from collab.models import TERMINAL_STATUSES
from collab.selectors.children import child_rail
from collab.tools.reference import tool_reference
from collab.tools.surface import withheld_tools
from collab.services.members import (
    do_accept_invitation,
    do_add_member,
    do_change_role,
    do_decline_invitation,
    do_remove_member,
)
from collab.selectors.members import invitations_of, members_of
from collab.services.tokens import TOKEN_LIFETIMES, do_issue_token, do_revoke_token
from collab.selectors.tokens import tokens_of
from collab.selectors.specs import specs_of
from collab.services.archive import do_archive_branch
from collab.services.cancel import CANCEL, do_execution_command
from collab.services.connections import connections_for
from collab.services.specs import do_add_agent_spec, do_update_agent_spec
from collab.selectors import pages
from collab.selectors.search import DEFAULT_LIMIT
from collab.selectors.search import search as find
from collab.selectors.specs import spec_by_agent_id
from collab.selectors.transcript import page_transcript
from collab.selectors.activity import activity_page, paging
from collab.selectors.stats import project_stats, session_stats
from collab.selectors.dag import dag_page
from collab.selectors.replay import check_at, replay_state
from collab.selectors.shapes import session_usage
from collab.selectors.audit import PAGE_SIZE as AUDIT_PAGE_SIZE
from collab.selectors.audit import audit_rows, event_records, project_events
from collab.services.projects import approvable_tools, do_create_project, do_set_limits, do_update_project
from collab.services.holds import do_decide_hold
from collab.services.webhooks import do_create_webhook, do_delete_webhook, do_rotate_webhook_secret, do_update_webhook
from collab.selectors.webhooks import webhooks_of
from collab.services.sessions import do_create_session
from collab.services.visibility import do_set_shares, do_set_visibility, parse_share_lines, visibility_context
from collab.services.turns import do_fork_and_start, do_start_user_turn, spec_strategy


def _render_projects(request, values=None, error: DomainError | None = None, home=None):
    """The projects page: the user's projects and invitations, and the "New project" form
    (with what was typed and the refusal, by the field it is about, when it was refused);
    ``home``: what runs and what ended (``pages.home``), shown above them."""
    memberships = member_roles(request.user).select_related("project").order_by("project__slug")
    errors = {error.extra.get("field", "form"): error.detail} if error is not None else {}
    return render(request, "collab/projects.html",
                  {"memberships": memberships, "invitations": invitations_of(request.user),
                   "new_project": values or {}, "new_project_errors": errors, "home": home},
                  status=error.status if error is not None else 200)


@login_required
@require_GET
def projects(request):
    """The home page: the turns running now and those ended since the person's previous visit,
    across their projects (this visit is noted: the next one starts from it), then the projects."""
    last_visit = note_home_visit(request.user)
    return _render_projects(request, home=pages.home(request.user, last_visit))


@login_required
@require_http_methods(["GET", "POST"])
def new_project(request):
    """The projects page's "New project" form: the service of ``POST /api/projects`` (its slug
    rules and per-person limit, the starter agent), then the new project's page; a refusal
    re-renders the form with it."""
    if request.method != "POST":
        return _render_projects(request)
    values = {"name": request.POST.get("name", ""), "slug": request.POST.get("slug", "")}
    try:
        project = do_create_project(request.user, slug=values["slug"], name=values["name"])
    except DomainError as exc:  # a refusal of this form (limit included): shown on it
        return _render_projects(request, values, exc)
    return redirect("collab:project", slug=project.slug)


@login_required
@require_POST
def answer_invitation(request, invitation_id, answer):
    """Accept (then open the project) or decline one of the user's own pending invitations."""
    if answer == "accept":
        membership = do_accept_invitation(request.user, invitation_id)
        return redirect("collab:project", slug=membership.project.slug)
    do_decline_invitation(request.user, invitation_id)
    return redirect("collab:projects")


def _project_context(request, project, errors=None):
    search = request.GET.get("q", "").strip()[:200]
    return {
        "project": project,
        "sessions": pages.top_level_sessions(project, request.user, search),
        "session_count": pages.visible_session_count(project, request.user),
        "search": search,
        "limits": limits_of(project),
        "can_configure": access.can(request.user, project.pk, "project.settings"),
        "approvable_tools": approvable_tools(),
        "can_manage_members": access.can(request.user, project.pk, "project.members"),
        "members": members_of(project),
        "roles": ["viewer", "member", "maintainer", "owner"],
        "can_audit": access.can(request.user, project.pk, "project.audit"),
        "can_manage_specs": access.can(request.user, project.pk, "agent_spec.manage"),
        "limit_errors": errors or {},
        "withheld_tools": withheld_tools(project) if project.workspace else {},
        "stats": project_stats(project, request.user),
        "specs": specs_of(project),
        **_webhooks_context(request, project),
    }


def _webhooks_context(request, project) -> dict:
    may = access.can(request.user, project.pk, "project.webhooks")
    return {"can_manage_webhooks": may, "webhooks": list(webhooks_of(project)) if may else [],
            "webhook_hosts_configured": bool(settings.TRELLIS_WEBHOOK_HOSTS)}


@login_required
@require_POST
def project_webhooks(request, slug):
    """The project page's webhook forms (maintainers and owners): add, turn on/off, rotate the
    secret, delete. A new secret is shown on the page this once, never again."""
    project = access.access_project(request.user, slug, "project.webhooks")
    action = request.POST.get("action")
    context = {}
    try:
        if action == "add":
            webhook, secret = do_create_webhook(request.user, project, url=request.POST.get("url", "").strip(),
                                                description=request.POST.get("description", ""))
            context = {"new_secret": secret, "new_secret_for": webhook.pk}
        else:
            webhook = access.access_webhook(request.user, request.POST.get("webhook", ""), project_id=project.pk)
            if action == "rotate":
                _, secret = do_rotate_webhook_secret(request.user, webhook)
                context = {"new_secret": secret, "new_secret_for": webhook.pk}
            elif action == "toggle":
                do_update_webhook(request.user, webhook, active=request.POST.get("active") == "1")
            elif action == "delete":
                do_delete_webhook(request.user, webhook)
            else:
                raise Invalid("unknown action", code="invalid_action")
    except DomainError as exc:
        return render(request, "collab/project.html",
                      {**_project_context(request, project), "webhook_error": exc.detail}, status=exc.status)
    if context:  # the secret goes in this answer only: rendered, not redirected to
        return render(request, "collab/project.html", {**_project_context(request, project), **context})
    return redirect(f"{reverse('collab:project', args=[slug])}#webhooks")


@login_required
@require_GET
def search(request):
    """The search page (``/search?q=…[&project=SLUG]``, the header's search box): what
    ``GET /api/search`` finds, each result linking to its session at that branch and message.
    Without words, the form alone; a query the selector refuses, the form with the reason (400)."""
    slug, q = request.GET.get("project") or "", request.GET.get("q", "")
    project = access.access_project(request.user, slug) if slug else None
    context = {"q": q, "project": project, "projects": visible_projects(request.user).order_by("name"),
               "results": None, "limit": DEFAULT_LIMIT}
    if q.strip():
        try:
            context["results"] = find(request.user, q, project)
        except Invalid as exc:  # shown beside the box
            return render(request, "collab/search.html", {**context, "error": exc.detail}, status=exc.status)
    return render(request, "collab/search.html", context)


@login_required
@require_GET
def project(request, slug):
    project = access.access_project(request.user, slug)
    return render(request, "collab/project.html", _project_context(request, project))


@login_required
@require_POST
def project_limits(request, slug):
    project = access.access_project(request.user, slug, "project.settings")
    changes = {name: request.POST.get(name, "").strip() or None for name in LIMIT_FIELDS if name in request.POST}
    try:
        do_set_limits(request.user, project, changes)
    except LimitError as exc:
        project.refresh_from_db()
        return render(request, "collab/project.html", _project_context(request, project, {exc.field: str(exc)}), status=400)
    return redirect("collab:project", slug=slug)


@login_required
@require_POST
def new_session(request, slug):
    project = access.access_project(request.user, slug, "turn.start")
    session = do_create_session(request.user, project, title=request.POST.get("title", ""), agent_id=request.POST.get("agent_id", ""))
    return redirect("collab:session", sid=session.pk)


# The branch each viewer last read in each session, in their own web session (the
# selection is per viewer: forks and agents never move what someone else lands on).
SHOWN_KEY = "collab.shown"
SHOWN_KEEP = 100  # sessions remembered per viewer


def remembered_branch(request, sid: str) -> str | None:
    shown = request.session.get(SHOWN_KEY)
    return shown.get(sid) if isinstance(shown, dict) else None


def remember_branch(request, sid: str, branch_id: str) -> None:
    """Note the branch this viewer reads in ``sid`` (written only when it changes)."""
    shown = request.session.get(SHOWN_KEY)
    shown = dict(shown) if isinstance(shown, dict) else {}
    if shown.get(sid) == branch_id:
        return
    shown.pop(sid, None)
    shown[sid] = branch_id
    request.session[SHOWN_KEY] = dict(list(shown.items())[-SHOWN_KEEP:])


def _mark_cancel_right(request, job) -> None:
    """``job.can_cancel``: the job row offers cancel only while it is open and the rule allows it."""
    job.can_cancel = job.status in ("queued", "running") and access.can_cancel(request.user, job)


def _transcript_context(request, session, branch_id: str | None = None, replay=None) -> dict:
    """The transcript this viewer reads: ``?branch=``/``?head=`` from their URL, else the branch
    they last read here, else the session's default (see ``resolve_shown``); ``replay``: as it was
    then (a replay does not change the branch remembered)."""
    if branch_id is None:  # what the viewer's own URL asks for
        branch_id, head_id = request.GET.get("branch") or None, request.GET.get("head") or None
    else:  # the branch a turn just went to, at its tip
        head_id = None
    remembered = None if branch_id or head_id else remembered_branch(request, session.pk)
    t = page_transcript(session, request.user, branch_id=branch_id, head_id=head_id, remembered=remembered,
                        replay=replay)
    if t["branch"] is not None and replay is None:
        remember_branch(request, session.pk, t["branch"].pk)
    running = t["running_job"]  # the page transcript's (one rule: a running or stopping job of the branch)
    return {"t": t, "shown_branch": t["branch"].pk if t["branch"] is not None else None, "running_job": running,
            "can_cancel_running": replay is None and running is not None and running.status == "running"
            and access.can_cancel(request.user, running)}


def _branches_context(request, session, replay=None) -> dict:
    shown = request.GET.get("branch") or remembered_branch(request, session.pk)
    return {"branches": pages.branches(session, replay=replay), "shown_branch": shown}


def _jobs_context(request, session, replay=None) -> dict:
    jobs = pages.recent_jobs(session, request.user, replay=replay)
    for j in jobs:  # only open jobs can be cancelled: the rule is asked for those few (never in a replay)
        if replay is None:
            _mark_cancel_right(request, j)
    return {"jobs": jobs, "usage": session_usage(session) if replay is None else None}


def _activity_context(request, session, replay=None) -> dict:
    """The activity feed; in a replay the events up to its own, and no holds to decide."""
    page = paging(request.GET)
    if replay is not None:
        page["before"] = min(page["before"] or replay.at + 1, replay.at + 1)
        return {"activity": activity_page(session, request.user, **page), "holds": [], "can_decide_holds": False}
    return {"activity": activity_page(session, request.user, **page),
            "holds": pages.pending_holds(session, request.user), "can_decide_holds": access.can_decide_holds(request.user, session)}


# What each live piece of the session page needs; a partial refresh computes only its own. A
# replay (``?at=N``) shows the transcript, jobs, activity and branches as they were; the
# sub-agent rail and the plots only live.
_PART_CONTEXT = {
    "transcript": _transcript_context,
    "jobs": _jobs_context,
    "activity": _activity_context,
    "branches": _branches_context,
    "agents": lambda request, session, replay=None: {"agents": child_rail(session) if replay is None else []},
    "stats": lambda request, session, replay=None: {"stats": session_stats(session) if replay is None else None},
}


def _session_context(request, session, parts=tuple(_PART_CONTEXT), replay=None):
    # a sub-agent's session is a read-only transcript: no composer, no fork, no cancel; a replay too
    context = {"session": session, "readonly": session.is_child, "replay": replay,
               "can_post": replay is None and _can_post(request, session)}
    for part in parts:
        context.update(_PART_CONTEXT[part](request, session, replay=replay))
    if "transcript" in parts:  # the branch list marks the branch the transcript shows
        context["shown_branch"] = context["t"]["branch"].pk if context["t"]["branch"] is not None else None
    return context


def _composer_context(request, session, branch) -> dict:
    """What the composer says and offers: the branch and agent a post goes to; on an archived
    branch a fork from its last message instead; archiving for those the rule allows. A branch
    without an agent spec in a session without one runs the scripted provider with no script,
    which answers with the prompt (docs/contract.md#the-scripted-provider): "echo"."""
    if branch is None:
        return {}
    spec = branch.agent_spec if branch.agent_spec_id else session.agent_spec
    return {"branch": branch, "agent": spec.agent_id if spec else NO_SPEC_AGENT, "strategy": spec_strategy(spec),
            "can_archive": not session.is_child and not branch.archived and access.can_archive(request.user, branch)}


NO_SPEC_AGENT = "echo (no agent spec)"


@login_required
@require_GET
def session(request, sid):
    """The session page; ``?at=N`` replays it as of event N of its log, read-only
    (docs/web-app.md#replay)."""
    session = access.access_session(request.user, sid)
    replay = _replay_of(request, session)
    context = {**_session_context(request, session, replay=replay), **visibility_context(request.user, session)}
    if replay is None:
        context["composer"] = _composer_context(request, session, context["t"]["branch"])
    else:
        context.update(can_change_visibility=False, replay_keep=_replay_keep(request))
    context.update(_dag_context(request, session, replay=replay))
    return render(request, "collab/session.html", context)


def _replay_of(request, session):
    """``?at=N``: the session's log read up to event N (``collab.selectors.replay``), else None."""
    at = check_at(request.GET.get("at"), session)
    return replay_state(session, at) if at is not None else None


def _replay_keep(request) -> str:
    """What a replay's step links carry on from the URL: the branch it names, if any."""
    branch = request.GET.get("branch")
    return f"&{urlencode({'branch': branch})}" if branch else ""


def _dag_context(request, session, replay=None, **cursor) -> dict:
    """The graph column: ``?at=N`` replays it as of event N."""
    if replay is None:
        replay = _replay_of(request, session)
    return {"dag": dag_page(session, request.user, replay=replay, selected=request.GET.get("head"), **cursor),
            "replay_keep": _replay_keep(request)}


@login_required
@require_GET
def session_dag(request, sid):
    """A piece of the graph: ``?before=MID`` the page older than that row (with the next "load older"
    link), ``?since=MID`` the live block from that row on, neither the whole column."""
    session = access.access_session(request.user, sid)
    before, since = request.GET.get("before") or None, request.GET.get("since") or None
    if before and since:
        raise Invalid("give before or since, not both", code="invalid_cursor")
    part = "older" if before else "live" if since or request.htmx else "column"
    context = {"session": session, "dag_part": part, **_dag_context(request, session, before=before, since=since)}
    return render(request, "collab/_dag.html", context)


SESSION_PARTIALS = frozenset(_PART_CONTEXT)


@login_required
@require_GET
def session_partial(request, sid, part):
    """One live-refreshed piece of the session page (htmx re-fetches it on each event)."""
    session = access.access_session(request.user, sid)
    return render(request, f"collab/session.html#{part}", _session_context(request, session, [part]))


def _human(exc: DomainError) -> str:
    """A refusal as a person reads it on the page (the API keeps its ``code``)."""
    if exc.code == "archived":
        return ("This branch is archived: it takes no new messages. "
                "Open it and use “fork from here” to continue from its last message.")
    return exc.detail


# --- live fragments ---------------------------------------------------------------------------
# The page's script asks for exactly what one event changed; each answer costs the same however
# long the session is. Out-of-band pieces (hx-swap-oob) ride along with the row they belong to.


@login_required
@require_GET
def session_rows(request, sid):
    """The shown branch's rows after message ``after`` (``?branch=B&after=M``), then its running
    indicator out of band. 409 when the page is too far behind: it reloads its transcript."""
    session = access.access_session(request.user, sid)
    try:
        t = pages.rows_after(session, _branch_param(request, session), request.GET.get("after") or None, viewer=request.user)
    except pages.TooFarBehind:
        return HttpResponse("reload the transcript", status=409, content_type="text/plain")
    t.update(_running_context(request, t["branch"]))
    return render(request, "collab/session.html#rows", {**_live_context(request, session), "t": t,
                                                        "running_job": t["running_job"],
                                                        "can_cancel_running": t["can_cancel_running"]})


@login_required
@require_GET
def session_running(request, sid):
    """The running indicator of branch ``?branch=B`` (a streaming model's text so far)."""
    session = access.access_session(request.user, sid)
    branch = pages.shown_branch(session, _branch_param(request, session))
    if branch is None:
        raise NotFound()
    t = _running_context(request, branch)
    return render(request, "collab/session.html#running", {**_live_context(request, session), "t": t, "running_job": t["running_job"],
                                                           "can_cancel_running": t["can_cancel_running"]})


@login_required
@require_GET
def message_row(request, sid, mid):
    """One transcript row, re-rendered (an attach pointer was hung off it), as the page showing
    branch ``?branch=`` renders it."""
    session = access.access_session(request.user, sid)
    shown = request.GET.get("branch")
    t = {"selected": None, "branch": pages.shown_branch(session, shown) if shown else None}
    m = pages.message_row(session, mid, viewer=request.user, branch=t["branch"])
    return render(request, "collab/_message.html", {**_live_context(request, session), "m": m, "t": t})


@login_required
@require_GET
def job_row(request, sid, job_id):
    """One job's row; out of band the job's branch row, the usage line once the job has ended (its
    tokens are final then: one aggregate per finished job, not per event), and — when ``?branch=``
    is the job's branch — the running indicator and, once the turn was cancelled, failed or
    interrupted, the transcript row its "Turn stopped" marker hangs on."""
    session = access.access_session(request.user, sid)
    job = pages.session_job(session, job_id, request.user)
    _mark_cancel_right(request, job)
    shown = request.GET.get("branch")
    t = _running_context(request, job.branch) if shown == job.branch_id else None
    return render(request, "collab/session.html#job_live", {
        **_live_context(request, session), "j": job,
        "usage": session_usage(session) if job.status in TERMINAL_STATUSES else None,
        "job_branch": pages.branch_row(session, job.branch_id), "t": t, "shown_branch": shown,
        "running_job": t["running_job"] if t else None, "can_cancel_running": bool(t and t["can_cancel_running"]),
        "stopped_row": pages.stopped_row(session, job, viewer=request.user) if t else None,
    })


@login_required
@require_GET
def branch_row(request, sid, branch_id):
    session = access.access_session(request.user, sid)
    return render(request, "collab/session.html#branch_row", {"session": session, "b": pages.branch_row(session, branch_id),
                                                              "shown_branch": request.GET.get("shown")})


@login_required
@require_GET
def agent_row(request, sid, child_sid):
    """The agent rail's row of the OpenWork child in session ``child_sid``."""
    session = access.access_session(request.user, sid)
    rows = child_rail(session, child_sid)
    if not rows:
        raise NotFound()
    return render(request, "collab/session.html#agent_row", {"a": rows[0]})


def _running_context(request, branch) -> dict:
    """The branch's running indicator, with the cancel button only for those the rule allows."""
    t = {**pages.running_state(branch), "branch": branch}
    running = t["running_job"]
    t["can_cancel_running"] = (running is not None and running.status == "running"
                               and access.can_cancel(request.user, running))
    return t


def _live_context(request, session) -> dict:
    return {"session": session, "can_post": _can_post(request, session)}


def _can_post(request, session) -> bool:
    return not session.is_child and access.can_in_session(request.user, session, "turn.start")


def _branch_param(request, session) -> str:
    """``?branch=``, else the branch this viewer reads in the session (their own selection)."""
    if request.GET.get("branch"):
        return request.GET["branch"]
    shown = pages.shown_branch(session, remembered_branch(request, session.pk))
    if shown is None:
        raise NotFound()
    return shown.pk


@login_required
@require_POST
def post_turn(request, sid):
    session = access.access_session(request.user, sid, "turn.start")
    try:
        job = do_start_user_turn(request.user, session, request.POST.get("prompt", ""), branch=request.POST.get("branch") or None,
                           multitask_strategy=request.POST.get("multitask_strategy") or None)
    except (NotFound, Forbidden):
        raise
    except DomainError as exc:
        return HttpResponse(_human(exc), status=exc.status, content_type="text/plain; charset=utf-8")
    if request.htmx:
        session.refresh_from_db()
        context = {**_session_context(request, session, []), **_transcript_context(request, session, job.branch_id)}
        return render(request, "collab/session.html#transcript", context)
    return redirect(f"{reverse('collab:session', args=[sid])}?branch={job.branch_id}")


@login_required
@require_POST
def fork(request, sid, mid):
    message = access.access_message(request.user, sid, mid, "turn.start")
    job = do_fork_and_start(request.user, message.session, message, request.POST.get("prompt", ""),
                            name=request.POST.get("name", ""))
    remember_branch(request, sid, job.branch_id)  # this person reads their fork; nobody else is moved
    return redirect(f"{reverse('collab:session', args=[sid])}?branch={job.branch_id}")


@login_required
@require_POST
def cancel_job(request, sid, job_id):
    job = access.access_job(request.user, job_id)
    if job.session_id != sid:
        raise NotFound()
    do_execution_command(
        request.user, job, command_id=f"ui-{uuid.uuid4().hex}", action=CANCEL,
        expected_version=_version(request.POST.get("version"), job), payload={},
    )
    session = access.access_session(request.user, sid)
    if request.htmx:
        job.refresh_from_db()
        _mark_cancel_right(request, job)
        return render(request, "collab/session.html#job_row", {**_live_context(request, session), "j": job})
    return _back_to_session(request, sid)


def _back_to_session(request, sid):
    """Back to the session page, on the branch the form was sent from (when it names one)."""
    url = reverse("collab:session", args=[sid])
    branch = request.POST.get("shown_branch", "")
    return redirect(f"{url}?{urlencode({'branch': branch})}" if branch else url)


@login_required
@require_POST
def archive_branch(request, sid, branch_id):
    """Archive a branch with a reason (docs/contract.md#archive): its starter or a maintainer
    (``access.require_can_archive``)."""
    branch = access.access_branch(request.user, branch_id, session_id=sid)
    access.require_can_archive(request.user, branch)
    do_archive_branch(branch, user=request.user, reason=request.POST.get("reason", ""))
    return redirect(f"{reverse('collab:session', args=[sid])}?{urlencode({'branch': branch.pk})}")


def _version(value: str | None, job) -> int:
    """The ``version`` a cancel form carries (the job's current one when absent)."""
    if not value:
        return job.version
    try:
        return int(value)
    except ValueError:
        raise Invalid("version must be a whole number", code="invalid_version") from None


@login_required
def tokens(request):
    """The user's API tokens: create (the value is shown once) and revoke."""
    created = None
    if request.method == "POST":
        days = request.POST.get("expires_in_days", "")
        if days not in TOKEN_LIFETIMES:
            raise Invalid(f"expires_in_days must be one of {', '.join(d or 'never' for d in TOKEN_LIFETIMES)}",
                          code="invalid_expiry")
        _, created = do_issue_token(
            request.user, request.user, name=request.POST.get("name", "")[:100],
            scopes=request.POST.getlist("scopes") or None, expires_at=TOKEN_LIFETIMES[days](),
        )
    return render(request, "collab/tokens.html", {
        "tokens": tokens_of(request.user), "created": created, "scopes": TokenScope.values, "default_scopes": DEFAULT_TOKEN_SCOPES,
        "lifetimes": [d for d in TOKEN_LIFETIMES if d],
    })


@login_required
@require_POST
def revoke_token_view(request, token_id):
    do_revoke_token(request.user, access.access_token(request.user, token_id))
    return redirect("collab:tokens")


@login_required
@require_POST
def project_members(request, slug):
    project = access.access_project(request.user, slug, "project.members")
    action, username = request.POST.get("action"), request.POST.get("username", "").strip()
    try:
        if action == "add":
            do_add_member(request.user, project, username, request.POST.get("role", "member"))
        elif action == "role":
            do_change_role(request.user, project, username, request.POST.get("role", ""))
        elif action == "remove":
            do_remove_member(request.user, project, username)
        else:
            raise Invalid("unknown action", code="invalid_action")
    except DomainError as exc:
        context = _project_context(request, project)
        context["member_error"] = exc.detail
        return render(request, "collab/project.html", context, status=exc.status)
    return redirect("collab:project", slug=slug)


AUDIT_FILTERS = ("session", "type", "actor", "since", "until")


def _audit_every(request) -> bool:
    """``?show=all``: every event, not only what an admin audits (``ADMIN_EVENT_TYPES``)."""
    show = request.GET.get("show", "")
    if show not in ("", "all"):
        raise Invalid('show must be "all" or left out', code="invalid_filter")
    return show == "all"


@login_required
@require_GET
def audit(request, slug):
    """A project's event log for maintainers, in sentences: what an admin audits by default, every
    event with ``?show=all``; filter, page, or export as JSON lines — the export is every event
    matching the filters whatever ``show`` says, records as ever (``event_record``)."""
    project = access.access_project(request.user, slug, "project.audit")
    filters = {k: request.GET.get(k, "").strip() for k in AUDIT_FILTERS}
    every = _audit_every(request)
    if request.GET.get("format") == "jsonl":
        events = project_events(project, viewer=request.user, **filters)
        lines = (json.dumps(record, ensure_ascii=False) + "\n" for record in event_records(events))
        response = StreamingHttpResponse(lines, content_type="application/x-ndjson; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{project.slug}-events.jsonl"'
        return response
    events = project_events(project, viewer=request.user, admin_only=not every, **filters)
    page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    page.object_list = audit_rows(page.object_list, viewer=request.user, project=project)
    asked = {k: v for k, v in filters.items() if v}
    return render(request, "collab/audit.html", {
        "project": project, "page": page, "filters": filters, "every": every,
        "query": urlencode({**asked, "show": "all"} if every else asked),  # the pager's and the export's
        "toggle_query": urlencode(asked if every else {**asked, "show": "all"}),
    })


@login_required
@require_POST
def decide_hold(request, sid, hold_id):
    hold = access.access_hold(request.user, hold_id, session_id=sid)
    decision = request.POST.get("decision")
    if decision not in ("approve", "reject"):
        raise Invalid('decision must be "approve" or "reject"', code="invalid_decision")
    do_decide_hold(request.user, hold, approve=decision == "approve")
    return redirect("collab:session", sid=sid)


# --- agent specs: who may save one through the API manages them here ------------------------------



def _render_specs(request, project, spec=None, form=None, status=200):
    form = form if form is not None else AgentSpecForm.of(spec)
    return render(request, "collab/specs.html", {
        "project": project, "specs": specs_of(project),
        "spec": spec, "form": form, "values": form.values(), "error": form.message(),
        "connections": connections_for(project), "toolsets": Toolset.values, "roles": AgentRole.values,
        "followup_modes": FollowupMode.values, "tool_groups": _tool_groups(project, spec),
    }, status=status)


def _tool_groups(project, spec) -> list[tuple[str, list]]:
    """(toolset, its tools described) for the page: a saved spec's toolset, as its agents get it;
    for a new spec, each toolset to choose from."""
    if spec is not None:
        return [(spec.toolset, tool_reference(spec.toolset, list(spec.tools or []), role=spec.role, project=project))]
    return [(toolset, tool_reference(toolset, [], role=AgentRole.GENERAL, project=project)) for toolset in Toolset.values]


def _save_spec(request, save) -> tuple[object, AgentSpecForm, int]:
    """Read the form and hand it to ``save`` (the service): (the spec saved or None, the form, the
    status of a refusal)."""
    form = AgentSpecForm(request.POST)
    if not form.is_valid():
        return None, form, 400
    try:
        return save(form), form, 200
    except (NotFound, Forbidden):
        raise
    except DomainError as exc:
        form.refuse(exc)
        return None, form, exc.status


@login_required
@require_http_methods(["GET", "POST"])
def specs(request, slug):
    """The project's agent specs: the list and a form for a new one."""
    project = access.access_project(request.user, slug, "agent_spec.manage")
    if request.method != "POST":
        return _render_specs(request, project)
    spec, form, status = _save_spec(request, lambda form: do_add_agent_spec(
        request.user, project, agent_id=form.cleaned_data["agent_id"].strip(), **form.spec_fields()))
    if spec is None:
        return _render_specs(request, project, form=form, status=status)
    return redirect("collab:spec", slug=slug, agent_id=spec.agent_id)


@login_required
@require_http_methods(["GET", "POST"])
def spec(request, slug, agent_id):
    """One agent spec: shown and changed (validated and audited like the API's and the admin's)."""
    project = access.access_project(request.user, slug, "agent_spec.manage")
    spec = spec_by_agent_id(project.pk, agent_id)
    if request.method != "POST":
        return _render_specs(request, project, spec)
    saved, form, status = _save_spec(request, lambda form: do_update_agent_spec(
        request.user, spec, form.spec_fields()) or spec)
    if saved is None:
        return _render_specs(request, project, spec, form=form, status=status)
    return redirect(f"{reverse('collab:spec', args=[slug, spec.agent_id])}?saved=1")


@login_required
@require_POST
def project_settings(request, slug):
    """The project page's settings form (owners): the watch policy and, when the form shows them
    (``approvals_shown``), the tools whose every call waits for a person (unchecked: none).
    A refusal shows beside the form, with the page's status."""
    project = access.access_project(request.user, slug, "project.settings")
    approvals = request.POST.getlist("approvals") if "approvals_shown" in request.POST else None
    try:
        do_update_project(request.user, project, watch_policy=request.POST.get("watch_policy"), approvals=approvals)
    except Invalid as exc:
        project.refresh_from_db()
        return render(request, "collab/project.html",
                      {**_project_context(request, project), "settings_error": exc.detail}, status=exc.status)
    return redirect(f"{reverse('collab:project', args=[slug])}#settings")


@login_required
@require_POST
def session_visibility(request, sid):
    """The session page's small form: visibility and the share list ("username role" per line)."""
    session = access.access_session(request.user, sid)
    do_set_visibility(request.user, session, request.POST.get("visibility", session.visibility))
    if "shares" in request.POST:
        session.refresh_from_db()
        do_set_shares(request.user, session, parse_share_lines(request.POST.get("shares", "")))
    return redirect("collab:session", sid=sid)


# --- the inbox: what waits for a person (docs/web-app.md#inbox) ----------------------------------

DONE = {"approve": "Approved.", "reject": "Rejected.", "answer": "Answered."}


@login_required
@require_GET
def inbox(request):
    """Every pending item the person may decide, oldest first, each with its controls."""
    return render(request, "collab/inbox.html", {"items": inbox_items(request.user)})


@require_GET
def needs_you(request):
    """The header's "Needs you" link, polled by every page. 286 (htmx: stop polling) once the
    person is logged out, never the login page swapped into the header."""
    if not request.user.is_authenticated:
        return HttpResponse(status=286)
    return render(request, "collab/_needs_you_link.html")


@login_required
@require_POST
def decide_item(request, item_id):
    """One of the inbox's forms: ``decide_inbox_item``, as ``POST /api/inbox/{id}``. Decided,
    the item leaves the list (htmx: it is removed in place, the counts follow out of band; else
    back to the inbox). Refused, the refusal shows beside the item, the typed arguments kept."""
    form = DecisionForm(request.POST)
    try:
        if not form.is_valid():
            raise Invalid(form.message(), code="invalid_arguments")
        fields = form.decision_fields()
        decided = decide_inbox_item(request.user, item_id, **fields)
    except DomainError as exc:
        return _refused_item(request, item_id, exc)
    done = DONE.get(fields["decision"], "Done.")
    if request.POST.get("place") == "graph":  # a waiting node's controls, on the session page's graph
        if not request.htmx:
            return redirect(f"{reverse('collab:session', args=[decided['session']])}?branch={decided['branch']}")
        return render(request, "collab/_dag_asks.html#decided", {"done": done, "item": item_id})
    if not request.htmx:
        return redirect("collab:inbox")
    return render(request, "collab/inbox.html#decided", {"done": done})


def _refused_item(request, item_id: str, exc: DomainError):
    """The item again with ``exc`` beside it (still pending: with its controls and what was
    typed; else the refusal alone). A plain form gets the whole inbox with the refusal's status;
    an outsider's item is a 404 as anywhere. From the graph (``place=graph``) the item comes back
    as the graph's card."""
    items = inbox_items(request.user)
    item = next((i for i in items if i["id"] == item_id), None)
    not_yours = isinstance(exc, (NotFound, Forbidden))
    if item is None and not_yours and not request.htmx:
        raise exc
    refused = item if item is not None else {"id": item_id, "gone": True}
    refused["error"] = "This item is gone, or it is not yours to decide." if not_yours else _human(exc)
    if "arguments" in request.POST:
        refused["typed"] = request.POST["arguments"]
    if request.htmx:  # htmx swaps only a 2xx answer: the refusal is in the fragment
        if request.POST.get("place") == "graph":
            return render(request, "collab/_dag_asks.html#card", {"i": refused})
        return render(request, "collab/inbox.html#item", {"i": refused})
    return render(request, "collab/inbox.html", {"items": items, "refused": None if item is not None else refused},
                  status=exc.status)
