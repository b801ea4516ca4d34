"""Budgets and quotas (docs/contract.md#admission-budgets-and-quotas).

Topology (per project; 0 = unlimited) bounds a chain: every delivery costs a
message, a spawn also a generation and a fan-out slot of the calling turn.
Resources (null = no limit) are counted on the *executing* session and checked
with the session row locked, so concurrent admissions cannot overshoot.
"""

from django.utils.translation import ngettext

from accounts.limits import effective_limit
from accounts.models import Project
from collab.errors import DomainError
from collab.models import Job, JobKind, JobStatus, Session
from collab.services.locking import lock_branch, lock_session

DELEGATION_TOOLS = frozenset({"agent", "send_message", "spawn_agent", "followup_task"})


class BudgetExhausted(DomainError):
    status = 409
    code = "budget.exhausted"


class QuotaExceeded(DomainError):
    status = 429
    code = "quota.exceeded"


def messages_left(project: Project, chain_messages: int) -> bool:
    limit = effective_limit(project, "max_messages")
    return not limit or chain_messages + 1 <= limit


def check_topology(actor, *, spawn: bool) -> None:
    """Refuse a delivery the chain cannot afford; creates nothing.

    Precondition for ``spawn``: inside the admission transaction with the calling branch's row
    locked (``lock_caller``), so the fan-out count cannot be overtaken by a concurrent spawn of
    the same turn (two spawns at 7 of 8 admit one)."""
    project = actor.session.project
    messages, generations = actor.chain
    if not messages_left(project, messages):
        raise BudgetExhausted(
            f"this chain has used its {effective_limit(project, 'max_messages')} messages (max_messages): finish the work yourself; "
            "job_output, list_jobs and reading stay available",
            code="budget.messages_exhausted",
        )
    if not spawn:
        return
    depth = effective_limit(project, "max_spawn_depth")
    if depth and generations + 1 > depth:
        raise BudgetExhausted(
            f"agents at this depth may not create agents (max_spawn_depth={depth}): "
            "do the work yourself, or message an existing agent",
            code="budget.depth_exhausted",
        )
    fanout = effective_limit(project, "max_spawn_fanout")
    if fanout:
        calling = actor.calling_node
        spawned = Job.objects.filter(kind=JobKind.SPAWN, caller_branch=actor.branch)
        spawned = spawned.filter(caller_msg__turn=calling.turn) if calling is not None else spawned.filter(caller_msg__isnull=True)
        if spawned.count() >= fanout:
            raise BudgetExhausted(
                f"this turn already created {fanout} agents (max_spawn_fanout): "
                "wait for their results or reuse them with agent(to=…)",
                code="budget.fanout_exhausted",
            )


def lock_caller(actor) -> None:
    """The caller's lock: its branch row, taken in the admission transaction before anything is
    counted or written (lock order session → branch → job: after any session row)."""
    lock_branch(actor.branch.pk)


def check_admission_quota(session: Session) -> None:
    """Precondition: inside the admission transaction. Locks the executing session row."""
    project = session.project
    max_jobs = effective_limit(project, "max_jobs_per_session")
    max_queued = effective_limit(project, "max_queued_per_session")
    if not (max_queued or max_jobs):
        return
    lock_session(session.pk)  # taken first by admit_job already (lock order: collab/services/locking.py)
    if max_jobs:
        total = Job.objects.filter(session=session).count()
        if total >= max_jobs:
            raise QuotaExceeded(
                f"this session has admitted its {max_jobs} {ngettext('job', 'jobs', max_jobs)} (max_jobs_per_session)",
                code="quota.jobs_exhausted", retryable=False,
            )
    if max_queued:
        queued = Job.objects.filter(session=session, status=JobStatus.QUEUED).count()
        if queued >= max_queued:
            raise QuotaExceeded(
                f"{queued} {ngettext('job is', 'jobs are', queued)} already waiting in this session "
                "(max_queued_per_session); try again later",
                code="quota.queue_full", retryable=True,
            )


def live_slots_free(session_id: str, project: Project) -> bool:
    limit = effective_limit(project, "max_live_per_session")
    if not limit:
        return True
    running = Job.objects.running().filter(session_id=session_id).count()
    return running < limit

