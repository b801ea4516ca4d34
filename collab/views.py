"""HTMX pages. Each view: authorize through ``collab.access``, call one service or selector, render.
htmx requests get the partial, plain requests the whole page."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from accounts.limits import FIELDS as LIMIT_FIELDS
from accounts.limits import LimitError, limits_of
from accounts.models import DEFAULT_TOKEN_SCOPES, ApiToken, TokenScope
from accounts.policy import member_roles
import json
import uuid
from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.http import StreamingHttpResponse

from collab import access
from collab.errors import DomainError, Invalid, NotFound
from collab.selectors.children import child_rail
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
from collab.services.cancel import CANCEL, do_execution_command
from collab.selectors import pages
from collab.selectors.shapes import usage_totals
from collab.selectors.audit import PAGE_SIZE as AUDIT_PAGE_SIZE
from collab.selectors.audit import event_record, project_events
from collab.services.projects import do_set_limits, do_update_project
from collab.services.watch import access_hold, do_decide_hold
from collab.services.sessions import do_create_session
from collab.services.visibility import do_set_shares, do_set_visibility, parse_share_lines, visibility_context
from collab.services.turns import do_fork_and_start, do_start_user_turn


@login_required
@require_GET
def projects(request):
    memberships = member_roles(request.user).select_related("project").order_by("project__slug")
    return render(request, "collab/projects.html",
                  {"memberships": memberships, "invitations": invitations_of(request.user)})


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
        "can_manage_members": access.can(request.user, project.pk, "project.members"),
        "members": members_of(project),
        "roles": ["viewer", "member", "maintainer", "owner"],
        "can_audit": access.can(request.user, project.pk, "project.audit"),
        "limit_errors": errors or {},
        "withheld_tools": withheld_tools(project) if project.workspace else {},
    }


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


# What each live piece of the session page needs; a partial refresh computes only its own.
_PART_CONTEXT = {
    "transcript": lambda request, session: {
        "t": pages.transcript(session, request.GET.get("branch"), request.GET.get("head"), viewer=request.user)},
    "jobs": lambda request, session: {"jobs": pages.recent_jobs(session), "usage": usage_totals(session.jobs.all())},
    "activity": lambda request, session: {"events": pages.recent_events(session, request.user), "holds": pages.pending_holds(session, request.user)},
    "branches": lambda request, session: {"branches": pages.branches(session)},
    "agents": lambda request, session: {"agents": child_rail(session)},
}


def _session_context(request, session, parts=tuple(_PART_CONTEXT)):
    # a sub-agent's session is a read-only transcript: no composer, no fork, no cancel (OW acc. 21)
    context = {"session": session, "readonly": session.is_child,
               "can_post": not session.is_child and access.can_in_session(request.user, session, "turn.start")}
    for part in parts:
        context.update(_PART_CONTEXT[part](request, session))
    return context


@login_required
@require_GET
def session(request, sid):
    session = access.access_session(request.user, sid)
    context = {**_session_context(request, session), **visibility_context(request.user, session)}
    return render(request, "collab/session.html", context)


SESSION_PARTIALS = frozenset(_PART_CONTEXT)


@login_required
@require_GET
def session_partial(request, sid, part):
    """One live-refreshed piece of the session page (htmx re-fetches it on each event)."""
    session = access.access_session(request.user, sid)
    return render(request, f"collab/session.html#{part}", _session_context(request, session, [part]))


@login_required
@require_POST
def post_turn(request, sid):
    session = access.access_session(request.user, sid, "turn.start")
    do_start_user_turn(request.user, session, request.POST.get("prompt", ""), branch=request.POST.get("branch") or None)
    if request.htmx:
        session.refresh_from_db()
        return render(request, "collab/session.html#transcript", _session_context(request, session, ["transcript"]))
    return redirect("collab:session", sid=sid)


@login_required
@require_POST
def fork(request, sid, mid):
    message = access.access_message(request.user, sid, mid, "turn.start")
    job = do_fork_and_start(request.user, message.session, message, request.POST.get("prompt", ""))
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
        return render(request, "collab/session.html#jobs", _session_context(request, session, ["jobs"]))
    return redirect("collab:session", sid=sid)


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
    rows = ApiToken.objects.filter(user=request.user).order_by("-created_at")
    return render(request, "collab/tokens.html", {
        "tokens": rows, "created": created, "scopes": TokenScope.values, "default_scopes": DEFAULT_TOKEN_SCOPES,
        "lifetimes": [d for d in TOKEN_LIFETIMES if d],
    })


@login_required
@require_POST
def revoke_token_view(request, token_id):
    token = ApiToken.objects.filter(pk=token_id, user=request.user).first()
    if token is None:
        raise NotFound()
    do_revoke_token(request.user, token)
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


@login_required
@require_GET
def audit(request, slug):
    """A project's event log for maintainers: filter, page, or export as JSON lines."""
    project = access.access_project(request.user, slug, "project.audit")
    filters = {k: request.GET.get(k, "").strip() for k in AUDIT_FILTERS}
    events = project_events(project, viewer=request.user, **filters)
    if request.GET.get("format") == "jsonl":
        lines = (json.dumps(event_record(e), ensure_ascii=False) + "\n" for e in events.iterator(chunk_size=500))
        response = StreamingHttpResponse(lines, content_type="application/x-ndjson; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{project.slug}-events.jsonl"'
        return response
    page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    query = urlencode({k: v for k, v in filters.items() if v})
    return render(request, "collab/audit.html", {"project": project, "page": page, "filters": filters, "query": query})


@login_required
@require_POST
def decide_hold(request, sid, hold_id):
    hold = access_hold(request.user, hold_id)
    if hold.sender_session_id != sid:
        raise NotFound()
    do_decide_hold(request.user, hold, approve=request.POST.get("decision") == "approve")
    return redirect("collab:session", sid=sid)


@login_required
@require_POST
def project_settings(request, slug):
    project = access.access_project(request.user, slug, "project.settings")
    do_update_project(request.user, project, watch_policy=request.POST.get("watch_policy"))
    return redirect("collab:project", slug=slug)


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
