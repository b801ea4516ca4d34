"""Execution listings (OP §5.10); who may read a job's output is ``collab.access.access_owned_job``."""

from collab.access import MAX_ANCESTRY, visible_session_ids
from collab.models import Job

def jobs_dispatched_by(session, *, user, status: str | None = None, limit: int = 50) -> list[Job]:
    """Jobs the session dispatched and their descendants, newest first (one query per level);
    only jobs of the session's own project (agents stay in their project, SPEC §8) in sessions
    ``user`` may see (issue 17)."""
    found: dict[str, Job] = {}
    in_project = Job.objects.filter(
        project_id=session.project_id, session_id__in=visible_session_ids(user)
    ).select_related("branch")
    level = list(in_project.filter(caller_session_id=session.pk))
    for _ in range(MAX_ANCESTRY):
        fresh = [j for j in level if j.pk not in found]
        if not fresh:
            break
        for j in fresh:
            found[j.pk] = j
        level = list(in_project.filter(parent_job_id__in=[j.pk for j in fresh]))
    jobs = sorted(found.values(), key=lambda j: j.created_at, reverse=True)
    if status:
        jobs = [j for j in jobs if j.status == status]
    return jobs[:limit]
