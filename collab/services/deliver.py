"""Deliveries to existing branches: ``agent(to=…)`` tasks and ``send_message``
(docs/contract.md#agent, #send_message and #the-inbox).

Both go through the one resolver (current tip, archived refused, no
self-delivery, missing = invisible). A task is always an admitted Job, queued
if the target is busy. A message to an idle target is an admitted Job too; to a
busy target it is an InboxEntry, drained FIFO when the target's turn ends.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models.functions import Now

from collab.errors import Conflict, Invalid
from collab.events import send_event_on_commit
from collab.faults import fault_point
from collab.models import Branch, InboxEntry, InboxKind, Job, JobKind, is_busy, is_occupied
from collab.text import clean_text
from collab.services.acting import Actor, message_header, task_header
from collab.services.addressing import resolve_target
from collab.services.admission import admit_job, check_caller_not_stopping, check_prompt
from collab.services.followup import record_failed_delivery
from collab.services.budgets import check_topology
from collab.services.locking import lock_branch, lock_sessions
from collab.services.watch import hold_delivery, is_watched
from collab.services.retry import retry_on_deadlock

INBOX_CAP = 50
DUPLICATE_WINDOW = timedelta(seconds=60)


def check_delivery(actor: Actor, text: str) -> None:
    """What every delivery checks before anything is written: the text, the role, the budget."""
    check_prompt(text)
    actor.require("turn.start")
    check_topology(actor, spawn=False)


def delivery_target(actor: Actor, to: str) -> Branch:
    """The live target of a delivery, through the one resolver; call inside its transaction."""
    target = resolve_target(actor.caller, to)
    actor.require("turn.start", session=target.session)  # the role there (a share may narrow it)
    if target.session.parent_session_id:
        # an OpenWork sub-agent is directed by its parent only (followup_task), never by others
        raise Invalid(
            f"{target.display_name!r} is a sub-agent of another agent: only its parent may give it work",
            code="sub_agent_read_only",
        )
    return target


@retry_on_deadlock
def do_delegate(actor: Actor, *, to: str, prompt: str, gate: bool = True):
    """Admit a task on an existing branch; it runs now or after the target's current turn.
    Under the watch policy it is held instead (returns the HeldDelivery)."""
    check_delivery(actor, prompt)
    messages, generations = actor.chain
    with transaction.atomic():
        target = delivery_target(actor, to)
        lock_sessions(actor.session.pk, target.session_id)  # both logs get events: sessions first
        if gate and is_watched(actor):
            return hold_delivery(actor, target, "task", prompt)
        job = admit_job(
            session=target.session, branch=target, kind=JobKind.TASK, prompt=prompt, started_by=actor.user,
            header=task_header(actor.address), caller_session=actor.session, caller_msg=actor.calling_node,
            caller_branch=actor.branch, caller_job=actor.job, parent_job=actor.job, run_in_background=True,
            chain_messages=messages + 1, chain_generations=generations, followup_mode=actor.followup_mode,
        )
        _log_delivery(actor, target, "task", job=job)
    return job


@dataclass
class Receipt:
    target: Branch
    delivered: bool
    job: Job | None = None
    inbox_entry: InboxEntry | None = None
    dropped: InboxEntry | None = None
    hold: object = None


MESSAGE_AGENT_ID = "main"  # send_message's default agent_id: "the recipient's own"


def check_message_agent_id(target: Branch, agent_id: str | None) -> None:
    """``send_message``'s ``agent_id`` (default ``"main"``, docs/contract.md#send_message). A message runs a
    turn with the recipient's own saved configuration: ``agent_id`` never changes who answers
    or how (``agent_id`` never addresses a branch). The default (or empty) means just
    that; any other value must be the recipient's own ``agent_id``, so a caller who believes it
    is talking to another configuration is told, instead of having its choice silently dropped."""
    if not agent_id or agent_id == MESSAGE_AGENT_ID:
        return
    spec = target.agent_spec or target.session.agent_spec
    own = spec.agent_id if spec is not None else None
    if agent_id != own:
        runs = f"runs as agent_id {own!r}" if own else "has no saved agent_id"
        raise Invalid(
            f"{target.display_name!r} {runs}, not {agent_id!r}: a message runs with the recipient's own "
            f"configuration (leave agent_id out); to run {agent_id!r}, create an agent with agent(agent_id=…)",
            code="agent_id_mismatch",
        )


@retry_on_deadlock
def do_send_message(actor: Actor, *, to: str, message: str, agent_id: str | None = None,
                    gate: bool = True) -> Receipt:
    """Deliver ``message`` to an existing agent (``send_message``); ``agent_id`` is
    checked against the recipient (``check_message_agent_id``)."""
    if (to or "").strip().lower() == "new":
        raise Invalid('to="new" is not valid: create an agent with agent(prompt=…, start_from=…)', code="invalid_target")
    check_delivery(actor, message)
    messages, generations = actor.chain
    with transaction.atomic():
        target = delivery_target(actor, to)
        check_message_agent_id(target, agent_id)
        lock_sessions(actor.session.pk, target.session_id)  # both logs get events: sessions first
        if gate and is_watched(actor):
            return Receipt(target=target, delivered=False, hold=hold_delivery(actor, target, "message", message))
        target = lock_branch(target.pk)  # read after the lock; its tip and session load after it too
        if actor.job is not None:
            check_caller_not_stopping(actor.job)  # a cancelled turn sends nothing more
        if not is_occupied(target):
            # a message turn belongs to its recipient: not a child of the sender's
            # job, so the sender's cancel does not reach it
            job = admit_job(
                session=target.session, branch=target, kind=JobKind.MESSAGE, prompt=message, started_by=actor.user,
                header=message_header(actor.address), caller_session=actor.session, caller_msg=actor.calling_node,
                caller_branch=actor.branch, caller_job=actor.job, parent_job=None, run_in_background=True,
                chain_messages=messages + 1, chain_generations=generations,
            )
            _log_delivery(actor, target, "message", job=job)
            return Receipt(target=target, delivered=True, job=job)
        return _queue_for_busy_target(actor, target, message, messages + 1, generations)


def _queue_for_busy_target(actor, target, message, chain_messages, chain_generations) -> Receipt:
    """Precondition: the target row is locked. Persist, de-duplicate, cap (docs/contract.md#the-inbox).
    The window and the FIFO order are the database's clock."""
    duplicate = InboxEntry.objects.filter(
        target_branch=target, sender_branch=actor.branch, text=message, created_at__gte=Now() - DUPLICATE_WINDOW
    ).exists()
    if duplicate:
        raise Conflict(
            "the same message from you is already waiting for this agent (sent less than 60 s ago); "
            "it will be delivered when the agent's current turn ends",
            code="duplicate_message",
        )
    dropped = None
    queued = list(InboxEntry.objects.filter(target_branch=target).order_by("created_at", "id").values_list("pk", flat=True))
    if len(queued) >= INBOX_CAP:
        dropped = InboxEntry.objects.select_related("sender_session", "sender_branch", "sender_job").get(pk=queued[0])
        dropped.delete()
        reason = (f"your message to {target.display_name!r} was dropped: its inbox holds at most {INBOX_CAP} "
                  "waiting messages and yours was the oldest")
        if dropped.sender_session_id:
            send_event_on_commit(
                dropped.sender_session_id, "inbox.dropped",
                {"target": target.address, "target_branch": target.pk, "text_preview": dropped.text[:200],
                 "reason": reason},
            )
            # the sending agent's own conversation hears it too, exactly once
            record_failed_delivery(
                target=target, kind="message", text=dropped.text, sender_session=dropped.sender_session,
                sender_branch=dropped.sender_branch, sender_job=dropped.sender_job, started_by=dropped.created_by,
                code="inbox_overflow", reason=reason, chain=(dropped.chain_messages, dropped.chain_generations),
            )
    entry = InboxEntry.objects.create(
        target_branch=target, session=target.session, kind=InboxKind.MESSAGE, text=clean_text(message),
        sender_session=actor.session, sender_branch=actor.branch, sender_address=actor.address,
        sender_job=actor.job, created_by=actor.user, chain_messages=chain_messages,
        chain_generations=chain_generations,
    )
    send_event_on_commit(target.session_id, "inbox.queued", {"entry": entry.pk, "target_branch": target.pk, "from": actor.address})
    _log_delivery(actor, target, "message", inbox_entry=entry)
    return Receipt(target=target, delivered=False, inbox_entry=entry, dropped=dropped)


def drain_inbox_locked(branch: Branch) -> list[Job]:
    """Turn the branch's inbox into message turns, FIFO, deliver-then-delete in one transaction.
    On a branch archived meanwhile each entry goes back to its sender as a failed result, once.

    Precondition: the branch row is locked, and the branch has no running job (the completion
    transaction of its last job, or ``drain_idle_inbox``).
    """
    admitted = []
    entries = InboxEntry.objects.filter(target_branch=branch).select_related(
        "sender_session", "sender_branch", "sender_job").order_by("created_at", "id")
    for entry in entries:
        if branch.archived:
            if entry.sender_session_id:
                send_event_on_commit(entry.sender_session_id, "delivery.rejected",
                                     {"target_branch": branch.pk, "code": "archived", "text_preview": entry.text[:200]})
                record_failed_delivery(
                    target=branch, kind="message", text=entry.text, sender_session=entry.sender_session,
                    sender_branch=entry.sender_branch, sender_job=entry.sender_job, started_by=entry.created_by,
                    code="archived", reason=f"your message to {branch.display_name!r} was not delivered: the agent "
                    "was archived before it could read it", chain=(entry.chain_messages, entry.chain_generations),
                )
        else:
            header = message_header(entry.sender_address)
            # created_at = when the delivery was accepted, so it keeps its FIFO place
            # among tasks that were queued on this branch while it waited
            job = admit_job(
                session=branch.session, branch=branch, kind=JobKind.MESSAGE, prompt=entry.text,
                started_by=entry.created_by, header=header, caller_session=entry.sender_session,
                caller_branch=entry.sender_branch, caller_job=entry.sender_job, parent_job=None,
                chain_messages=entry.chain_messages, chain_generations=entry.chain_generations,
                check_quota=False, created_at=entry.created_at,
            )
            admitted.append(job)
            if entry.sender_session_id:
                send_event_on_commit(entry.sender_session_id, "delivery.started",
                                     {"inbox_entry": entry.pk, "job": job.pk, "to": branch.address})
        fault_point("inbox.delivered")  # delivered, not yet deleted: one transaction, so never twice
        entry.delete()
    if admitted:
        send_event_on_commit(branch.session_id, "inbox.drained", {"branch": branch.pk, "jobs": [j.pk for j in admitted]})
    return admitted


@retry_on_deadlock
def drain_idle_inbox(branch_id: str) -> list[Job]:
    """Drain the inbox of a branch that has no running job (reconcile: whatever left it waiting)."""
    with transaction.atomic():
        branch = Branch.objects.select_for_update(of=("self",)).filter(pk=branch_id).first()
        if branch is None or is_busy(branch):
            return []
        return drain_inbox_locked(branch)


def _log_delivery(actor: Actor, target: Branch, kind: str, job=None, inbox_entry=None) -> None:
    payload = {
        "kind": kind, "from": actor.address, "to": target.address, "target_branch": target.pk,
        "job": getattr(job, "pk", None), "inbox_entry": getattr(inbox_entry, "pk", None),
    }
    send_event_on_commit(actor.session.pk, "delivery.sent", payload, actor=actor.user)
    if target.session_id != actor.session.pk:
        send_event_on_commit(target.session_id, "delivery.received", payload, actor=actor.user)
