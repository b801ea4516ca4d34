"""Email to the people who may decide an ask (docs/contract.md#people-in-the-loop), when the
operator turns it on (``TRELLIS_EMAIL_NOTIFICATIONS``): through Django's email backend, the
console's by default. Sent by a worker task after the ask's transaction commits, never inside it."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction

from accounts.policy import member_ids_with
from collab.access import DECIDE_ASKS, can_in_session
from collab.brokers import hand_to_broker
from collab.models import AskStatus, PersonAsk

NOTIFY_ASK = "collab.tasks.notify_ask"


def notify_people_on_commit(ask: PersonAsk) -> None:
    """Inside the transaction that wrote ``ask``: its email goes once that commits (a task)."""
    if settings.TRELLIS_EMAIL_NOTIFICATIONS:
        transaction.on_commit(lambda: hand_to_broker(NOTIFY_ASK, ask.pk, task_name=f"notify-{ask.pk}"))


def recipients(ask: PersonAsk) -> list:
    """Who hears of ``ask``: the person it names, or every active member of its project who may
    decide it (sees its session, may post there); those with an email address."""
    if ask.to_user_id:
        people = [ask.to_user]
    else:
        people = list(get_user_model().objects.filter(pk__in=member_ids_with(ask.project_id, DECIDE_ASKS)))
    return [p for p in people if p.email and p.is_active and can_in_session(p, ask.session, DECIDE_ASKS)]


def send_ask_email(ask_id: str) -> int:
    """The task: one email to each recipient of a still-pending ask. Returns how many were sent."""
    ask = PersonAsk.objects.select_related("session", "to_user", "project").filter(pk=ask_id).first()
    if ask is None or ask.status != AskStatus.PENDING:
        return 0
    what = (f"asks: {ask.question}" if ask.kind == "question"
            else f"wants to call {ask.tool} and waits for your approval")
    subject = f"[Trellis] An agent in {ask.project.name} {'asks you a question' if ask.kind == 'question' else 'needs your approval'}"
    body = (f"An agent in session \"{ask.session.title or ask.session_id}\" of {ask.project.name} {what}.\n\n"
            f"Decide it in your inbox: {settings.TRELLIS_PUBLIC_URL}/inbox\n")
    sent = 0
    for person in recipients(ask):
        sent += send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [person.email], fail_silently=True)
    return sent
