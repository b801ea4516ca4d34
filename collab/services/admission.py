"""Admitting jobs: the one door every turn comes through (docs/contract.md#admission-budgets-and-quotas).

A job is admitted in the caller's transaction with the target branch row
locked, so two admissions on one branch serialize (lock order session → branch →
job, collab/services/locking.py). Cancel is a fence (docs/contract.md#the-cancel-fence): a job
started under a calling job (``parent_job``) is admitted only while that job,
locked in the same transaction, is not ``stopping`` or ``cancelled``. If the branch is idle the
prompt node is written right away; otherwise it is written when the job is
claimed, at the branch's tip of that moment, so queued turns never fork it.
The job reaches the worker queue with the admission: its task row is written in the same
transaction where the database is the broker, and sent after the commit with Redis
(``collab.brokers.hand_to_broker``); either way no worker sees it before its rows.
"""

from collab.brokers import hand_to_broker
from collab.errors import Conflict, Invalid, NotFound
from collab.events import deferred_event, job_event_ref, send_event_on_commit, send_events_on_commit
from collab.models import (
    MAX_PROMPT_CHARS,
    Branch,
    Job,
    JobKind,
    JobStatus,
    MessageKind,
    MessageRole,
    Session,
    effective_spec_id,
    format_address,
    is_occupied,
)
from collab.models.ids import new_id
from collab.infra.prepared import Insert
from collab.infra import tracing
from collab.services.budgets import check_admission_quota
from collab.services.locking import lock_branch, lock_job, lock_sessions
from collab.services.messages import append_message
from collab.text import clean_text

RUN_TURN = "collab.tasks.run_turn"
PROMPT_KIND = {
    JobKind.USER: MessageKind.NORMAL,
    JobKind.SPAWN: MessageKind.AGENT_SPAWN,
    JobKind.TASK: MessageKind.TASK,
    JobKind.MESSAGE: MessageKind.MESSAGE,
    JobKind.FOLLOWUP: MessageKind.FOLLOWUP,
}

def check_prompt(prompt: str) -> str:
    """Every turn's prompt (a person's, a delegation's, a spawn's): a non-empty string, bounded."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise Invalid("prompt must be a non-empty string", code="invalid_prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise Invalid(f"prompt is longer than {MAX_PROMPT_CHARS} characters", code="prompt_too_long")
    return prompt


def job_wire(job: Job) -> dict:
    return {
        "job": job.pk,
        "status": job.status,
        "version": job.version,
        "kind": job.kind,
        "branch": job.branch_id,
        "is_error": job.is_error,
        "error_code": job.error_code,
    }


def send_job_event(job: Job, type_: str, session: Session | None = None, actor=None, *, events=None) -> None:
    """A job's state change, on its session's log — and, for an OpenWork child, on the parent
    session's too (``child.job``), so the parent's agent rail updates live. ``events``: events of
    the job's session deferred until now (``append_message``'s), sent first, in one statement.
    The log keeps what its readers cannot derive (``job_event_ref``)."""
    wire = job_wire(job)
    stored = job_event_ref(type_, wire)
    if events:
        send_events_on_commit(job.session_id, [*events, deferred_event(type_, wire, actor, stored=stored)])
        events.clear()
    else:
        send_event_on_commit(job.session_id, type_, wire, actor=actor, stored=stored)
    session = session if session is not None else job.session
    if session.parent_session_id:
        send_event_on_commit(
            session.parent_session_id, "child.job", {**job_wire(job), "state": type_, "session": job.session_id},
        )


def admit_job(
    *,
    session: Session,
    branch: Branch,
    kind: str,
    prompt: str,
    started_by,
    agent_spec=None,
    header: str = "",
    enqueue: bool = True,
    check_quota: bool = True,
    sessions_locked: bool = False,
    fresh_branch: bool = False,
    events: list | None = None,
    **fields,
) -> Job:
    """Create a queued Job on ``branch`` and (unless ``enqueue`` is False, for jobs the
    caller runs inline) hand it to the worker queue (``enqueue_job``). ``check_quota=False``
    is for deliveries the system already owes (follow-ups, drained inbox entries): they
    count towards the session's totals but are never refused.

    Precondition: inside ``transaction.atomic``; authorization already checked
    by the caller (through ``collab.access``); no branch or job locked yet in this
    transaction other than ``branch`` and the rows of its session (lock order).
    ``sessions_locked``: the caller holds the row locks of ``session`` and of the calling job's
    session already. ``fresh_branch``: ``branch`` was created in this transaction, so no one else
    sees it yet: it is not locked again, and it is neither archived nor busy. ``events``: events of
    ``session`` the caller deferred, sent first, in the job's statement (``send_job_event``).
    """
    caller = fields.get("parent_job")
    if not sessions_locked and session.pk not in lock_sessions(session.pk, getattr(caller, "session_id", None)):
        raise NotFound()  # deleted while this waited for its lock (services.sessions.do_delete_session)
    locked = branch if fresh_branch else lock_branch(branch.pk)
    if locked.archived:
        raise Invalid(f"agent {locked.display_name} is archived; fork it with start_from to continue", code="archived")
    if caller is not None:
        check_caller_not_stopping(caller)
    if check_quota:
        check_admission_quota(session)
    prompt, header = clean_text(prompt or ""), clean_text(header or "")[:300]
    # an idle branch gets the prompt node now (read with the branch locked: its open jobs change
    # only under this lock); its id is the job's prompt_msg from the INSERT on (the foreign key is
    # checked at commit), so the job row is not written twice
    idle = fresh_branch or not is_occupied(locked)
    prompt_msg_id = new_id() if idle else None
    # the prompt is stored once: in the node when it is written now, else in the
    # job row until the claim writes the node (it clears the row's copy in its UPDATE)
    job = _NEW_JOB.create(
        project_id=session.project_id,
        session=session,
        branch=locked,
        agent_spec_id=getattr(agent_spec, "pk", None) or effective_spec_id(locked, session),  # no reads
        kind=kind,
        status=JobStatus.QUEUED,
        prompt=None if idle else prompt,
        prompt_header=header,
        parent_msg_id=locked.tip_id,
        prompt_msg_id=prompt_msg_id,
        started_by=started_by,
        trace_context=joined_trace(fields.get("followup_of")),
        **fields,
    )
    if enqueue:
        # with Redis, first among the commit's callbacks: the worker's hand-off does not wait behind
        # the push of this admission's events (listeners order events by seq, whenever they arrive)
        enqueue_job(job.pk)
    events = [] if events is None else events  # with the prompt node's and the job's: one statement
    if idle:
        write_prompt_node(job, locked, prompt, message_id=prompt_msg_id, events=events)
    send_job_event(job, "job.queued", session, actor=started_by, events=events)
    return job


# every admission writes one (compiled once per process: collab.infra.prepared)
_NEW_JOB = Insert("new_job", Job)


def joined_trace(followup_of: Job | None) -> str:
    """The trace the admitted job joins (docs/operations.md#traces), written by its INSERT: the
    span admitting it — a turn's tool call, or a turn's completion — else, for a follow-up
    admitted outside any turn (by the reconciler), the trace of the job whose result it carries.
    Empty while tracing is off, and outside any span (a person's turn: its run starts the trace)."""
    if not tracing.ENABLED:
        return ""
    carried = tracing.trace_context_now()
    if carried or followup_of is None:
        return carried
    return followup_of.__dict__.get("trace_context", "")  # as it was loaded: never a read of its own


FENCED = (JobStatus.STOPPING, JobStatus.CANCELLED)


def check_caller_not_stopping(caller: Job) -> None:
    """The cancel fence: nothing new starts under a job that is being or was cancelled.
    Locks the calling job's row (last, after the sessions and the branch), so a cancel
    either commits first and is seen here, or waits until this admission has committed
    and then cascades to what it admitted."""
    current = lock_job(caller.pk)
    if current is not None and current.status in FENCED:
        raise Conflict(
            f"execution {caller.pk} is {current.status}: it was cancelled, so nothing new starts under it",
            code="caller_cancelled",
        )


def write_prompt_node(job: Job, branch: Branch, prompt: str, *, message_id: str | None = None,
                      events: list | None = None):
    """The user-role node that opens the job's turn, at the branch's current tip: ``prompt`` (the
    job's, which the job row no longer holds once this node does: ``Job.prompt_text``) after the
    job's header. Precondition: the job's session and ``branch`` are locked in this transaction.
    ``message_id``: the id the job row already names as its ``prompt_msg`` (the admission);
    without it the job row is pointed at the new node here (a claim). ``events``: as ``append_message``'s."""
    text = f"{job.prompt_header}\n\n{prompt}" if job.prompt_header else prompt
    message = append_message(
        branch,
        role=MessageRole.USER,
        kind=PROMPT_KIND[job.kind],
        text=text,
        job=job,
        metadata=prompt_metadata(job),
        starts_turn=True,
        actor=job.started_by_id if job.kind == JobKind.USER else None,
        session_locked=True,  # by the admission or the claim, before the branch
        message_id=message_id,
        events=events,
        moves_head=job.kind == JobKind.USER,  # a person's turn moves their selection along
    )
    job.prompt_msg = message
    if message_id is None:
        Job.objects.filter(pk=job.pk).update(prompt_msg=message)
    return message


def prompt_metadata(job: Job) -> dict:
    """The prompt node's metadata: what the node's columns do not hold (its ``job`` column names
    the job), the header only when there is one (readers take a missing one as
    none)."""
    meta = {"header": job.prompt_header} if job.prompt_header else {}
    if job.caller_msg_id:
        meta["caller"] = format_address(job.caller_session_id, job.caller_msg_id)
    if job.kind == JobKind.SPAWN and job.caller_session_id:
        meta["spawned_from_session"] = job.caller_session_id
    if job.followup_of_id:
        meta["followup_of"] = job.followup_of_id
    return meta


def enqueue_job(job_id: str) -> None:
    """Hand the job to a worker: its task is written with the admission (the database as the
    broker) or sent once the admission has committed (Redis), ``collab.brokers.hand_to_broker``."""
    hand_to_broker(RUN_TURN, job_id, task_name=f"turn-{job_id}")
