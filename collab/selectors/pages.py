"""What the pages show, already limited to what the viewer may see (callers authorize the session)."""

from django.db.models import Q

from collab.access import visible_sessions
from collab.models import ACTIVE_STATUSES, Branch, Job, Message, Session
from collab.selectors.transcript import PAGE_WINDOW as TRANSCRIPT_WINDOW  # noqa: F401
from collab.selectors.transcript import generating_text, page_transcript  # noqa: F401


def shown_branch(session: Session, branch_id: str | None = None, head_id: str | None = None) -> Branch | None:
    """The branch a page shows: the one asked for, the one holding ``head_id``, else the selected HEAD's."""
    if branch_id:
        return session.branches.filter(pk=branch_id).select_related("tip").first()
    if head_id:
        holder = Message.objects.filter(pk=head_id, session=session).values_list("branch_id", flat=True).first()
        if holder:
            return Branch.objects.select_related("tip").get(pk=holder)
    if session.head_id:
        return Branch.objects.select_related("tip").get(pk=session.head.branch_id)
    return session.branches.select_related("tip").order_by("created_at").first()


def transcript(session: Session, branch_id: str | None = None, head_id: str | None = None, *, viewer) -> dict:
    """The shown branch's transcript as the session page renders it (see ``page_transcript``)."""
    return page_transcript(session, viewer, branch_id=branch_id, head_id=head_id)


def recent_jobs(session: Session, limit: int = 20) -> list[Job]:
    return list(session.jobs.select_related("branch").order_by("-created_at")[:limit])


def branches(session: Session) -> list[Branch]:
    rows = list(session.branches.order_by("archived", "created_at"))
    busy = set(Job.objects.filter(session=session, status__in=ACTIVE_STATUSES).values_list("branch_id", flat=True))
    for b in rows:
        b.busy = b.pk in busy
    return rows


def top_level_sessions(project, viewer, search: str = "") -> list[Session]:
    """The project's root sessions ``viewer`` may see (at most 200, most recent first; ``search``
    narrows by title or id), each with ``sub_agents``: its OpenWork children, listed under it
    rather than at the top level (OW acc. 2). Two queries, however many sessions (issue 17)."""
    roots = visible_sessions(viewer).filter(project=project, parent_session__isnull=True)
    if search:
        roots = roots.filter(Q(title__icontains=search) | Q(pk=search))
    sessions = list(roots.order_by("-last_active_at")[:200])
    children: dict[str, list] = {}
    for child in Session.objects.filter(parent_session__in=[s.pk for s in sessions]).order_by("title"):
        children.setdefault(child.parent_session_id, []).append(child)
    for s in sessions:
        s.sub_agents = children.get(s.pk, [])
    return sessions


def visible_session_count(project, viewer) -> int:
    """How many root sessions of the project ``viewer`` may see (one query)."""
    return visible_sessions(viewer).filter(project=project, parent_session__isnull=True).count()


def recent_events(session: Session, viewer, limit: int = 25):
    """The session's latest events, without those about another session ``viewer`` may not see
    (an agent spawned into it: its id and branch name stay out of the activity panel)."""
    events = list(session.events.order_by("-seq")[:limit])
    others = {e.payload.get("session") for e in events if isinstance(e.payload, dict)} - {None, session.pk}
    if not others:
        return events
    seen = set(visible_sessions(viewer).filter(pk__in=others).values_list("pk", flat=True))
    return [e for e in events if not isinstance(e.payload, dict) or e.payload.get("session") in seen | {None, session.pk}]


def pending_holds(session: Session):
    return list(session.held_deliveries.filter(status="pending").select_related("target_branch"))
