"""Fair share between projects (issue 11 item 6, P-SEC-6): a cap on a project's jobs in worker slots.

A worker claiming a job first takes the project's row lock (lock order: project →
session → branch → job); the claim's conditional UPDATE counts the project's jobs running
in worker slots; at the cap the claim is declined and the job stays queued, so one project's queue
cannot hold every worker while other projects' turns wait. A declined job is
never lost: when a job of the project ends it wakes the project's oldest waiting
jobs, and the reconciler re-enqueues any queued job left waiting.

Inline jobs (a foreground ``agent`` child) run in their caller's slot and neither
count nor wait.
"""

from django.db.models import Exists, F, Func, IntegerField, OuterRef, Subquery
from django.db.models.lookups import LessThan

from accounts.limits import effective_limit
from accounts.models import Project
from collab.models import Job, JobStatus
from collab.services.admission import enqueue_job


def _in_worker_slots(project_id: int):
    return Job.objects.running().filter(project_id=project_id, run_in_background=True)


def _running_count(project_id: int) -> Subquery:
    """The project's jobs in worker slots, counted inside another statement (one row, always:
    COUNT without GROUP BY)."""
    return Subquery(_in_worker_slots(project_id).order_by().annotate(
        n=Func(F("pk"), function="COUNT", output_field=IntegerField())).values("n"))


def lock_project_for_claim(project_id: int) -> Project:
    """The project, locked (FOR NO KEY UPDATE) and read after the lock: the first lock of a claim.

    Precondition: inside the claim's transaction, before the job row is touched. The project
    row stays locked until that transaction ends, so concurrent claims of one project count
    one after another (``running_slot_free``) and the cap is never overshot."""
    # NO KEY: it serializes claims, yet never waits for (or blocks) the key-share locks every
    # insert of a job or an event of the project takes on this row through its foreign key
    return Project.objects.select_for_update(no_key=True).get(pk=project_id)


def running_slot_free(project: Project):
    """A condition for the claim's own UPDATE (``execution.claim_job``): the project has fewer
    jobs in worker slots than its cap — counted by that statement, which runs after the project
    row is locked (``lock_project_for_claim``) and so sees every claim of the project that
    committed before it. None when the project has no cap."""
    cap = effective_limit(project, "max_running_jobs")
    if cap is None:
        return None
    return LessThan(_running_count(project.pk), cap)


def wake_waiting_in_project(project: Project, *, ended_branch_id: str) -> None:
    """A worker slot of the project was freed: hand its oldest waiting jobs back to the queue,
    as many as it has free slots (a claim that loses again is harmless).

    Precondition: inside the completion transaction of the job that ended (enqueued on commit).
    The ended job's own branch is woken by its own rule (``enqueue_next_on_branch``)."""
    project_id = project.pk
    cap = effective_limit(project, "max_running_jobs")
    if cap is None:  # no cap: no claim waits for a slot
        return
    busy = Job.objects.running().filter(branch=OuterRef("branch"))
    earlier = Job.objects.filter(branch=OuterRef("branch"), status=JobStatus.QUEUED, created_at__lt=OuterRef("created_at"))
    # one statement: the oldest waiting jobs, at most the cap of them, each with the project's
    # running count beside it (the same count for every row: one snapshot); the free slots are
    # the cap minus that count
    waiting = list(
        Job.objects.filter(project_id=project_id, status=JobStatus.QUEUED, run_in_background=True)
        .exclude(branch_id=ended_branch_id)
        .filter(~Exists(busy), ~Exists(earlier))
        .annotate(running=_running_count(project_id))
        .order_by("created_at").values_list("pk", "running")[:cap]
    )
    if not waiting:
        return
    free = cap - waiting[0][1]
    for job_id, _running in waiting[:max(free, 0)]:
        enqueue_job(job_id)
