"""Reads of OpenWork children: their ``list_agents`` and the agent rail of the parent's page
(docs/contract.md#the-openwork-toolset)."""

from django.db.models import Max, Min, OuterRef, Subquery, Sum

from collab.models import Branch, Job, JobStatus, Session

# list_agents status of a child, from its latest job
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
    """The branch's OpenWork children as its agent sees them: an internal child (hidden
    from agents) is neither listed nor found by its task_name."""
    return Branch.objects.filter(parent_branch=branch, task_name__isnull=False, internal=False)


def with_last_turn(branches):
    """Annotate child branches with their latest job's status and creation time (one subquery each)."""
    latest = Job.objects.filter(branch=OuterRef("pk")).order_by("-created_at")
    return branches.annotate(
        last_status=Subquery(latest.values("status")[:1]), last_created=Subquery(latest.values("created_at")[:1])
    )


def status_of(last_status: str | None) -> str:
    return _STATUS.get(last_status, "idle")


def list_children(branch: Branch) -> list[dict]:
    """OpenWork's ``list_agents``: the direct children, by name, with the status of their latest turn."""
    rows = (
        with_last_turn(children_of(branch))
        .order_by("task_name")
        .values("task_name", "last_status", "last_created", "created_at")
    )
    return [
        {
            "task_name": row["task_name"],
            "status": status_of(row["last_status"]),
            "started_at": (row["last_created"] or row["created_at"]).isoformat(),
        }
        for row in rows
    ]


def child_rail(session: Session, child_session_id: str | None = None) -> list[dict]:
    """The session page's agent rail: direct child sessions with status, duration and tokens (one query);
    only the one in ``child_session_id`` when given (a live patch of one row)."""
    rows = Branch.objects.filter(session__parent_session=session, task_name__isnull=False)
    if child_session_id is not None:
        rows = rows.filter(session_id=child_session_id)
    children = (
        with_last_turn(rows)
        .annotate(
            tokens=Sum("jobs__tokens_in") + Sum("jobs__tokens_out"),
            first_start=Min("jobs__started_at"),
            last_finish=Max("jobs__finished_at"),
        )
        .order_by("task_name")
    )
    out = []
    for child in children:
        status = status_of(child.last_status)
        duration = None
        if child.first_start and child.last_finish and status != "running":
            duration = (child.last_finish - child.first_start).total_seconds()
        out.append({"task_name": child.task_name, "session_id": child.session_id, "status": status,
                    "duration": duration, "tokens": child.tokens or 0})
    return out
