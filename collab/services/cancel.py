"""``execution.cancel`` (SPEC §7, OP §5.3, §5.10): versioned, idempotent, cascading.

Queued jobs end ``cancelled`` without starting. Running jobs go to ``stopping``;
their worker notices within a fraction of a second and ends them ``cancelled``.
Terminal jobs are left alone. Every open descendant is treated the same way.
Repeating a ``command_id`` returns the first answer.
"""

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from accounts.policy import role_allows, role_of
from collab.errors import Conflict, Forbidden, Invalid, NotFound
from collab.events import send_event_on_commit
from collab.models import ExecutionCommand, Job, JobStatus, TERMINAL_STATUSES
from collab.services.admission import send_job_event
from collab.services.retry import retry_on_deadlock

CANCEL = "execution.cancel"
MAX_CASCADE_LEVELS = 64


def command_key(job: Job, command_id: str) -> str:
    """Command ids are scoped to their execution: the same id on another execution is another
    command (and says nothing about executions the caller cannot see)."""
    return f"{job.pk}:{command_id}"


def check_can_cancel(user, job: Job) -> None:
    """Maintainers cancel any execution; members the ones they started (SPEC §8)."""
    role = role_of(user, job.project_id)
    if role is None:
        raise NotFound()
    if role_allows(role, "runtime.control"):
        return
    if role_allows(role, "execution.cancel_own") and job.started_by_id == getattr(user, "pk", None):
        return
    raise Forbidden(f"your role ({role}) may only cancel executions you started")


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
        check_can_cancel(user, job)  # before the replay: knowing a command id grants no control either
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
            locked = Job.objects.select_for_update().get(pk=job.pk)
            if locked.version != expected_version:
                raise Conflict(
                    f"stale expected_version {expected_version}: the execution is at version {locked.version} ({locked.status})",
                    code="stale_version", version=locked.version, status=locked.status,
                )
            cascaded = request_cancel_tree(locked, user)
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
    return 202, answer


def request_cancel_tree(root: Job, user=None) -> list[str]:
    """Cancel ``root`` and every open descendant. Returns the descendants touched."""
    touched = []
    request_cancel(root)
    level = [root.pk]
    for _ in range(MAX_CASCADE_LEVELS):
        children = list(Job.objects.filter(parent_job_id__in=level).exclude(status__in=TERMINAL_STATUSES))
        if not children:
            break
        for child in children:
            if request_cancel(child):
                touched.append(child.pk)
        level = [c.pk for c in children]
    return touched


def request_cancel(job: Job) -> bool:
    """Queued → cancelled now; running → stopping (the worker confirms). True if it changed.

    A worker may claim a queued job between the two checks; then it is running and is
    asked to stop, so a cancel accepted for an open job is never lost."""
    from collab.services.execution import finish_job

    for _ in range(3):
        if Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING).update(
            status=JobStatus.STOPPING, version=F("version") + 1, cancel_requested_at=timezone.now()
        ):
            job.refresh_from_db()
            send_job_event(job, "job.stopping")
            return True
        status = Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()
        if status == JobStatus.RUNNING:
            continue  # claimed since the update above: ask it to stop
        if status != JobStatus.QUEUED:
            return False  # stopping or ended already
        ended = finish_job(
            job, status=JobStatus.CANCELLED, final_text=None, result_text="cancelled before it started",
            is_error=True, error_code="cancelled", error_reason="the execution was cancelled before it started",
            from_statuses=(JobStatus.QUEUED,),
        )
        if ended.status == JobStatus.CANCELLED:
            return True
    return False
