"""Execution listings (docs/contract.md#plans-and-jobs); who may read a job's output is
``collab.access.access_owned_job``."""

from django.db.models import Q, Subquery

from collab.access import MAX_ANCESTRY, visible_session_ids
from collab.models import TERMINAL_STATUSES, Job, JobStatus


def session_executions(session, *, status: str | None = None, limit: int = 100) -> list[Job]:
    """A session's executions, newest first (``GET /api/executions``); ``limit`` kept in 1–500."""
    jobs = Job.objects.filter(session=session).with_result().order_by("-created_at")  # each one's result too
    if status:
        jobs = jobs.filter(status=status)
    return list(jobs[: max(1, min(limit, 500))])


def ended_job(job_id: str) -> Job:
    """A job with its result and branch, as it is now (a foreground call's answer reads it)."""
    return Job.objects.with_result().select_related("branch").get(pk=job_id)


def job_status(job_id: str) -> str | None:
    """A job's status now (None: no such job)."""
    return Job.objects.filter(pk=job_id).values_list("status", flat=True).first()


def has_ended(job_id: str) -> bool:
    """Whether the job has ended (a job that is gone has too: nothing will change it)."""
    return job_status(job_id) in (*TERMINAL_STATUSES, None)


def sessions_owing_results(branch) -> list[str]:
    """The sessions running jobs whose results will be owed to ``branch`` (its mailbox): where
    the events that fill it are written (``collab.realtime.changes``)."""
    return list(Job.objects.filter(caller_branch=branch).exclude(status__in=TERMINAL_STATUSES)
                .values_list("session_id", flat=True).distinct())


def jobs_dispatched_by(session, *, user, status: str | None = None, limit: int = 50) -> list[Job]:
    """Jobs the session dispatched and their descendants, newest first (one query per level);
    only jobs of the session's own project (agents stay in their project) in sessions
    ``user`` may see."""
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


def queue_place(job: Job) -> dict | None:
    """Where a queued job stands (``GET /api/executions/{id}``'s ``queue``), None once it is no
    longer queued: ``position``, 1 for the oldest of its project's queued jobs (the queue is
    first come, first served; only the project's own jobs are counted, never another project's);
    ``waiting_for`` says what it waits for — ``"branch"`` (an earlier job of its agent runs or is
    queued first), ``"project_cap"`` (its project has ``max_running_jobs`` jobs running) or
    ``"slot"`` (a worker slot: it is next in line as soon as a worker takes it)."""
    if job.status != JobStatus.QUEUED:
        return None
    # the job's time compared in the database, as the claim compares it (a value read back into
    # Python may not compare equal to the stored one on SQLite)
    created = Subquery(Job.objects.filter(pk=job.pk).values("created_at"))
    queued = Job.objects.filter(project_id=job.project_id, status=JobStatus.QUEUED).exclude(pk=job.pk)
    ahead = queued.filter(Q(created_at__lt=created) | Q(created_at=created, pk__lt=job.pk)).count()
    if Job.objects.open().filter(branch_id=job.branch_id, created_at__lt=created).exists():
        waiting_for = "branch"
    elif job.waiting_since is not None:
        waiting_for = "project_cap"
    else:
        waiting_for = "slot"
    return {"position": ahead + 1, "waiting_for": waiting_for}
