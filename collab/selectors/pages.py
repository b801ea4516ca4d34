"""What the pages show, already limited to what the viewer may see (callers authorize the session)."""

from django.db.models import Q

from collab.access import visible_sessions
from collab.models import ACTIVE_STATUSES, Branch, Event, Job, Message, MessageKind, Session
from collab.selectors.redact import hidden_among, redact_events, redact_messages
from collab.selectors.transcript import lineage

TRANSCRIPT_WINDOW = 200


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
    """The shown branch's last messages, each with the attach pointers hanging off it (one query)
    that point into sessions ``viewer`` may see (issue 17: a card names no session they may not)."""
    branch = shown_branch(session, branch_id, head_id)
    messages = lineage(branch.tip, TRANSCRIPT_WINDOW) if branch else []
    attaches: dict[str, list[Message]] = {}
    if messages:
        pointers = list(Message.objects.filter(predecessor_id__in=[m.pk for m in messages], kind=MessageKind.ATTACH))
        targets = {(p.metadata or {}).get("attach", {}).get("session_id") for p in pointers}
        targets |= {(m.metadata or {}).get("spawned_from_session") for m in messages}
        targets.discard(None)
        seen = set(visible_sessions(viewer).filter(pk__in=targets).values_list("pk", flat=True)) if targets else set()
        for pointer in pointers:
            if (pointer.metadata or {}).get("attach", {}).get("session_id") in seen:
                attaches.setdefault(pointer.predecessor_id, []).append(pointer)
        for m in messages:
            if (m.metadata or {}).get("spawned_from_session") not in seen | {None}:
                m.metadata = {k: v for k, v in m.metadata.items() if k not in ("spawned_from_session", "caller")}
                m.spawned_from_hidden = True  # shown as "another session", no link
        # a prompt's "[task from SID:MSG]", a result's "[result from SID:MSG]", a tool call's
        # arguments: a hidden session's id reads "another session" (one query)
        redact_messages(viewer, session.pk, messages)
    for m in messages:
        m.attaches = attaches.get(m.pk, [])
    running = Job.objects.filter(branch=branch, status__in=ACTIVE_STATUSES).first() if branch else None
    return {"branch": branch, "messages": messages, "clipped": bool(messages) and messages[0].depth > 0,
            "selected": head_id, "running": running.status if running else None,
            "generating": generating_text(running) if running else ""}


def generating_text(job: Job) -> str:
    """What a streaming model has said so far in the running job's current model call."""
    deltas = list(
        Event.objects.filter(session_id=job.session_id, type="message.delta", payload__job=job.pk)
        .order_by("seq").values_list("payload", flat=True)
    )
    if not deltas:
        return ""
    current = deltas[-1].get("call")
    return "".join(d.get("text", "") for d in deltas if d.get("call") == current)


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


def recent_events(session: Session, viewer, limit: int = 25) -> list[dict]:
    """The session's latest events as ``viewer`` may see them: a field naming another session
    they may not see (an agent spawned into it, a delivery to or from it) is blanked, with the
    name and preview that describe it (issue 17; ``collab.selectors.redact``)."""
    return redact_events(viewer, session.pk, session.events.order_by("-seq")[:limit])


def pending_holds(session: Session, viewer):
    """Deliveries from this session waiting for a person; one to a session ``viewer`` may not
    see says only "another session" (``target_hidden``), no name (issue 17)."""
    holds = list(session.held_deliveries.filter(status="pending").select_related("target_branch"))
    hidden = hidden_among(viewer, {h.target_branch.session_id for h in holds}, own=session.pk)
    for h in holds:
        h.target_hidden = h.target_branch.session_id in hidden
    return holds
