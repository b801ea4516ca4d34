"""People in the loop (docs/contract.md#people-in-the-loop): a turn that waits for a person.

A tool call the agent's spec or its project names in ``approvals`` (``"*"``: every call), and
every ``ask_person`` call, pauses its turn: ``pause_for_person`` writes a ``PersonAsk`` and moves the
job ``running`` → ``waiting`` in one transaction, and the worker lets the turn go (it holds no
slot, lease or connection while it waits, however long). ``decide`` records a person's
decision once (a second is 409 ``already_decided``) and, when nothing else of the job waits,
moves it ``waiting`` → ``queued`` and hands it to a worker; the turn resumes at that call
(``collab.runtime.loop.resume_paused_step``): an approved call runs once (with the edited
arguments if edited), a rejected one answers ``rejected: <reason>``, a question its answer.

An ask past its ``expires_at`` (the spec's ``limits.approval_expires_s``; none by default)
resolves as rejected, reason ``expired`` (``expire_due_asks``, run by the reconciler).
Cancelling a waiting turn ends it at once and closes its asks (``execution.close_asks``).

Lock order, as everywhere (collab/services/locking.py): sessions → branch → job, then the ask.
"""

from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from collab.errors import Conflict, Invalid
from collab.events import send_event_on_commit
from collab.models import AskKind, AskRule, AskStatus, DeliveryEvent, Job, JobStatus, PersonAsk
from collab.services.admission import enqueue_job, send_job_event
from collab.services.execution import USAGE_FIELDS, wake_after_pause
from collab.services.locking import lock_branch, lock_job, lock_session_family
from collab.selectors.inbox import ask_payload
from collab.services.notify import notify_people_on_commit
from collab.services.retry import retry_on_deadlock
from collab.services.webhooks import owe_ask_deliveries
from collab.text import clean_data, clean_text

ASK_PERSON = "ask_person"
MAX_REASON_CHARS = 2_000
MAX_ANSWER_CHARS = 20_000
# what a decision may say, by the ask's kind
DECISIONS = {AskKind.APPROVAL: ("approve", "reject"), AskKind.QUESTION: ("answer", "reject")}


def _names(approvals, tool: str) -> bool:
    return isinstance(approvals, list) and ("*" in approvals or tool in approvals)


def approval_rule(spec, project, tool: str) -> str | None:
    """Which rule makes every call of ``tool`` in a turn of ``spec`` (the turn's agent spec;
    None: the default agent) in ``project`` wait for a person's approval: ``"spec"`` (the spec's
    ``approvals``), ``"project"`` (the project's, its watch policy's part), or None: neither names
    it. The effective set is their union; the spec's is named when both do."""
    if _names(getattr(spec, "approvals", None), tool):
        return AskRule.SPEC
    if _names(getattr(project, "approvals", None), tool):
        return AskRule.PROJECT
    return None


def ask_kind_for(spec, tool: str, project=None) -> str | None:
    """The kind of ask a call of ``tool`` waits on in a turn of ``spec`` in ``project``, or None:
    it runs. The project is the one the turn read when it was claimed: a change to its
    ``approvals`` applies from the next turn (or the next resume) on."""
    if tool == ASK_PERSON:
        return AskKind.QUESTION
    return AskKind.APPROVAL if approval_rule(spec, project, tool) is not None else None


def expiry_for(spec):
    """When an ask made now expires (``limits.approval_expires_s``), or None: never."""
    limits = getattr(spec, "limits", None) or {}
    seconds = limits.get("approval_expires_s") if isinstance(limits, dict) else None
    if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds > 0:
        return timezone.now() + timedelta(seconds=seconds)
    return None


class Paused(Exception):
    """Raised by the turn loop once its job waits for a person: the worker lets the turn go."""

    def __init__(self, ask: PersonAsk):
        super().__init__(f"waiting for a person ({ask.kind} {ask.pk})")
        self.ask = ask


@retry_on_deadlock
def pause_for_person(job: Job, *, node, index: int, call, kind: str, spec, usage: dict, provider_state=None,
                     question: str = "", choices=(), to_user=None) -> PersonAsk | None:
    """The turn of ``job`` (running on this worker) waits for a person about tool call ``index``
    of its tool-call node ``node``: the ask is written (or found, on a second pause at the same
    call) and the job moves ``running`` → ``waiting`` with what it has spent so far, in one
    transaction. Returns the ask, or None when the job is no longer running (a cancel came: the
    caller stops the turn as for any stop). A foreground sub-agent that waits becomes a
    background one: its caller's call answers now, and its result comes back by itself."""
    with transaction.atomic():
        session = lock_session_family(job.session_id)
        lock_branch(job.branch_id)
        locked = lock_job(job.pk)
        if locked is None or locked.status != JobStatus.RUNNING:
            return None
        ask, _ = PersonAsk.objects.get_or_create(
            job_id=job.pk, tool_call_id=call.id,
            defaults={"project_id": job.project_id, "session_id": job.session_id, "branch_id": job.branch_id,
                      "call_message_id": node.pk, "call_index": index, "kind": kind, "tool": call.name,
                      "rule": (approval_rule(spec, job.project, call.name) or "")
                      if kind == AskKind.APPROVAL else "",
                      "arguments": clean_data(call.arguments) if isinstance(call.arguments, dict) else {},
                      "question": clean_text(question), "choices": [clean_text(str(c)) for c in choices],
                      "to_user": to_user, "expires_at": expiry_for(spec),
                      "provider_state": provider_state or {}},
        )
        foreground = bool(locked.caller_branch_id) and not locked.run_in_background and not locked.answers_call
        changes = {k: usage[k] for k in USAGE_FIELDS if k in usage}
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.WAITING, version=F("version") + 1, lease_expires_at=None,
            run_in_background=True if foreground else locked.run_in_background, **changes)
        job.status, job.version, job.run_in_background = JobStatus.WAITING, locked.version + 1, (
            True if foreground else locked.run_in_background)
        send_job_event(job, "job.waiting", session)
        send_event_on_commit(job.session_id, _requested_type(ask), ask_payload(ask))
        wake_after_pause(job)
        owe_ask_deliveries(ask, DeliveryEvent.ASK_REQUESTED)
        notify_people_on_commit(ask)
    return ask


def _requested_type(ask: PersonAsk) -> str:
    return "approval.requested" if ask.kind == AskKind.APPROVAL else "question.asked"


def check_decision(ask: PersonAsk, decision: str, *, arguments=None, reason: str = "", answer: str = "") -> dict:
    """What ``decision`` records on ``ask``, or ``Invalid`` naming what is wrong."""
    allowed = DECISIONS[ask.kind]
    if decision not in allowed:
        raise Invalid(f"a {ask.kind} is decided with {' or '.join(repr(d) for d in allowed)}; got {decision!r}",
                      code="invalid_decision")
    if decision == "approve":
        if arguments is None:
            return {}
        if not isinstance(arguments, dict):
            raise Invalid("arguments must be an object: the call's arguments, edited", code="invalid_arguments")
        # the API checks them against the tool's schema first; the tool checks them again when it runs
        return {"arguments": clean_data(arguments)}
    if decision == "reject":
        reason = clean_text(reason or "").strip()
        if len(reason) > MAX_REASON_CHARS:
            raise Invalid(f"reason is longer than {MAX_REASON_CHARS} characters", code="invalid_reason")
        return {"reason": reason or "rejected by a person"}
    answer = clean_text(answer if isinstance(answer, str) else "").strip()
    if not answer:
        raise Invalid("answer must be a non-empty text", code="invalid_answer")
    if len(answer) > MAX_ANSWER_CHARS:
        raise Invalid(f"answer is longer than {MAX_ANSWER_CHARS} characters", code="invalid_answer")
    if ask.choices and answer not in ask.choices:
        raise Invalid(f"answer must be one of the choices: {', '.join(repr(c) for c in ask.choices)}",
                      code="invalid_answer")
    return {"answer": answer}


STATUS_OF = {"approve": AskStatus.APPROVED, "reject": AskStatus.REJECTED, "answer": AskStatus.ANSWERED}


@retry_on_deadlock
def decide(user, ask: PersonAsk, decision: str, *, arguments=None, reason: str = "", answer: str = "") -> PersonAsk:
    """Record ``user``'s decision on ``ask`` once and resume its turn when nothing else of it
    waits. Preconditions: ``ask`` came from ``collab.access.access_ask`` (the person may decide
    it). 409 ``already_decided`` for a second decision, whoever made the first."""
    recorded = check_decision(ask, decision, arguments=arguments, reason=reason, answer=answer)
    return _resolve(ask, STATUS_OF[decision], recorded, user=user)


def _resolve(ask: PersonAsk, status: str, recorded: dict, *, user=None) -> PersonAsk:
    with transaction.atomic():
        session = lock_session_family(ask.session_id)
        lock_branch(ask.branch_id)
        job = lock_job(ask.job_id)
        locked = PersonAsk.objects.select_for_update().filter(pk=ask.pk).first()
        if locked is None or job is None:
            raise Conflict("this request is gone", code="already_decided")
        if locked.status != AskStatus.PENDING:
            raise Conflict(f"this {locked.kind} was already decided ({locked.status})", code="already_decided",
                           status=locked.status)
        PersonAsk.objects.filter(pk=ask.pk).update(status=status, decision=recorded, decided_by=user,
                                                   decided_at=Now())
        locked.refresh_from_db()
        owe_ask_deliveries(locked, DeliveryEvent.ASK_DECIDED)
        send_event_on_commit(ask.session_id, "approval.decided" if ask.kind == AskKind.APPROVAL else "question.answered",
                             {"ask": ask.pk, "job": ask.job_id, "tool": ask.tool, "decision": status,
                              "by": user.username if user is not None else None,
                              **({"reason": recorded["reason"]} if "reason" in recorded else {}),
                              **({"edited": True} if "arguments" in recorded else {})},
                             actor=user)
        if job.status == JobStatus.WAITING and not PersonAsk.objects.filter(job=job, status=AskStatus.PENDING).exists():
            Job.objects.filter(pk=job.pk, status=JobStatus.WAITING).update(
                status=JobStatus.QUEUED, version=F("version") + 1, heartbeat_at=Now())
            job.status, job.version = JobStatus.QUEUED, job.version + 1
            send_job_event(job, "job.queued", session)
            enqueue_job(job.pk)
    return locked


def expire_due_asks() -> list[str]:
    """Pending asks past their ``expires_at`` resolve as rejected, reason ``expired``, each once
    (the reconciler's part). Returns their ids."""
    expired = []
    for ask in PersonAsk.objects.filter(status=AskStatus.PENDING, expires_at__lt=Now()).order_by("expires_at"):
        try:
            _resolve(ask, AskStatus.EXPIRED, {"reason": "expired"})
        except Conflict:  # decided meanwhile
            continue
        expired.append(ask.pk)
    return expired


def call_result(ask: PersonAsk) -> str | None:
    """The tool result a decided ask gives its call without running it (rejected, expired,
    answered), or None: an approved call runs."""
    if ask.status == AskStatus.APPROVED:
        return None
    if ask.status == AskStatus.ANSWERED:
        return ask.decision.get("answer", "")
    return f"rejected: {ask.decision.get('reason') or 'rejected by a person'}"
