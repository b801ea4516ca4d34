"""Crash recovery (docs/contract.md#crash-recovery): nothing is lost, nothing runs twice.

- A running or stopping job whose lease expired (its worker process died: a live one
  renews it, collab/services/liveness.py) becomes ``interrupted`` — ``cancelled`` if a
  cancel was already requested — through the normal completion path, and only if its
  lease is still expired under the row lock and in the UPDATE that ends it; so the
  follow-up it owes and the next queued turn on its branch come exactly once, and a
  healthy job is never ended. It is never re-run.
- A queued job nobody is working on (its hand-off was lost with a dead worker) is
  enqueued again once it has waited a lease since it was last handed off; the re-hand-off
  is a conditional UPDATE of its ``heartbeat_at`` (for a queued job: when it was last
  handed to the queue), so several reconcilers hand it off once. The claim is
  idempotent, so a duplicate hand-off is harmless.
- Results owed to idle branches (their delivery crashed) are settled, and so are results
  owed to the mailbox of an archived branch: they go back to their senders, once.
- Every branch with no running job whose inbox still holds messages is drained,
  whatever left them waiting.
- Webhook deliveries whose retry is due are handed to the queue, and attempts whose worker
  died mid-send are taken back (``collab.services.webhooks.hand_off_due_deliveries``).
- A new database's turn tables get their first statistics once they hold a few pages
  (``collab.services.statistics``).

It runs in every worker process every ``TRELLIS_RECONCILE_SECONDS``, at worker start,
and from ``manage.py reconcile``. All times are the database's.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from collab.models import FollowupState, InboxEntry, Job, JobStatus
from collab.services.admission import enqueue_job
from collab.services.asks import expire_due_asks
from collab.services.deliver import drain_idle_inbox
from collab.services.execution import finish_job
from collab.services.followup import deliver_owed
from collab.services.statistics import analyze_new_tables
from collab.services.webhooks import hand_off_due_deliveries

log = logging.getLogger(__name__)


def reconcile() -> dict:
    interrupted = []
    for job in Job.objects.running().filter(lease_expires_at__lt=Now()).select_related("branch"):
        stopping = job.status == JobStatus.STOPPING
        status = JobStatus.CANCELLED if stopping else JobStatus.INTERRUPTED
        reason = "the worker running it stopped" + (" after a cancel was requested" if stopping else "")
        ended = finish_job(job, status=status, final_text=None, result_text=reason, is_error=True,
                           error_code="cancelled" if stopping else "interrupted", error_reason=reason,
                           lease_expired=True)
        if ended is job:  # not renewed meanwhile, not ended by someone else
            interrupted.append(job.pk)

    handed_before = Now() - timedelta(seconds=settings.TRELLIS_LEASE_SECONDS)
    not_handed_since = Q(heartbeat_at__lt=handed_before) | Q(heartbeat_at__isnull=True, created_at__lt=handed_before)
    busy = Job.objects.holding().filter(branch=OuterRef("branch"))
    earlier = Job.objects.filter(branch=OuterRef("branch"), status=JobStatus.QUEUED, created_at__lt=OuterRef("created_at"))
    stale = []
    for pk in list(
        Job.objects.filter(not_handed_since, status=JobStatus.QUEUED, run_in_background=True)
        .filter(~Exists(busy), ~Exists(earlier)).values_list("pk", flat=True)
    ):
        with transaction.atomic():
            if Job.objects.filter(not_handed_since, pk=pk, status=JobStatus.QUEUED).update(heartbeat_at=Now()):
                enqueue_job(pk)
                stale.append(pk)

    owed_branches = set(
        Job.objects.filter(followup_state=FollowupState.OWED, finished_at__lt=Now() - timedelta(seconds=5))
        .filter(~Q(followup_mode="mailbox") | Q(caller_branch__archived=True))  # a mailbox no turn will read
        .values_list("caller_branch_id", flat=True)
    )
    settled = []
    for branch_id in owed_branches:
        if branch_id:
            settled += [j.pk for j in deliver_owed(branch_id)]
    running = Job.objects.holding().filter(branch=OuterRef("target_branch"))
    drained = []
    for branch_id in set(InboxEntry.objects.filter(~Exists(running)).values_list("target_branch_id", flat=True)):
        drained += [j.pk for j in drain_idle_inbox(branch_id)]
    result = {"interrupted": interrupted, "requeued": stale, "followups": settled, "drained": drained,
              "expired_asks": expire_due_asks(),
              **hand_off_due_deliveries(), "analyzed": analyze_new_tables()}
    if any(result.values()):
        log.info("reconciled: %s", result)
    return result
