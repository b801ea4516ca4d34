"""Results go back to the caller exactly once (docs/contract.md#results-come-back-exactly-once).

When a background ``agent`` job or an ``agent(to=…)`` job ends — however it
ends — its row is marked ``followup_state=owed`` in the same transaction as
its terminal state. The debt is then settled exactly once, whichever comes
first: the caller branch's running turn drains it into its mailbox before its
next model call, or, when the caller branch is idle, ``deliver_owed`` turns it
into a follow-up turn at the current tip of the caller branch (mode ``turn``),
or leaves it for the next user turn's drain (mode ``mailbox``) — unless the
caller branch is archived: no turn will read that mailbox, so the result goes
back to the agent that produced it as a failed result (``bounce_stranded_locked``:
when it becomes owed, when the branch is archived, and from the reconciler). Each path
claims the debt with a conditional UPDATE, so no result is lost or doubled.
A result whose caller job was cancelled is written as a ``notice`` node on the
idle caller branch instead of a follow-up turn (docs/contract.md#the-cancel-fence).
"""

import logging

from django.db import transaction
from django.db.models.functions import Now

from collab.deliveries import (
    CANCELLED_RECONCILED,
    EMPTY_FINAL,
    INTERRUPTED_LIVE,
    INTERRUPTED_RESTART,
    agent_message,
    envelope_span,
    notice_lead,
)
from collab.errors import DomainError, Invalid
from collab.events import send_event_on_commit
from collab.faults import fault_point
from collab.models import (
    Branch,
    FollowupState,
    Job,
    JobKind,
    JobStatus,
    MessageKind,
    MessageRole,
    effective_spec,
    is_busy,
)
from collab.text import bound_text, clean_text
from collab.services.admission import FENCED, admit_job
from collab.services.locking import kept_on_rollback, lock_for_branch
from collab.services.messages import append_message
from collab.services.results import estimate_tokens, result_limit_for
from collab.services.retry import retry_on_deadlock

log = logging.getLogger(__name__)


def owes_followup(job: Job, *, refused: bool = False) -> bool:
    """Whether the caller is owed ``job``'s result: a background task or spawn always; any
    delivery (a message too) whose start was refused, so its sender hears of it. Never
    a job that ``answers_call``: the waiting call returns its result, whatever it was."""
    if not job.caller_branch_id or job.answers_call:
        return False
    if refused:
        return job.kind != JobKind.FOLLOWUP
    return job.kind in (JobKind.SPAWN, JobKind.TASK) and job.run_in_background


# failure notices: a delivery that never ran, reported to its sender. One that cannot be
# delivered either is not reported again (its sender is gone too), so notices never loop.
NOTICE_CODES = frozenset({"delivery_rejected", "inbox_overflow", "archived", "result_undeliverable"})


def reader_spec(job: Job):
    """The AgentSpec of the model that will read ``job``'s result: the caller branch's."""
    caller = job.caller_branch
    if caller is None:
        return None
    return effective_spec(caller)


def result_source(job: Job) -> str | None:
    """The ``SID:HEAD`` a result comes from: the producing branch's tip when it is delivered."""
    return job.branch.address


def _notice_parts(job: Job) -> tuple[str, str]:
    """(lead, body) of ``result_notice``: the lead says where the result comes from and how the
    job ended (for the model); the body is the result itself (what a person reads on a card)."""
    who = job.branch.display_name
    if job.status == JobStatus.SUCCEEDED:
        limit = result_limit_for(reader_spec(job))
        body, _ = bound_text(job.result, limit) if job.result.strip() else ("(the agent finished with an empty reply)", False)
        return notice_lead(result_source(job), who, job.pk, None), body
    return notice_lead(result_source(job), who, job.pk, job.status), job.error_reason or job.status


def result_notice(job: Job) -> str:
    """What the caller reads: where the result comes from, how the job ended, the bounded result."""
    return "".join(_notice_parts(job))


def _notice_with_span(job: Job) -> tuple[str, list[int]]:
    lead, body = _notice_parts(job)
    return lead + body, [len(lead), len(lead) + len(body)]


MAX_DELIVERY_TOKENS = 4_000  # an envelope of this size or more is refused (agent_delivery_failed)


def envelope(job: Job, *, reconciling: bool) -> tuple[str, str]:
    """(kind, text) of the OpenWork ``<agent_message>`` for a child's finished turn
    (docs/contract.md#the-openwork-toolset).

    A cancel seen live (the parent's turn is running: ``interrupt_agent``) reads ``interrupted``;
    found by the reconciliation at the parent's next user turn it reads ``failed: cancelled``."""
    if job.status == JobStatus.SUCCEEDED:
        kind = "final_answer"
        body = bound_text(job.result, result_limit_for(reader_spec(job)))[0] if job.result.strip() else EMPTY_FINAL
    elif job.status == JobStatus.INTERRUPTED:
        kind, body = "interrupted", INTERRUPTED_RESTART
    elif job.status == JobStatus.CANCELLED:
        kind, body = ("failed", CANCELLED_RECONCILED) if reconciling else ("interrupted", INTERRUPTED_LIVE)
    else:
        kind, body = "failed", f"{job.error_code or 'failed'}: {job.error_reason or job.result or job.status}"
    text = agent_message(job.branch.task_name, kind, body)
    if estimate_tokens(text) >= MAX_DELIVERY_TOKENS:
        # refused rather than delivered; the parent is told (it never waits for nothing)
        kind = "failed"
        kept = f" (full text: artifact {job.result_artifact_id})" if job.result_artifact_id else ""
        text = agent_message(job.branch.task_name, kind, (
            f"agent_delivery_failed: the sub-agent's message is about {estimate_tokens(text)} tokens, over the "
            f"{MAX_DELIVERY_TOKENS}-token limit for delivered messages; its result stays with execution {job.pk}"
            f"{kept}. Ask it (followup_task) for a shorter answer if you still need it."))
    return kind, text


def delivery_metadata(debt: Job, text_span: list[int]) -> dict:
    """What a delivered result records beside its text, for people rather than the model:
    which execution it reports, how it ended, where it comes from, and which characters of
    the text are the result itself (``body``), so a page shows a card instead of the raw text."""
    return {"result_of": debt.pk, "status": debt.status, "is_error": debt.is_error,
            "from": result_source(debt), "body": text_span}


def mailbox_entry(debt: Job, *, reconciling: bool) -> dict:
    """What a settled debt writes into the caller branch: text, dedupe key, metadata."""
    if debt.branch.task_name:
        kind, text = envelope(debt, reconciling=reconciling)
        meta = delivery_metadata(debt, envelope_span(text))
        return {"text": text, "dedupe_key": f"agent-msg:{debt.session_id}:{debt.pk}:{kind}",
                "metadata": {**meta, "task_name": debt.branch.task_name, "agent_message_kind": kind}}
    text, span = _notice_with_span(debt)
    return {"text": text, "dedupe_key": f"result:{debt.pk}", "metadata": delivery_metadata(debt, span)}


def results_owed(branch: Branch) -> bool:
    """Whether any finished job's result waits to be delivered to ``branch`` (its mailbox)."""
    return Job.objects.filter(caller_branch=branch, followup_state=FollowupState.OWED).exists()


@retry_on_deadlock
def drain_mailbox(branch: Branch, job: Job | None, *, reconciling: bool = False, owed: bool | None = None) -> list:
    """Append every result owed to ``branch`` as an ``agent_message`` node
    (docs/contract.md#results-come-back-exactly-once).

    Called by the running turn before each model call, after all tool results.
    ``reconciling``: the first drain of a user turn, which settles what finished while the
    branch was idle. ``owed``: whether anything is owed, when the caller has just read it
    (the claim's UPDATE, for the turn's first drain); None: looked up here.
    """
    if not (results_owed(branch) if owed is None else owed):
        return []
    written = []
    with transaction.atomic(), kept_on_rollback(branch):
        lock_for_branch(branch.pk)  # session, branch, then the jobs (collab/services/locking.py)
        owed = list(
            Job.objects.select_for_update(no_key=True).with_result()
            .filter(caller_branch=branch, followup_state=FollowupState.OWED)
            .order_by("finished_at", "pk")
        )
        for debt in owed:
            if not Job.objects.filter(pk=debt.pk, followup_state=FollowupState.OWED).update(
                followup_state=FollowupState.DELIVERED
            ):
                continue
            written.append(
                append_message(
                    branch, role=MessageRole.USER, kind=MessageKind.AGENT_MESSAGE, job=job,
                    **mailbox_entry(debt, reconciling=reconciling),
                )
            )
            send_event_on_commit(branch.session_id, "followup.drained", {"job": debt.pk, "into": getattr(job, "pk", None)})
    return written


@retry_on_deadlock
def deliver_owed(branch_id: str) -> list[Job]:
    """Settle results owed to an idle branch as follow-up turns (own transaction)."""
    with transaction.atomic():
        return deliver_owed_locked(lock_for_branch(branch_id))


def deliver_owed_locked(branch: Branch, *, idle: bool = False) -> list[Job]:
    """Precondition: the branch row (and its session's) is locked in the current transaction.
    ``idle``: the caller knows no turn runs on the branch — the completion of the turn that did
    (one active job per branch, ``job_one_active_per_branch``) — so it is not looked up.

    A result whose caller was cancelled (the caller job is ``stopping`` or ``cancelled``:
    the child was cancelled by that cancel's cascade, or finished as it came) is written
    as a notice on the branch, never turned into a model turn (the cancel fence): a cancelled
    branch stays stopped, and the transcript shows how each child ended."""
    if not idle and is_busy(branch):
        return []  # the running turn drains them before its next model call
    bounce_stranded_locked(branch, idle=idle)
    admitted = []
    owed = (
        Job.objects.select_related("branch", "caller_job").with_result()
        .filter(caller_branch=branch, followup_state=FollowupState.OWED)
        .exclude(followup_mode="mailbox")
        .order_by("finished_at", "pk")
    )
    for debt in owed:
        if not Job.objects.filter(pk=debt.pk, followup_state=FollowupState.OWED).update(
            followup_state=FollowupState.DELIVERED
        ):
            continue
        if debt.caller_job is not None and debt.caller_job.status in FENCED:
            write_cancel_notice(branch, debt)
            continue
        try:
            with transaction.atomic():
                admitted.append(
                    admit_job(
                        session=branch.session, branch=branch, kind=JobKind.FOLLOWUP, prompt=result_notice(debt),
                        started_by=debt.started_by, followup_of=debt, caller_job=None, parent_job=None,
                        check_quota=False,
                        chain_messages=debt.chain_messages + 1,
                        chain_generations=max(debt.chain_generations - (1 if debt.kind == JobKind.SPAWN else 0), 0),
                    )
                )
            fault_point("followup.admitted")  # admitted and marked delivered, not yet committed
        except DomainError as exc:  # e.g. the caller branch was archived meanwhile
            send_event_on_commit(
                branch.session_id, "followup.undeliverable", {"job": debt.pk, "code": exc.code, "reason": exc.detail}
            )
            bounce_result(branch, debt, exc)
    return admitted


def bounce_stranded_locked(branch: Branch, *, idle: bool = False) -> list[Job]:
    """Results owed in mode ``mailbox`` to an archived branch with no running turn: no turn will
    ever drain them (archived is final), so each is settled now, once — marked delivered
    (a conditional UPDATE) and bounced to the agent that produced it as a failed result, like a
    turn-mode result refused by an archived caller. Returns the
    debts settled. Precondition: the branch row (and its session's) is locked."""
    if not branch.archived or (not idle and is_busy(branch)):
        return []  # a running turn (archive never cancels it) still drains its mailbox
    exc = Invalid(f"agent {branch.display_name} is archived; its mailbox is never read again", code="archived")
    settled = []
    owed = (
        Job.objects.select_related("branch", "session")
        .filter(caller_branch=branch, followup_state=FollowupState.OWED, followup_mode="mailbox")
        .order_by("finished_at", "pk")
    )
    for debt in owed:
        if not Job.objects.filter(pk=debt.pk, followup_state=FollowupState.OWED).update(
            followup_state=FollowupState.DELIVERED
        ):
            continue
        send_event_on_commit(
            branch.session_id, "followup.undeliverable", {"job": debt.pk, "code": exc.code, "reason": exc.detail}
        )
        bounce_result(branch, debt, exc)
        settled.append(debt)
    return settled


def bounce_result(branch: Branch, debt: Job, exc: DomainError) -> Job | None:
    """A result ``branch`` can no longer take (archived meanwhile) goes back to the agent that
    produced it as a failed result, once; a failure notice is never bounced again."""
    if debt.error_code in NOTICE_CODES or debt.kind == JobKind.FOLLOWUP:
        return None
    reason = (f"the result of execution {debt.pk} could not be delivered to {branch.display_name!r}: "
              f"{exc.detail}")
    return record_failed_delivery(
        target=branch, kind="message", text=f"(result of execution {debt.pk})", sender_session=debt.session,
        sender_branch=debt.branch, sender_job=debt, started_by=debt.started_by, code="result_undeliverable",
        reason=reason, chain=(debt.chain_messages + 1, debt.chain_generations),
    )


def write_cancel_notice(branch: Branch, debt: Job) -> None:
    """The result of a child whose caller was cancelled, as a ``notice`` node at the branch's
    tip (exactly once: a deterministic dedupe key). Precondition: the branch row is locked."""
    text, span = _notice_with_span(debt)
    append_message(
        branch, role=MessageRole.USER, kind=MessageKind.NOTICE, text=text, dedupe_key=f"result:{debt.pk}",
        metadata={**delivery_metadata(debt, span), "cancelled_with": debt.caller_job_id},
    )
    send_event_on_commit(branch.session_id, "followup.noticed", {"job": debt.pk, "caller_job": debt.caller_job_id})


def deliver_owed_after_commit(branch_id: str) -> None:
    def run():
        fault_point("followup.owed")  # the result is committed as owed; its delivery not yet begun
        try:
            deliver_owed(branch_id)
        except Exception:  # the debt stays owed; the next turn end or the reconciler settles it
            log.exception("could not deliver follow-ups to branch %s", branch_id)

    transaction.on_commit(run)


def record_failed_delivery(*, target, kind: str, text: str, sender_session, sender_branch, sender_job, started_by,
                           code: str, reason: str, chain: tuple[int, int], followup_mode: str = "") -> Job:
    """A delivery that will never run (rejected by a person, dropped from a full inbox, its
    target archived meanwhile) as a failed execution whose result is owed to the sender: it
    reaches the sender exactly once through the ordinary follow-up path. ``chain`` is the
    delivery's (messages, generations) — the sender's plus the message it spent — so the
    notice continues the sender's chain and a retry loop runs out of budget (docs/contract.md#topology-budgets).
    Precondition: inside ``transaction.atomic``."""
    job = Job.objects.create(
        project_id=target.session.project_id, session=target.session, branch=target,
        kind=JobKind.TASK if kind == "task" else JobKind.MESSAGE, status=JobStatus.FAILED, prompt=clean_text(text),
        caller_session=sender_session, caller_branch=sender_branch, caller_job=sender_job, parent_job=sender_job,
        started_by=started_by, result_text=reason, is_error=True, error_code=code, error_reason=reason,
        finished_at=Now(), followup_state=FollowupState.OWED if sender_branch else FollowupState.NONE,
        followup_mode=followup_mode, chain_messages=chain[0], chain_generations=chain[1],
    )
    job.refresh_from_db(fields=["finished_at"])
    if sender_branch is not None:
        deliver_owed_after_commit(sender_branch.pk)
    return job
