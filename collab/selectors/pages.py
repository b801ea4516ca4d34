"""What the pages show, already limited to what the viewer may see (callers authorize the session)."""

from collab.models import Branch, Job, Session
from collab.selectors.transcript import lineage

TRANSCRIPT_WINDOW = 200


def shown_branch(session: Session, branch_id: str | None = None) -> Branch | None:
    if branch_id:
        return session.branches.filter(pk=branch_id).select_related("tip").first()
    if session.head_id:
        return Branch.objects.select_related("tip").get(pk=session.head.branch_id)
    return session.branches.select_related("tip").order_by("created_at").first()


def transcript(session: Session, branch_id: str | None = None) -> dict:
    branch = shown_branch(session, branch_id)
    messages = lineage(branch.tip, TRANSCRIPT_WINDOW) if branch else []
    return {"branch": branch, "messages": messages, "clipped": bool(messages) and messages[0].depth > 0}


def recent_jobs(session: Session, limit: int = 20) -> list[Job]:
    return list(session.jobs.select_related("branch").order_by("-created_at")[:limit])


def branches(session: Session) -> list[Branch]:
    return list(session.branches.select_related("tip").order_by("created_at"))


def top_level_sessions(project) -> list[Session]:
    return list(project.sessions.filter(parent_session__isnull=True).order_by("-last_active_at")[:200])
