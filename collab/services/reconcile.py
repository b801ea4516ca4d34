"""Crash recovery (SPEC §7 P-REL-1, OW §8): nothing is lost, nothing runs twice.

- A running job whose lease expired (its worker died) becomes ``interrupted`` —
  ``cancelled`` if a cancel was already requested — through the normal completion
  path, so the follow-up it owes is delivered exactly once. It is never re-run.
- A queued job nobody is working on (its enqueue was lost in a crash) is enqueued
  again; the claim is idempotent, so a duplicate hand-off is harmless.
- Results owed to idle branches (their delivery crashed) are settled.
"""

import logging
from datetime import timedelta

from django.db.models import Exists, OuterRef
from django.utils import timezone

from collab.models import ACTIVE_STATUSES, FollowupState, Job, JobStatus

log = logging.getLogger(__name__)

STALE_QUEUED_AFTER = timedelta(seconds=30)


def reconcile(now=None) -> dict:
    from collab.services.admission import enqueue_job
    from collab.services.execution import finish_job
    from collab.services.followup import deliver_owed

    now = now or timezone.now()
    interrupted = []
    for job in Job.objects.filter(status__in=ACTIVE_STATUSES, lease_expires_at__lt=now).select_related("branch"):
        stopping = job.status == JobStatus.STOPPING
        status = JobStatus.CANCELLED if stopping else JobStatus.INTERRUPTED
        reason = "the worker running it stopped" + (" after a cancel was requested" if stopping else "")
        finish_job(job, status=status, final_text=None, result_text=reason, is_error=True,
                   error_code="cancelled" if stopping else "interrupted", error_reason=reason)
        interrupted.append(job.pk)

    busy = Job.objects.filter(branch=OuterRef("branch"), status__in=ACTIVE_STATUSES)
    earlier = Job.objects.filter(branch=OuterRef("branch"), status=JobStatus.QUEUED, created_at__lt=OuterRef("created_at"))
    stale = list(
        Job.objects.filter(status=JobStatus.QUEUED, created_at__lt=now - STALE_QUEUED_AFTER, run_in_background=True)
        .filter(~Exists(busy), ~Exists(earlier)).values_list("pk", flat=True)
    )
    from django.db import transaction

    with transaction.atomic():
        for pk in stale:
            enqueue_job(pk)

    owed_branches = set(
        Job.objects.filter(followup_state=FollowupState.OWED, finished_at__lt=now - timedelta(seconds=5))
        .exclude(followup_mode="mailbox").values_list("caller_branch_id", flat=True)
    )
    settled = []
    for branch_id in owed_branches:
        if branch_id:
            settled += [j.pk for j in deliver_owed(branch_id)]
    result = {"interrupted": interrupted, "requeued": stale, "followups": settled}
    if any(result.values()):
        log.info("reconciled: %s", result)
    return result
