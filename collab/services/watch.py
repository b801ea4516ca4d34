"""The watch policy's gate (docs/contract.md#watch-policy): with ``watch_policy="confirm_deliveries"``
every ``send_message`` and ``agent(to=…)`` of the project's agents is held until a member
approves it. There is no bypass: sub-agents and gateway calls pass the same gate
(``collab.services.deliver`` asks ``is_watched`` and holds with ``hold_delivery``). Deciding a
held delivery is ``collab.services.holds``."""

from accounts.models import WatchPolicy
from collab.events import send_event_on_commit
from collab.models import HeldDelivery
from collab.text import clean_text
from collab.services.acting import Actor


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
