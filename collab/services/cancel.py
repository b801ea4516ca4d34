"""``execution.cancel`` (docs/contract.md#cancel): versioned, idempotent, cascading.

Queued jobs end ``cancelled`` without starting. Running jobs go to ``stopping``;
their worker notices within a fraction of a second and ends them ``cancelled``.
Terminal jobs are left alone. Every open descendant is treated the same way.
Repeating a ``command_id`` returns the first answer.

Cancel is a fence. The command's transaction locks the execution (session →
branch → job, collab/services/locking.py) and sets it and its running
descendants, level by level, to ``stopping``; from its commit on, nothing is
admitted under any of them (``admit_job`` locks the calling job and refuses) and
no queued descendant starts (``claim_job`` checks its calling job under lock). The
queued descendants are then ended ``cancelled`` one by one, each in its own
completion transaction (a job's completion locks its own branch, which must not be
taken after a job lock). Message turns (``send_message``) are not descendants: they
belong to their recipient.
"""

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from collab.access import require_can_cancel
from collab.errors import Conflict, Invalid
from collab.events import send_event_on_commit
from collab.models import CANCEL, ExecutionCommand, Job, JobStatus, TERMINAL_STATUSES
from collab.services.admission import send_job_event
from collab.services.execution import finish_job
from collab.services.locking import lock_branch, lock_job, lock_session_family
from collab.services.retry import retry_on_deadlock

MAX_CASCADE_LEVELS = 64


def command_key(job: Job, command_id: str) -> str:
    """Command ids are scoped to their execution: the same id on another execution is another
    command (and says nothing about executions the caller cannot see)."""
    return f"{job.pk}:{command_id}"


@retry_on_deadlock
def do_execution_command(user, job: Job, *, command_id: str, action: str, expected_version: int, payload: dict,
                         operator: bool = False) -> tuple[int, dict]:
    """Run a control command once; returns (HTTP status, answer). Preconditions: ``job``
    came from ``access_job`` — or ``operator``: an operator in the admin, authorized there
    by a Django permission (staff are trusted and need not be project members)."""
    command_id = (command_id or "").strip()
    if not command_id or len(command_id) > 100:
        raise Invalid("command_id must be 1–100 characters", code="invalid_command_id")
    if not operator:
        require_can_cancel(user, job)  # before the replay: knowing a command id grants no control either
    key = command_key(job, command_id)
    previous = ExecutionCommand.objects.filter(pk=key).first()
    if previous is not None:
        return previous.response_status, previous.response
    if action != CANCEL:
        raise Invalid(f"unknown action {action!r}; the only action is {CANCEL!r}", code="invalid_action")
    if payload:
        raise Invalid("payload must be empty for execution.cancel", code="invalid_payload")
    try:
        with transaction.atomic():
            lock_session_family(job.session_id)
            lock_branch(job.branch_id)
            locked = lock_job(job.pk)
            if locked.version != expected_version:
                raise Conflict(
                    f"stale expected_version {expected_version}: the execution is at version {locked.version} ({locked.status})",
                    code="stale_version", version=locked.version, status=locked.status,
                )
            request_cancel(locked)
            stopped, queued = fence_descendants(locked)
            cascaded = stopped + queued
            locked.refresh_from_db()
            answer = {"execution_id": locked.pk, "status": locked.status, "version": locked.version,
                      "command_id": command_id, "cascaded": cascaded}
            ExecutionCommand.objects.create(
                command_id=key, job=locked, action=action, expected_version=expected_version,
                payload=payload or {}, response_status=202, response=answer, issued_by=user,
            )
            send_event_on_commit(locked.session_id, "execution.cancel_requested",
                                 {"job": locked.pk, "command_id": command_id, "cascaded": cascaded,
                                  **({"via": "admin"} if operator else {})}, actor=user)
    except IntegrityError:  # the same command_id raced in: answer like the first one
        first = ExecutionCommand.objects.get(pk=key)
        return first.response_status, first.response
    for pk in queued:  # behind the fence already: a worker that reaches one first cancels it too
        request_cancel(Job.objects.get(pk=pk))
    return 202, answer


def fence_descendants(root: Job) -> tuple[list[str], list[str]]:
    """Set every running descendant of ``root`` to ``stopping``, level by level, each before its
    own children are listed (so one admitted under it meanwhile is found in the next level);
    return (those set to stopping, the queued ones left for the caller to cancel).

    Precondition: ``root`` is locked and already ``stopping`` or ``cancelled``."""
    stopped, queued = [], []
    level = [root.pk]
    for _ in range(MAX_CASCADE_LEVELS):
        children = list(Job.objects.filter(parent_job_id__in=level).exclude(status__in=TERMINAL_STATUSES)
                        .order_by("created_at", "pk").values_list("pk", "status"))
        if not children:
            break
        for pk, status in children:
            if _to_stopping(pk):
                stopped.append(pk)
            elif status in (JobStatus.QUEUED, JobStatus.WAITING):  # ended by the caller, one by one
                queued.append(pk)
        level = [pk for pk, _ in children]
    return stopped, queued


def _to_stopping(job_id: str) -> bool:
    if not Job.objects.filter(pk=job_id, status=JobStatus.RUNNING).update(
        status=JobStatus.STOPPING, version=F("version") + 1, cancel_requested_at=timezone.now()
    ):
        return False
    send_job_event(Job.objects.select_related("session").get(pk=job_id), "job.stopping")
    return True


def request_cancel_tree(root: Job, user=None) -> list[str]:
    """Cancel ``root`` and every open descendant. Returns the descendants touched.
    (Operators' and tests' entry point; the command runs the same steps.)"""
    request_cancel(root)
    stopped, queued = fence_descendants(root)
    for pk in queued:
        request_cancel(Job.objects.get(pk=pk))
    return stopped + queued


def request_cancel(job: Job) -> bool:
    """Queued → cancelled now; running → stopping (the worker confirms). True if it changed.

    A worker may claim a queued job between the two checks; then it is running and is
    asked to stop, so a cancel accepted for an open job is never lost."""
    for _ in range(3):
        with transaction.atomic():
            lock_session_family(job.session_id)  # its log gets the event: the session first
            if _to_stopping(job.pk):
                job.refresh_from_db()
                return True
        status = Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()
        if status == JobStatus.RUNNING:
            continue  # claimed since the update above: ask it to stop
        if status not in (JobStatus.QUEUED, JobStatus.WAITING):
            return False  # stopping or ended already
        waiting = status == JobStatus.WAITING  # paused for a person: no worker has it, it ends now
        ended = finish_job(
            job, status=JobStatus.CANCELLED, final_text=None,
            result_text="cancelled while waiting for a person" if waiting else "cancelled before it started",
            is_error=True, error_code="cancelled",
            error_reason="the execution was cancelled while it waited for a person" if waiting
            else "the execution was cancelled before it started",
            from_statuses=(status,),
        )
        if ended.status == JobStatus.CANCELLED:
            return True
    return False
