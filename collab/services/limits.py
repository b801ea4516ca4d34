"""Budgets and quotas (SPEC §7, OP §5.1–§5.2).

Topology (per project; 0 = unlimited) bounds a chain: every delivery costs a
message, a spawn also a generation and a fan-out slot of the calling turn.
Resources (null = no limit) are counted on the *executing* session and checked
with the session row locked, so concurrent admissions cannot overshoot.
"""

from accounts.models import Project
from collab.errors import DomainError
from collab.models import OPEN_STATUSES, Job, JobKind, JobStatus, Session

DELEGATION_TOOLS = frozenset({"agent", "send_message", "spawn_agent", "followup_task"})


class BudgetExhausted(DomainError):
    status = 409
    code = "budget.exhausted"


class QuotaExceeded(DomainError):
    status = 429
    code = "quota.exceeded"


def messages_left(project: Project, chain_messages: int) -> bool:
    return not project.max_messages or chain_messages + 1 <= project.max_messages


def check_topology(actor, *, spawn: bool) -> None:
    """Refuse a delivery the chain cannot afford; creates nothing."""
    project = actor.session.project
    messages, generations = actor.chain
    if not messages_left(project, messages):
        raise BudgetExhausted(
            f"this chain has used its {project.max_messages} messages (max_messages): finish the work yourself; "
            "job_output, list_jobs and reading stay available",
            code="budget.messages_exhausted",
        )
    if not spawn:
        return
    if project.max_spawn_depth and generations + 1 > project.max_spawn_depth:
        raise BudgetExhausted(
            f"agents at this depth may not create agents (max_spawn_depth={project.max_spawn_depth}): "
            "do the work yourself, or message an existing agent",
            code="budget.depth_exhausted",
        )
    if project.max_spawn_fanout:
        calling = actor.calling_node
        spawned = Job.objects.filter(kind=JobKind.SPAWN, caller_branch=actor.branch)
        spawned = spawned.filter(caller_msg__turn=calling.turn) if calling is not None else spawned.filter(caller_msg__isnull=True)
        if spawned.count() >= project.max_spawn_fanout:
            raise BudgetExhausted(
                f"this turn already created {project.max_spawn_fanout} agents (max_spawn_fanout): "
                "wait for their results or reuse them with agent(to=…)",
                code="budget.fanout_exhausted",
            )


def check_admission_quota(session: Session) -> None:
    """Precondition: inside the admission transaction. Locks the executing session row."""
    project = session.project
    if not (project.max_queued_per_session or project.max_jobs_per_session):
        return
    Session.objects.select_for_update().filter(pk=session.pk).first()
    if project.max_jobs_per_session:
        total = Job.objects.filter(session=session).count()
        if total >= project.max_jobs_per_session:
            raise QuotaExceeded(
                f"this session has admitted its {project.max_jobs_per_session} jobs (max_jobs_per_session)",
                code="quota.jobs_exhausted", retryable=False,
            )
    if project.max_queued_per_session:
        queued = Job.objects.filter(session=session, status=JobStatus.QUEUED).count()
        if queued >= project.max_queued_per_session:
            raise QuotaExceeded(
                f"{queued} jobs are already waiting in this session (max_queued_per_session); try again later",
                code="quota.queue_full", retryable=True,
            )


def live_slots_free(session_id: str, project: Project) -> bool:
    if not project.max_live_per_session:
        return True
    running = Job.objects.filter(session_id=session_id, status__in=(JobStatus.RUNNING, JobStatus.STOPPING)).count()
    return running < project.max_live_per_session


def open_jobs(session) -> int:
    return Job.objects.filter(session=session, status__in=OPEN_STATUSES).count()
