"""Reads of OpenWork children (OW §5 list_agents, acc. 21 agent rail)."""

from django.db.models import Max, Min, OuterRef, Subquery, Sum

from collab.models import Branch, Job, JobStatus, Session

# list_agents status of a child, from its latest job (OW §5)
_STATUS = {
    JobStatus.QUEUED: "running",
    JobStatus.RUNNING: "running",
    JobStatus.STOPPING: "running",
    JobStatus.SUCCEEDED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.INTERRUPTED: "failed",
    JobStatus.CANCELLED: "cancelled",
}


def children_of(branch: Branch):
    return Branch.objects.filter(parent_branch=branch, task_name__isnull=False)


def list_children(branch: Branch) -> list[dict]:
    """``list_agents`` (OW): the direct children, by name, with the status of their latest turn."""
    latest = Job.objects.filter(branch=OuterRef("pk")).order_by("-created_at")
    rows = (
        children_of(branch)
        .annotate(last_status=Subquery(latest.values("status")[:1]), started=Subquery(latest.values("created_at")[:1]))
        .order_by("task_name")
        .values("task_name", "last_status", "started", "created_at")
    )
    return [
        {
            "task_name": row["task_name"],
            "status": _STATUS.get(row["last_status"], "idle"),
            "started_at": (row["started"] or row["created_at"]).isoformat(),
        }
        for row in rows
    ]


def child_rail(session: Session) -> list[dict]:
    """The session page's agent rail: direct child sessions with status, duration and tokens."""
    children = (
        Branch.objects.filter(session__parent_session=session, task_name__isnull=False)
        .select_related("session", "parent_branch")
        .annotate(
            tokens=Sum("jobs__tokens_in") + Sum("jobs__tokens_out"),
            first_start=Min("jobs__started_at"),
            last_finish=Max("jobs__finished_at"),
        )
        .order_by("task_name")
    )
    latest = {
        row["branch_id"]: row["status"]
        for row in Job.objects.filter(session__parent_session=session).order_by("branch_id", "created_at")
        .values("branch_id", "status")
    }
    out = []
    for child in children:
        status = _STATUS.get(latest.get(child.pk), "idle")
        duration = None
        if child.first_start and child.last_finish and status != "running":
            duration = (child.last_finish - child.first_start).total_seconds()
        out.append({
            "task_name": child.task_name, "session_id": child.session_id, "status": status,
            "duration": duration, "tokens": child.tokens or 0, "parent": child.parent_branch.display_name,
        })
    return out
