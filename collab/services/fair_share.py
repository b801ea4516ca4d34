"""Fair share between projects (issue 11 item 6, P-SEC-6): a cap on a project's jobs in worker slots.

A worker claiming a job first takes the project's row lock (lock order: project →
session → branch → job) and counts the project's jobs running in worker slots;
at the cap the claim is declined and the job stays queued, so one project's queue
cannot hold every worker while other projects' turns wait. A declined job is
never lost: when a job of the project ends it wakes the project's oldest waiting
jobs, and the reconciler re-enqueues any queued job left waiting.

Inline jobs (a foreground ``agent`` child) run in their caller's slot and neither
count nor wait.
"""

from django.db.models import Exists, OuterRef

from accounts.limits import effective_limit
from accounts.models import Project
from collab.models import Job, JobStatus
from collab.services.admission import enqueue_job


def _in_worker_slots(project_id: int):
    return Job.objects.running().filter(project_id=project_id, run_in_background=True)


def take_running_slot(project_id: int) -> bool:
    """True if the project may start one more job in a worker slot now.

    Precondition: inside the claim's transaction, before the job row is touched. The
    project row stays locked until that transaction ends, so concurrent claims of one
    project count one after another and the cap is never overshot."""
    # FOR NO KEY UPDATE: it serializes claims, yet never waits for (or blocks) the key-share locks
    # every insert of a job or an event of the project takes on this row through its foreign key
    project = Project.objects.select_for_update(no_key=True).get(pk=project_id)
    return _in_worker_slots(project_id).count() < effective_limit(project, "max_running_jobs")


def wake_waiting_in_project(project: Project, *, ended_branch_id: str) -> None:
    """A worker slot of the project was freed: hand its oldest waiting jobs back to the queue,
    as many as it has free slots (a claim that loses again is harmless).

    Precondition: inside the completion transaction of the job that ended (enqueued on commit).
    The ended job's own branch is woken by its own rule (``enqueue_next_on_branch``)."""
    project_id = project.pk
    free = effective_limit(project, "max_running_jobs") - _in_worker_slots(project_id).count()
    if free <= 0:
        return
    busy = Job.objects.running().filter(branch=OuterRef("branch"))
    earlier = Job.objects.filter(branch=OuterRef("branch"), status=JobStatus.QUEUED, created_at__lt=OuterRef("created_at"))
    waiting = (
        Job.objects.filter(project_id=project_id, status=JobStatus.QUEUED, run_in_background=True)
        .exclude(branch_id=ended_branch_id)
        .filter(~Exists(busy), ~Exists(earlier))
        .order_by("created_at").values_list("pk", flat=True)[:free]
    )
    for job_id in waiting:
        enqueue_job(job_id)
