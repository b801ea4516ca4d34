"""Job lifecycle on the worker side: claim, heartbeat, finish (SPEC §7, §13).

A turn costs three commits: the admission (elsewhere), the claim, and one
completion transaction that writes the final node, the terminal state, the
events and whatever the completion owes (the next queued job on the branch).
"""

import os
import socket

from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from collab.events import send_event_on_commit
from collab.models import ACTIVE_STATUSES, Branch, Job, JobKind, JobStatus, MessageRole
from collab.services.admission import enqueue_job, follow_head, job_wire, write_prompt_node
from collab.services.messages import append_message

WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"


def lease_deadline():
    from django.conf import settings

    return timezone.now() + timezone.timedelta(seconds=settings.TRELLIS_LEASE_SECONDS)


def claim_job(job_id: str) -> Job | None:
    """Take a queued job for this worker, or None if another worker has it, it is no
    longer queued, or an earlier job on its branch must run first (it is re-enqueued
    when that one ends). A conditional UPDATE, so two workers can never both win."""
    now = timezone.now()
    busy = Job.objects.filter(branch=OuterRef("branch"), status__in=ACTIVE_STATUSES)
    earlier = Job.objects.filter(
        branch=OuterRef("branch"), status=JobStatus.QUEUED, created_at__lt=OuterRef("created_at")
    )
    try:
        with transaction.atomic():
            won = (
                Job.objects.filter(pk=job_id, status=JobStatus.QUEUED)
                .filter(~Exists(busy), ~Exists(earlier))
                .update(
                    status=JobStatus.RUNNING,
                    version=F("version") + 1,
                    started_at=now,
                    worker=WORKER_NAME,
                    heartbeat_at=now,
                    lease_expires_at=lease_deadline(),
                )
            )
            if not won:
                return None
            job = Job.objects.select_related("session", "branch", "agent_spec", "branch__tip").get(pk=job_id)
            if job.prompt_msg_id is None:
                branch = Branch.objects.select_for_update(of=("self",)).select_related("tip").get(pk=job.branch_id)
                write_prompt_node(job, branch)
                job.branch = branch
            send_event_on_commit(job.session_id, "job.running", job_wire(job))
            return job
    except IntegrityError:
        # the one-active-job-per-branch index: another claim on this branch won the race
        return None


def heartbeat(job: Job) -> str:
    """Renew the lease; returns the job's current status (so the loop notices cancel)."""
    Job.objects.filter(pk=job.pk, status__in=ACTIVE_STATUSES).update(
        heartbeat_at=timezone.now(), lease_expires_at=lease_deadline()
    )
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()


def finish_job(
    job: Job,
    *,
    status: str,
    final_text: str | None,
    result_text: str,
    is_error: bool = False,
    error_code: str = "",
    error_reason: str = "",
    usage: dict | None = None,
) -> Job:
    """The completion transaction: final node, terminal state, events, next job.

    Only a job that is still running or stopping can finish; a job finished by
    someone else (e.g. marked interrupted by the reconciler) is left alone.
    """
    now = timezone.now()
    usage = usage or {}
    with transaction.atomic():
        branch = Branch.objects.select_for_update(of=("self",)).select_related("tip").get(pk=job.branch_id)
        updated = Job.objects.filter(pk=job.pk, status__in=ACTIVE_STATUSES).update(
            status=status,
            version=F("version") + 1,
            finished_at=now,
            result_text=result_text,
            is_error=is_error,
            error_code=error_code,
            error_reason=error_reason,
            lease_expires_at=None,
            model_calls=usage.get("model_calls", 0),
            tool_calls=usage.get("tool_calls", 0),
            tokens_in=usage.get("tokens_in", 0),
            tokens_out=usage.get("tokens_out", 0),
        )
        if not updated:
            return Job.objects.get(pk=job.pk)
        if final_text is not None:
            final = append_message(
                branch,
                role=MessageRole.ASSISTANT,
                text=final_text,
                job=job,
                metadata={"job": job.pk, "final": True, "is_error": is_error},
            )
            if job.kind == JobKind.USER:
                follow_head(job.session_id, branch.pk, final)
        Branch.objects.filter(pk=branch.pk).update(turns=F("turns") + 1)
        job.refresh_from_db()
        send_event_on_commit(job.session_id, f"job.{status}", job_wire(job))
        enqueue_next_on_branch(branch.pk)
    return job


def enqueue_next_on_branch(branch_id: str) -> None:
    """Wake the oldest queued job on the branch (queued behind the one that just ended)."""
    nxt = (
        Job.objects.filter(branch_id=branch_id, status=JobStatus.QUEUED)
        .order_by("created_at")
        .values_list("pk", flat=True)
        .first()
    )
    if nxt:
        enqueue_job(nxt)
