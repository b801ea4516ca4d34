"""The watch policy (SPEC §7, OP §3, §5.8): with ``watch_policy="confirm_deliveries"`` every
``send_message`` and ``agent(to=…)`` of the project's agents is held until a member approves
it. There is no bypass: sub-agents and gateway calls pass the same gate. A rejection leaves
an explicit result for the sender: a failed execution whose follow-up carries the reason."""

from django.db import transaction
from django.utils import timezone

from accounts.models import WatchPolicy
from collab.errors import Conflict
from collab.events import send_event_on_commit
from collab.models import HeldDelivery, HoldStatus
from collab.text import clean_text
from collab.services.acting import Actor, gateway_actor
from collab.services.followup import record_failed_delivery
from collab.services.retry import retry_on_deadlock


def is_watched(actor: Actor) -> bool:
    return actor.session.project.watch_policy == WatchPolicy.CONFIRM_DELIVERIES


def hold_delivery(actor: Actor, target, kind: str, text: str) -> HeldDelivery:
    """Precondition: inside the delivery's transaction, after every other check passed."""
    text = clean_text(text)
    hold = HeldDelivery.objects.create(
        project_id=actor.session.project_id, kind=kind, text=text, target_branch=target,
        sender_session=actor.session, sender_branch=actor.branch, sender_job=actor.job, created_by=actor.user,
    )
    send_event_on_commit(
        actor.session.pk, "delivery.held",
        {"hold": hold.pk, "kind": kind, "to": target.address, "target_branch": target.pk, "text_preview": text[:200]},
        actor=actor.user,
    )
    return hold


def sender_of(hold: HeldDelivery) -> Actor:
    """The original sender's standing, chain counters included (OP §5.1): its job's, or for a
    gateway call the branch's chain, as when it sent (``gateway_actor``)."""
    if hold.sender_job is None and hold.sender_branch is not None:
        return gateway_actor(hold.created_by, hold.sender_branch)
    return Actor(user=hold.created_by, session=hold.sender_session, branch=hold.sender_branch, job=hold.sender_job)


@retry_on_deadlock
def do_decide_hold(user, hold: HeldDelivery, *, approve: bool) -> HeldDelivery:
    """Deliver (as the original sender, skipping only the gate) or reject with an explicit result."""
    # cycle: collab.services.deliver imports this module (hold_delivery, is_watched)
    from collab.services.deliver import do_delegate, do_send_message

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
