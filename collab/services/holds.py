"""Deciding a delivery the watch policy held (``collab.services.watch``): approved, it is
delivered as its original sender would have, past the gate only; rejected, it leaves an explicit
result for the sender — a failed execution whose follow-up carries the reason."""

from django.db import transaction
from django.utils import timezone

from collab.errors import Conflict
from collab.events import send_event_on_commit
from collab.models import HeldDelivery, HoldStatus
from collab.services.acting import Actor, gateway_actor
from collab.services.deliver import do_delegate, do_send_message
from collab.services.followup import record_failed_delivery
from collab.services.retry import retry_on_deadlock


def sender_of(hold: HeldDelivery) -> Actor:
    """The original sender's standing, chain counters included: its job's, or for a
    gateway call the branch's chain, as when it sent (``gateway_actor``)."""
    if hold.sender_job is None and hold.sender_branch is not None:
        return gateway_actor(hold.created_by, hold.sender_branch)
    return Actor(user=hold.created_by, session=hold.sender_session, branch=hold.sender_branch, job=hold.sender_job)


@retry_on_deadlock
def do_decide_hold(user, hold: HeldDelivery, *, approve: bool) -> HeldDelivery:
    """Deliver (as the original sender, skipping only the gate) or reject with an explicit result."""
    with transaction.atomic():
        locked = HeldDelivery.objects.select_for_update().get(pk=hold.pk)
        if locked.status != HoldStatus.PENDING:
            raise Conflict(f"this delivery was already {locked.status}", code="already_decided")
        sender = sender_of(hold)
        now = timezone.now()
        result_job = None
        if approve:
            to = hold.target_branch.address or hold.target_branch.pk
            if hold.kind == "task":
                result_job = do_delegate(sender, to=to, prompt=hold.text, gate=False)
            else:
                receipt = do_send_message(sender, to=to, message=hold.text, gate=False)
                result_job = receipt.job
        else:
            reason = f"the delivery was rejected by {user.username} (watch policy)"
            result_job = record_failed_delivery(
                target=hold.target_branch, kind=hold.kind, text=hold.text, sender_session=hold.sender_session,
                sender_branch=hold.sender_branch, sender_job=hold.sender_job, started_by=hold.created_by,
                code="delivery_rejected", reason=reason, followup_mode=sender.followup_mode,
                chain=(sender.chain[0] + 1, sender.chain[1]),  # the rejected delivery spent a message
            )
        HeldDelivery.objects.filter(pk=hold.pk).update(
            status=HoldStatus.APPROVED if approve else HoldStatus.REJECTED, decided_by=user, decided_at=now,
            result_job=result_job,
        )
        send_event_on_commit(
            hold.sender_session_id, "delivery.approved" if approve else "delivery.rejected",
            {"hold": hold.pk, "job": getattr(result_job, "pk", None), "by": user.username}, actor=user,
        )
    hold.refresh_from_db()
    return hold
