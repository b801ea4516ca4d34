"""Fair share between projects (docs/capacity.md#fair-share): a cap on a project's jobs in worker slots.

A worker claiming a job first takes the project's row lock (lock order: project →
session → branch → job); the claim's conditional UPDATE counts the project's jobs running
in worker slots; at the cap the claim is declined and the job stays queued, so one project's queue
cannot hold every worker while other projects' turns wait.

A declined job is never lost, and is handed back to the queue once per decline:

- the declined claim marks it (``Job.waiting_since``, ``wait_for_slot``) and, once the mark is
  committed, locks each job it then sees running, one row per transaction (so it never holds a
  lock while it waits for another: no cycle with a cancel's cascade or a completion). A
  completion that was ending one of them is waited for, and its slot is then seen free: the job is
  handed back to the queue there. Any other running job ends after the mark is committed, so its
  completion sees the mark;
- a completion that frees a worker slot wakes the project's oldest marked jobs, as many as it
  has free slots (``wake_waiting_in_project``), clearing each mark in the statement that picks it;
- a job that is merely queued (its task is still in the broker, no claim declined it) is not
  handed out again: its own task is on the way (a task whose slot went to a fairer job hands its
  own job out again: ``execution.claim_for_slot``);
- the reconciler still re-enqueues any queued job left waiting a lease since its last hand-off
  (``collab.services.reconcile``): the backstop if a hand-off is lost with a dead worker.

Inline jobs (a foreground ``agent`` child) run in their caller's slot and neither
count nor wait.
"""

from django.db import transaction
from django.db.models import Case, Count, Exists, F, Func, IntegerField, Min, OuterRef, Q, Subquery, When
from django.db.models.functions import Coalesce, Now
from django.db.models.lookups import LessThan

from accounts.limits import effective_limit
from accounts.models import Project
from collab.models import ACTIVE_STATUSES, Job, JobStatus
from collab.services.admission import enqueue_job
from collab.services.locking import update_returning
from collab.infra.prepared import Param, Select


def _in_worker_slots(project_id: int):
    return Job.objects.running().filter(project_id=project_id, run_in_background=True)


def _running_count(project_id: int) -> Subquery:
    """The project's jobs in worker slots, counted inside another statement (one row, always:
    COUNT without GROUP BY)."""
    return Subquery(_in_worker_slots(project_id).order_by().annotate(
        n=Func(F("pk"), function="COUNT", output_field=IntegerField())).values("n"))


# NO KEY: it serializes claims, yet never waits for (or blocks) the key-share locks every
# insert of a job or an event of the project takes on this row through its foreign key.
# Compiled once per process (collab.infra.prepared): every claim takes it
_LOCK_PROJECT = Select("lock_project", lambda: Project.objects.select_for_update(no_key=True)
                       .filter(pk=Param("id")).order_by())


def lock_project_for_claim(project_id: int) -> Project:
    """The project, locked (FOR NO KEY UPDATE) and read after the lock: the first lock of a claim.

    Precondition: inside the claim's transaction, before the job row is touched. The project
    row stays locked until that transaction ends, so concurrent claims of one project count
    one after another (``running_slot_free``) and the cap is never overshot."""
    return _LOCK_PROJECT.get(id=project_id)


def running_cap(project: Project) -> int | None:
    """How many of the project's jobs may hold worker slots at once; None: no cap."""
    return effective_limit(project, "max_running_jobs")


def running_slot_free(project_id, cap):
    """A condition for the claim's own UPDATE (``execution.claim_job``): the project has fewer
    jobs in worker slots than ``cap`` (``running_cap``) — counted by that statement, which runs
    after the project row is locked (``lock_project_for_claim``) and so sees every claim of the
    project that committed before it. ``project_id`` and ``cap`` may be values or expressions
    (the claim's ``Param``s: its SQL is compiled once, whatever the project)."""
    return LessThan(_running_count(project_id), cap)


def waiting_for_slot(project_id: int):
    """The project's queued jobs a claim declined for its cap and no completion has woken yet
    (the partial index ``job_waiting_for_slot`` holds exactly these)."""
    return Job.objects.filter(project_id=project_id, status=JobStatus.QUEUED, waiting_since__isnull=False)


def wait_for_slot(job_id: str, project: Project, claimable_but_for_the_cap) -> None:
    """The claim of ``job_id`` won nothing; if the project's cap is why, the job waits for
    a worker slot: marked, it is woken by the next completion that frees one
    (``wake_waiting_in_project``) — or handed back to the queue here, when a job of the project
    ended while this claim counted.

    ``claimable_but_for_the_cap``: the job's row under the claim's own conditions other than the
    cap (queued, its branch not busy, no earlier queued job on it). None of them can change while
    the claim holds its locks, so a row that meets them now was declined for the cap; one that
    does not is left alone (another claim took it, or its branch goes first and wakes it:
    ``execution.enqueue_next_on_branch``). Costs one statement then, two on a decline for the cap.

    Precondition: in the claim's transaction, right after its UPDATE matched nothing, with the
    project (``lock_project_for_claim``), the job's sessions and branch locked."""
    # the first decline's time is kept: since when it waits
    if not claimable_but_for_the_cap.update(waiting_since=Coalesce(F("waiting_since"), Now())):
        return
    project_id = project.pk
    transaction.on_commit(lambda: _hand_off_if_a_slot_is_free(job_id, project_id))


def _hand_off_if_a_slot_is_free(job_id: str, project_id: int) -> None:
    """After a decline's mark is committed: if the project has a worker slot free now, the job
    goes back to the queue (unmarked) — a completion that ended a job while the claim counted may
    have looked for marked jobs before this one's mark was committed, and would not wake it.

    Each job seen running is locked alone, in a transaction of its own: a completion that ended it
    and has not committed yet holds its row, and is waited for (the job is then seen ended); this
    holds no other lock while it waits, so it cannot close a cycle with a cancel's cascade or a
    completion (their locks come in another order: session → branch → job). Any job that ends
    later ends after the mark was committed: its completion sees the mark and wakes the job. The
    count may be low (a claim may start a job meanwhile): the job is then declined again, and
    marked again — never lost, and handed out once per decline (the clearing UPDATE is
    conditional: a completion's wake clears the mark in its own)."""
    running = 0
    for pk in list(_in_worker_slots(project_id).values_list("pk", flat=True)):
        with transaction.atomic():
            running += len(_in_worker_slots(project_id).filter(pk=pk).select_for_update(no_key=True)
                           .values_list("pk", flat=True))
    project = Project.objects.get(pk=project_id)  # its cap as it is now
    cap = running_cap(project)
    if cap is not None and running >= cap:
        return
    if waiting_for_slot(project_id).filter(pk=job_id).update(waiting_since=None, heartbeat_at=Now()):
        enqueue_job(job_id)  # heartbeat_at: when a queued job was last handed out (the reconciler's clock)


def _branch_blocker() -> Subquery:
    """For a queued job (the outer row): a job that keeps it from its branch — one running there,
    or one queued there before it — or NULL when none does. A scalar subquery, run per candidate
    on the index ``job_branch_status``."""
    return Subquery(Job.objects.filter(branch=OuterRef("branch")).filter(
        Q(status__in=ACTIVE_STATUSES) | Q(status=JobStatus.QUEUED, created_at__lt=OuterRef("created_at"))
    ).order_by().values("pk")[:1])


PICK_PROJECTS = 8  # projects a fair pick tries, fairest first, before it gives up on a pick


def fairest_queued_job(*, ruled_out=()) -> tuple[str, int] | None:
    """The queued job a free worker slot should run next when slots are contended, and its
    project: the oldest job of the project with the fewest jobs in worker slots (ties: the project
    whose oldest queued job is oldest), among the jobs a claim could start now — handed to the
    worker queue, not waiting for its project's cap, its branch free — outside the projects
    ``ruled_out``. None when no such job is queued.

    A project alone therefore takes every slot, oldest turn first; when projects compete, each
    freed slot goes to the one furthest behind, so another project's 500 queued turns delay a
    project's next turn by one slot's worth (the next slot to come free), not by their backlog.
    The answer is read without locks: the claim (``execution.claim_job``) decides, and a pick that
    another worker claimed first, or that a cap turns down, is simply not won.

    Costs two statements to rank the projects — one reads every entry of the queued jobs' partial
    index ``job_queued_for_slot``, so it grows with the backlog (a few hundred µs per thousand
    queued) — and one per project tried (the first, unless all its queued jobs wait for their
    branch); paid only while a worker's slots are contended (``execution.claim_for_slot``)."""
    queued = Job.objects.filter(status=JobStatus.QUEUED, run_in_background=True, waiting_since__isnull=True)
    if ruled_out:
        queued = queued.exclude(project_id__in=list(ruled_out))  # a pick there was turned down
    oldest = dict(queued.order_by().values("project_id").annotate(first=Min("created_at"))
                  .values_list("project_id", "first"))
    if not oldest:
        return None
    in_slots = dict(Job.objects.running().filter(run_in_background=True, project_id__in=list(oldest))
                    .order_by().values("project_id").annotate(n=Count("pk")).values_list("project_id", "n"))
    fairest = sorted(oldest, key=lambda project: (in_slots.get(project, 0), oldest[project], project))
    for project_id in fairest[:PICK_PROJECTS]:
        pick = (queued.filter(project_id=project_id).annotate(blocker=_branch_blocker())
                .filter(blocker__isnull=True).order_by("created_at", "pk").values_list("pk", flat=True).first())
        if pick is not None:
            return pick, project_id
    return None


def slot_waiters(project_id: int, *, except_branch_id: str):
    """For the completion's one probe of what waits (``execution._waiting_on``): the project's
    count of jobs in worker slots (this job's own end included) if a job of another branch waits
    for a slot, else NULL — the count is only taken then (a CASE branch not taken is not run)."""
    waiting = waiting_for_slot(project_id).exclude(branch_id=except_branch_id)
    return Case(When(Exists(waiting), then=_running_count(project_id)), default=None, output_field=IntegerField())


def wake_waiting_in_project(project_id: int, *, cap: int | None, ended_branch_id: str, running: int) -> list[str]:
    """A worker slot of the project was freed: hand its oldest jobs waiting for a slot back to the
    queue, as many as it has free slots (``cap``: its ``running_cap`` as it is now; ``running``:
    its jobs in worker slots, from the completion's probe, ``slot_waiters``), and clear their
    marks — in one statement, which picks and changes them, so a job is woken once per decline.
    Returns the ids woken.

    A job whose branch is busy, or has an earlier queued job, is skipped and stays marked (its
    branch's rule wakes the next job there: ``execution.enqueue_next_on_branch``); so is one whose
    row another transaction holds (SKIP LOCKED): a claim marking it, which then sees this slot
    free and hands it off itself (``wait_for_slot``), the reconciler handing it off, a cancel.
    Its branch is read without its lock (this completion holds a job's lock, and branches come
    before jobs): a stale read costs a claim that is declined again, or a wake left to the branch.

    The plan does not depend on the table's statistics: the candidates come from the partial index
    ``job_waiting_for_slot`` (a handful of rows, whatever the queue holds), and each is checked by
    a scalar subquery, which PostgreSQL runs per candidate (index ``job_branch_status``) and never
    turns into a join over every job of the project (as it may a NOT EXISTS without statistics).

    Precondition: inside the completion transaction of the job that ended (enqueued on commit),
    after its ending UPDATE; the ended job's own branch is woken by its own rule."""
    free = None if cap is None else cap - running
    if free is not None and free <= 0:
        return []
    candidates = (
        waiting_for_slot(project_id).exclude(branch_id=ended_branch_id)
        .annotate(blocker=_branch_blocker()).filter(blocker__isnull=True)
        .order_by("created_at").select_for_update(no_key=True, skip_locked=True, of=("self",))
        .values("pk")
    )
    woken = update_returning(
        Job.objects.filter(pk__in=candidates[:free] if free is not None else candidates),
        waiting_since=None,
        heartbeat_at=Now(),  # for a queued job: when it was last handed to the queue (the reconciler's clock)
    )
    woken_ids = [job.pk for job in sorted(woken, key=lambda job: (job.created_at, job.pk))]  # ties: one transaction's
    for job_id in woken_ids:
        enqueue_job(job_id)
    return woken_ids
