"""Job lifecycle on the worker side: claim, status checks, finish (docs/architecture.md#a-request-a-turn-an-event).

Leases are renewed by the worker process, not here (collab/services/liveness.py).

A turn costs three commits: the admission (elsewhere), the claim, and one
completion transaction that writes the final node, the terminal state, the
events and whatever the completion owes (the next queued job on the branch).
"""

from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, DurationField, Exists, F, IntegerField, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from accounts.limits import effective_limit, limit_in_force
from accounts.models import Project
from collab.models import (
    ACTIVE_STATUSES,
    AskStatus,
    PersonAsk,
    Branch,
    FollowupState,
    InboxEntry,
    Job,
    JobKind,
    JobStatus,
    Message,
    MessageRole,
    Webhook,
    is_busy,
)
from collab.events import send_event_on_commit
from collab.services.admission import FENCED, enqueue_job, send_job_event, write_prompt_node
from collab.services.archive import AUTOMATIC_REASON, do_archive_branch
from collab.services.artifacts import store_result
from collab.services.deliver import drain_inbox_locked
from collab.services.fair_share import (
    fairest_queued_job,
    lock_project_for_claim,
    running_cap,
    running_slot_free,
    slot_waiters,
    wait_for_slot,
    wake_waiting_in_project,
)
from collab.services.followup import deliver_owed_after_commit, deliver_owed_locked, owes_followup
from collab.services.budgets import live_slots_free
from collab.services.locking import lock_branch, lock_branch_if_any, lock_job, lock_sessions, refresh_from_row
from collab.services.messages import append_message
from collab.services.naming import schedule_naming
from collab.infra.prepared import Param, Select, Update
from collab.services.retry import retry_on_deadlock
from collab.services.webhooks import owe_webhook_deliveries
from collab.text import clean_text
from collab.worker_name import process_name

def lease_deadline(length=None):
    """The database's now + the lease, as an expression: every lease is set and checked on
    the database clock, never an app server's. ``length``: the lease's length as an expression
    (a prepared statement's ``Param``, bound to ``lease_length()``); default the setting's."""
    return Now() + (lease_length() if length is None else length)


def lease_length() -> timezone.timedelta:
    return timezone.timedelta(seconds=settings.TRELLIS_LEASE_SECONDS)


# The claim's statements, compiled once per process (collab.infra.prepared: a worker makes
# them at every turn). The first look, no lock (everything is read again after its lock): the
# branch and session come with it, for the archived check and the session's parent (set once,
# at creation), and the spec the job was admitted with (the turn's; never locked, so read here
# as well as later) and the prompt node an idle branch's admission wrote (it holds the prompt:
# Job.prompt_text)
_FIRST_LOOK = Select("claim.first_look", lambda: Job.objects.select_related(
    "project", "branch", "session", "agent_spec", "prompt_msg").filter(pk=Param("job")))


def _claimable(job_id):
    """The job's row while it may start but for its project's cap: still queued, no job running
    (or waiting for a person) on its branch and none queued there before it (``job_id``: a value,
    or the claim's ``Param``)."""
    busy = Job.objects.holding().filter(branch=OuterRef("branch"))
    earlier = Job.objects.filter(
        branch=OuterRef("branch"), status=JobStatus.QUEUED, created_at__lt=OuterRef("created_at")
    )
    queued = Param.hidden("queued", JobStatus.QUEUED) if isinstance(job_id, Param) else JobStatus.QUEUED
    return Job.objects.filter(pk=job_id, status=queued).filter(~Exists(busy), ~Exists(earlier))


def _claim(capped: bool):
    """The claim's conditional UPDATE (``claim_job``): the job, still queued, with no job running
    on its branch and none queued there before it; ``capped``: with a worker slot of its project
    free, counted by the UPDATE itself (the project is locked: fair_share) — at the cap the job
    stays queued, woken when a job of its project ends."""
    claimable = _claimable(Param("job"))
    if capped:
        claimable = claimable.filter(running_slot_free(Param("project"), Param("cap")))
    sets = {
        "status": JobStatus.RUNNING,
        "version": F("version") + 1,
        "started_at": Coalesce("started_at", Now()),  # a turn resumed after a person's decision keeps its start
        "worker": Param("worker"),
        "heartbeat_at": Now(),
        "lease_expires_at": lease_deadline(Param("lease", DurationField())),
        "prompt": None,  # the prompt node holds it from now on (written by the claim if not yet)
    }
    # whether results wait in the branch's mailbox: the turn's first drain reads it from here
    # instead of asking again (collab.services.followup.drain_mailbox)
    returning = {"results_owed": Exists(Job.objects.filter(caller_branch=OuterRef("branch"),
                                                           followup_state=FollowupState.OWED))}
    return claimable, sets, returning


_CLAIM = Update("claim", _claim)


@retry_on_deadlock
def claim_job(job_id: str, *, inline: bool = False) -> Job | None:
    """Take a queued job for this worker, or None if another worker has it, it is no
    longer queued, or an earlier job on its branch must run first (it is re-enqueued
    when that one ends), or its session has no free live slot, or its project is at its
    running cap (docs/capacity.md#fair-share; ``inline`` jobs run in their caller's slot). A conditional
    UPDATE, so two workers can never both win.

    Locks project → sessions → branch → calling job → job (collab/services/locking.py),
    every row read after its lock. A job whose calling job is ``stopping`` or
    ``cancelled`` never starts: it ends ``cancelled`` here (the cancel fence), even if
    the cancel's cascade has not reached it yet. A queued job whose branch was archived
    meanwhile is refused instead (``refuse_start``): nothing is written on the branch."""
    job = _FIRST_LOOK.first(job=job_id)  # no lock: everything is read again below, after its lock
    if job is None or job.status != JobStatus.QUEUED:
        return None
    if not inline and job.branch.archived:
        refuse_start(job)
        return None
    if not inline and not live_slots_free(job.session_id, job.project):
        return None
    spec, prompt, prompt_msg = job.agent_spec, job.prompt, job.prompt_msg  # set at the admission, never changed
    try:
        with transaction.atomic():
            project = job.project  # an inline job runs in its caller's slot: no project lock, no cap
            cap = None
            if not inline:
                project = lock_project_for_claim(job.project_id)
                cap = running_cap(project)
            session = lock_sessions(job.session_id, job.session.parent_session_id)[job.session_id]  # lock_session_family, parent known
            branch = lock_branch(job.branch_id)
            if branch.archived and not inline:
                raise _Archived  # archived since the check above: refused, nothing written
            if job.parent_job_id and _caller_fenced(job):
                return None
            # fair share: with a cap, the UPDATE counts the project's jobs in worker slots (_claim)
            won = _CLAIM.run(cap is not None, job=job_id, project=job.project_id, cap=cap,
                             worker=process_name(), lease=lease_length())
            if not won:
                if cap is not None:  # declined for the cap? then it waits for a slot
                    wait_for_slot(job_id, project, _claimable(job_id))
                return None
            job = won[0]  # the row as the claim left it, read by the UPDATE (no second read)
            job.results_owed = bool(job.results_owed)
            job.project, job.session, job.branch = project, session, branch  # each read after its lock
            if spec is not None and job.agent_spec_id == spec.pk:  # a job may have no spec (the scripted default)
                job.agent_spec = spec
            _share_reads(job, branch)
            events = []  # the prompt node's (if written now) and job.running: one statement
            if job.prompt_msg_id is None:
                write_prompt_node(job, branch, prompt, events=events)
            elif prompt_msg is not None and prompt_msg.pk == job.prompt_msg_id:
                job.prompt_msg = prompt_msg  # the turn reads its prompt from it (Job.prompt_text)
            limit = effective_limit(job.project, "max_live_per_session")
            if limit and not inline:
                # checked again with the session row locked and this claim counted, so two
                # claims in one session cannot both take its last live slot
                if Job.objects.running().filter(session_id=job.session_id).count() > limit:
                    raise _NoLiveSlot
            send_job_event(job, "job.running", job.session, events=events)
            return job
    except _NoLiveSlot:  # rolled back; the job that holds the slot wakes the next one when it ends
        return None
    except _Archived:  # rolled back: still queued, now refused
        refuse_start(job)
        return None
    except IntegrityError:
        # the one-active-job-per-branch index: another claim on this branch won the race
        return None


PICK_ATTEMPTS = 3  # fair picks a contended claim tries before it claims its task's own job


def claim_for_slot(job_id: str, *, contended: bool) -> Job | None:
    """The claim of a worker task that holds a free turn slot (``collab.runtime.loop.hand_to_slot``).

    Uncontended, the task claims its own job, as a task always did (no extra statement). While
    its process's slots are ``contended`` (all in use, now or a moment ago) the slot goes to the
    fairest queued job instead (``fair_share.fairest_queued_job``: the oldest of the project with
    the fewest jobs in worker slots), which may be another project's turn queued far behind this
    task in the broker. Then the task's own job, if it still waits for a task (queued, not waiting
    for its project's cap), is handed to the broker again, so every queued job keeps a task on the
    way; the task of the job claimed in its place later finds that job gone and does nothing. A pick
    that its claim turns down (another worker claimed it first; its session or project is at its
    cap) rules out that project for the next of ``PICK_ATTEMPTS`` picks; after them, or when
    nothing is picked, the task claims its own job. Every task claims at most one job, by the
    same conditional claim: none runs twice. Returns the claimed job, or None."""
    if not contended:
        return claim_job(job_id)
    ruled_out: set[int] = set()
    for _ in range(PICK_ATTEMPTS):
        pick = fairest_queued_job(ruled_out=ruled_out)
        if pick is None:
            break
        pick_id, project_id = pick
        if pick_id == job_id:
            break
        job = claim_job(pick_id)
        if job is not None:
            _hand_out_again(job_id)
            return job
        ruled_out.add(project_id)
    return claim_job(job_id)


def _hand_out_again(job_id: str) -> None:
    """A task's slot went to another job: its own job, if it still waits for a task (queued and
    not marked waiting for its project's cap, whose wake hands it out), gets a new one. The
    reconciler's clock of when a queued job was last handed out (``heartbeat_at``) moves with it."""
    if Job.objects.filter(pk=job_id, status=JobStatus.QUEUED, waiting_since__isnull=True).update(heartbeat_at=Now()):
        enqueue_job(job_id)


def _share_reads(job: Job, branch: Branch) -> None:
    """The turn reads the branch's session and spec (its tool surface, its role): hand it the
    rows the claim has just read with the job (after the locks) instead of reading them again."""
    branch.session = job.session
    for holder in (branch, job.session):
        if holder.agent_spec_id is not None and holder.agent_spec_id == job.agent_spec_id:
            holder.agent_spec = job.agent_spec


def _caller_fenced(job: Job) -> bool:
    """With the job's sessions and branch locked: if its calling job is stopping or cancelled,
    end the job ``cancelled`` without starting it and say so."""
    caller = lock_job(job.parent_job_id)
    if caller is None or caller.status not in FENCED:
        return False
    finish_job(
        job, status=JobStatus.CANCELLED, final_text=None, result_text="cancelled before it started",
        is_error=True, error_code="cancelled",
        error_reason=f"the execution was cancelled before it started: its caller {caller.pk} was cancelled",
        from_statuses=(JobStatus.QUEUED,),
    )
    return True


class _NoLiveSlot(Exception):
    pass


class _Archived(Exception):
    pass


def refuse_start(job: Job) -> Job:
    """A queued job whose branch was archived before it started: it ends ``failed`` without
    writing anything on the branch (no prompt node, no turn), and its sender — whoever
    delivered it, message or task — is owed the failure as a result (docs/contract.md#archive)."""
    reason = f"agent {job.branch.display_name!r} was archived before this delivery started"
    return finish_job(job, status=JobStatus.FAILED, final_text=None, result_text=reason, is_error=True,
                      error_code="archived", error_reason=reason, from_statuses=(JobStatus.QUEUED,), refused=True)


_STATUS = Select("job.status", lambda: Job.objects.filter(pk=Param("job")).values_list("status", flat=True))


def current_status(job: Job) -> str:
    """The job's status now (the turn loop's stop check; the lease is the worker process's)."""
    return _STATUS.first(job=job.pk)


@retry_on_deadlock
def finish_job(
    job: Job,
    *,
    status: str,
    final_text: str | None,
    result_text: str,
    is_error: bool = False,
    error_code: str = "",
    error_reason: str = "",
    usage: dict | None = None,
    from_statuses=ACTIVE_STATUSES,
    lease_expired: bool = False,
    refused: bool = False,
) -> Job:
    """The completion transaction (one commit): the final node, the terminal
    state, the bounded result (full text as an Artifact), the follow-up owed to the
    caller, the project's webhook deliveries, the branch's inbox turned into turns, results owed to this branch settled,
    archive-when-done, naming, the next job.

    Only a job whose status is in ``from_statuses`` (running or stopping, or queued for
    a cancel before start) can finish; a job ended by someone else is left alone. With
    ``lease_expired`` (reconcile) it must also still have a lease that ran out on the
    database clock, checked under the row lock and in the UPDATE that ends it, so a job
    whose live worker renewed it meanwhile is never ended. Returns ``job`` itself if this
    call ended it, else the row as it is. ``refused``: a start refused on an archived
    branch, owed to its sender whatever its kind.
    """
    usage = usage or {}
    owed = owes_followup(job, refused=refused)
    with transaction.atomic():
        # lock order session(s) → branch → job; every row read after its lock
        known, on = job._state.fields_cache.get("session"), job._state.fields_cache.get("branch")
        if known is not None and on is not None and known.pk == job.session_id == on.session_id:
            # a branch keeps its session, and a session its parent (each set once, at creation):
            # the claim read them already, after their locks
            session_id, parent_id = job.session_id, known.parent_session_id
        else:
            ids = Branch.objects.filter(pk=job.branch_id).values_list("session_id", "session__parent_session_id").first()
            if ids is None:  # its session was deleted while the turn ran: nothing is left to finish
                return job
            session_id, parent_id = ids
        session = lock_sessions(session_id, parent_id).get(session_id)  # lock_session_family, in one read less
        branch = lock_branch_if_any(job.branch_id)
        if branch is None or session is None:
            return job
        branch.session = session
        summary, artifact = store_result(job, result_text)
        # an answer that is the whole result is stored once, in its node:
        # the job row holds NULL, which ``Job.result`` reads as the final answer's text
        kept = None if final_text is not None and artifact is None and summary == clean_text(final_text) else summary
        # the job's end, decided and written by one conditional UPDATE, which locks the row and
        # reads it as it leaves it (no locked read before it). A job leaves ``stopping`` only as
        # ``cancelled`` (the database guard agrees, migration 0012): an answer or error
        # that raced the cancel is not kept — the UPDATE itself picks the cancel's values when it
        # finds the row stopping
        spent = tuple(k for k in USAGE_FIELDS if k in usage)
        ended = _FINISH.run(
            tuple(from_statuses), lease_expired, status == JobStatus.CANCELLED, spent,
            job=job.pk, followup_state=FollowupState.OWED if owed else FollowupState.NONE,
            status=status, result_text=kept, result_artifact=getattr(artifact, "pk", None),
            is_error=is_error, error_code=error_code, error_reason=clean_text(error_reason),
            **{k: usage[k] for k in spent},
        )
        if not ended or ended[0].status != status:
            if artifact is not None:  # its result was not kept: neither is its full text
                artifact.delete()
            if not ended:  # ended by someone else meanwhile (or gone): left alone
                return Job.objects.filter(pk=job.pk).first() or job
            status, final_text = ended[0].status, None  # the cancel won the race
        ended = ended[0]
        if JobStatus.WAITING in from_statuses:  # a cancel of a turn that waited for a person
            close_asks(job)
        is_error = ended.is_error
        ran = ended.started_at is not None
        if ran and status != JobStatus.SUCCEEDED:
            # a turn that answered wrote every result before its last model call: nothing dangles
            close_dangling_calls(job, branch, status)
        events = []  # the answer's and the job's end: one statement
        if final_text is not None:
            append_message(
                branch, role=MessageRole.ASSISTANT, text=final_text, job=job,
                metadata={"final": True, "is_error": is_error}, session_locked=True,
                ends_turn=ran,  # the turn is counted by the statement that moves the tip
                events=events,
                moves_head=job.kind == JobKind.USER,  # the person's selection follows to the answer
            )
        elif ran:
            Branch.objects.filter(pk=branch.pk).update(turns=F("turns") + 1)
        if ran:
            branch.turns += 1
        project = job.project  # loaded with the claimed job (the refresh drops it)
        refresh_from_row(job, ended)  # job.refresh_from_db(), from the row the UPDATE returned
        if job.result_text is None:
            job.final_answer = summary  # Job.result, as the answer's node holds it: not read again
        send_job_event(job, f"job.{status}", branch.session, events=events)
        # the branch's turn is over: what waited for it may go now. One statement says what there
        # is (the branch is locked: its inbox, owed results and queue are read after the lock) and
        # whether the project has webhooks; each is then handled as before, only when there is
        # something to handle
        waiting = _waiting_on(branch.pk, project.pk, background=job.run_in_background) if ran else None
        # its webhooks hear of it after commit
        owe_webhook_deliveries(job, project, branch.session, any_active=waiting.webhooks if ran else True)
        if job.archive_when_done:
            do_archive_branch(branch, user=job.started_by, reason=AUTOMATIC_REASON, automatic=True)
        if ran:
            if waiting.inbox:  # its inbox goes now, whatever ended the turn (docs/contract.md#the-inbox)
                drain_inbox_locked(branch)
            if waiting.owed:
                deliver_owed_locked(branch, idle=True)  # this job was its one active job
            schedule_naming(branch.pk, branch.turns, branch.name_stage)
            if waiting.inbox or waiting.owed:  # jobs may have been admitted above: read again
                enqueue_next_on_branch(branch.pk)
            elif waiting.next_on_branch:
                enqueue_job(waiting.next_on_branch)
            if effective_limit(project, "max_live_per_session"):
                enqueue_next_in_session(branch.session_id)
            if waiting.in_project is not None:
                _wake_for_slot(project, branch.pk, waiting)
        else:
            if not is_busy(branch):
                # the branch is idle (a queued job ended before it started): its inbox goes now,
                # whatever ended it
                drain_inbox_locked(branch)
            enqueue_next_on_branch(branch.pk)
            if job.run_in_background and running_cap(project) is not None:
                # it may have been woken for a worker slot it never took (cancelled, refused while
                # queued): the slot goes to the next job waiting for one
                unused = _waiting_on(branch.pk, project.pk, background=True)
                if unused.in_project is not None:
                    _wake_for_slot(project, branch.pk, unused)
        if owed:
            deliver_owed_after_commit(job.caller_branch_id)
    return job


STOPPED_AS = {  # what a job that was stopping ends with, whatever its turn ended with
    "status": JobStatus.CANCELLED, "result_text": "cancelled", "result_artifact": None, "is_error": True,
    "error_code": "cancelled", "error_reason": "the execution was cancelled",
}


USAGE_FIELDS = ("model_calls", "tool_calls", "tokens_in", "tokens_out", "cost")


def _finish(from_statuses: tuple, lease_expired: bool, cancelling: bool, spent: tuple):
    """The UPDATE that ends a job (``finish_job``): only from ``from_statuses`` and (``lease_expired``)
    with a lease that ran out on the database clock. Its end — status, result, error — is a
    ``Param`` each, as a CASE that takes ``STOPPED_AS``'s value instead when the row is
    ``stopping``, unless the job is ``cancelling`` anyway; ``spent``: the usage fields it sets."""
    guard = Q(status__in=from_statuses)
    if lease_expired:
        guard &= Q(lease_expires_at__lt=Now())
    sets = {"version": F("version") + 1, "finished_at": Now(), "lease_expires_at": None,
            "followup_state": Param("followup_state"), **{name: Param(name) for name in spent}}
    for name in STOPPED_AS:
        field = Job._meta.get_field(name)
        if cancelling:
            sets[name] = Param(name)
        else:
            sets[name] = Case(When(status=JobStatus.STOPPING, then=Value(STOPPED_AS[name])),
                              default=Param(name, field), output_field=field)
    return Job.objects.filter(guard, pk=Param("job")), sets, {}


_FINISH = Update("finish", _finish)


@dataclass(frozen=True)
class _Waiting:
    inbox: bool
    owed: bool
    next_on_branch: str | None
    in_project: int | None  # a job of another branch waits for a slot: the project's jobs in worker slots
    webhooks: bool
    max_running_jobs: int | None = None  # the project's own cap as it is now (``background`` only)


def _waiting_on(branch_id: str, project_id: int, *, background: bool) -> _Waiting:
    """What waits for a branch whose turn just ended, in one statement: entries in its inbox,
    results owed to it (any mode), its oldest queued job, (``background``: the job held a
    worker slot of its project) whether jobs of its project on other branches wait for a slot
    (then with the project's count of jobs in worker slots: ``fair_share.slot_waiters``), and whether the
    project has an active webhook (read again, held against deletion, only then). Precondition:
    the branch is locked (its inbox and queue change only under that lock)."""
    row = _WAITING.first(background, branch=branch_id, project=project_id)
    if row is None:
        return _Waiting(False, False, None, None, True)
    inbox, owed, nxt, in_project, webhooks, cap = row
    return _Waiting(bool(inbox), bool(owed), nxt, in_project, bool(webhooks), cap)


def _waiting(background: bool):
    """``_waiting_on``'s statement (compiled once per process and ``background``)."""
    branch_id, project_id = Param("branch"), Param("project")
    # the status hidden from the planner: the branch's index (branch, status, created_at) is then
    # the only one to read, not every queued job's (Param.hidden)
    queued_here = Job.objects.filter(branch_id=branch_id, status=Param.hidden("queued", JobStatus.QUEUED)
                                     ).order_by("created_at", "pk")
    return Branch.objects.filter(pk=branch_id).annotate(
        _inbox=Exists(InboxEntry.objects.filter(target_branch_id=branch_id)),
        _owed=Exists(Job.objects.filter(caller_branch_id=branch_id, followup_state=FollowupState.OWED)),
        _next=Subquery(queued_here.values("pk")[:1]),
        _in_project=slot_waiters(project_id, except_branch_id=branch_id) if background else Value(None, output_field=IntegerField()),
        _webhooks=Exists(Webhook.objects.filter(project_id=project_id, active=True)),
        _cap=Subquery(Project.objects.filter(pk=project_id).values("max_running_jobs")[:1])
        if background else Value(None, output_field=IntegerField()),
    ).values_list("_inbox", "_owed", "_next", "_in_project", "_webhooks", "_cap")


_WAITING = Select("finish.waiting", _waiting)


def _wake_for_slot(project, branch_id: str, waiting: _Waiting) -> None:
    """``wake_waiting_in_project`` with the project's cap as the probe read it, not as ``project``
    holds it (read at the claim: an operator may have changed the cap while the turn ran)."""
    wake_waiting_in_project(project.pk, cap=limit_in_force("max_running_jobs", waiting.max_running_jobs),
                            ended_branch_id=branch_id, running=waiting.in_project)


DANGLING_RESULT = {
    JobStatus.CANCELLED: "cancelled: the execution was cancelled before this tool call finished",
    JobStatus.INTERRUPTED: "interrupted: the worker running this turn stopped before this tool call finished",
}


def close_dangling_calls(job: Job, branch: Branch, status: str) -> list:
    """Give every tool call of the job's last tool-call node that has no result a synthetic
    error result ("cancelled", …), at the branch's tip, so no later request to a provider
    holds a call without its result (the transcript shows it too).

    Part of the completion transaction (the branch is locked; the job writes no more).
    Idempotent: the turn loop already answers the calls it skips when it is stopped
    (``runtime.loop.write_skipped_results``); only what is still missing is written — after a
    crash, an error in the middle of a step, or a stop that came while a tool ran. Only the
    last tool-call node can lack results: a step's results are all written before the next
    model call."""
    last = (Message.objects.filter(job_id=job.pk, branch_id=branch.pk, role=MessageRole.ASSISTANT)
            .order_by("-depth", "-created_at").first())
    calls = [c for c in (last.tool_calls or []) if isinstance(c, dict)] if last is not None else []
    if not calls:
        return []
    answered = set(Message.objects.filter(job_id=job.pk, branch_id=branch.pk, role=MessageRole.TOOL,
                                          depth__gt=last.depth).values_list("tool_call_id", flat=True))
    text = DANGLING_RESULT.get(status, f"not finished: the turn ended ({status}) before this tool call finished")
    written = []
    for call in calls:
        call_id = clean_text(str(call.get("id") or ""))[:100]
        if call_id in answered:
            continue
        answered.add(call_id)
        written.append(append_message(
            branch, role=MessageRole.TOOL, text=text, tool_call_id=call_id, job=job,
            metadata={"tool": call.get("name"), "details": {}, "is_error": True, "cancelled": True, "synthetic": True},
            session_locked=True,
        ))
    return written


def close_asks(job: Job) -> int:
    """Inside the transaction that ends ``job`` some other way (a cancel while it waits): its
    pending asks close, undecided, and say so."""
    closed = list(PersonAsk.objects.filter(job_id=job.pk, status=AskStatus.PENDING).values_list("pk", flat=True))
    if closed:
        PersonAsk.objects.filter(pk__in=closed).update(status=AskStatus.CLOSED, decided_at=Now())
        for pk in closed:
            send_event_on_commit(job.session_id, "ask.closed", {"ask": pk, "job": job.pk, "status": job.status})
    return len(closed)


def wake_after_pause(job: Job) -> None:
    """Inside the transaction that moved ``job`` to ``waiting`` (``collab.services.asks``): the
    worker slot it held is free, for the jobs of its project waiting for one, and for its
    session's next job under a live-turn limit. Its branch stays taken: nothing else starts there."""
    project = job.project
    if job.run_in_background:
        waiting = _waiting_on(job.branch_id, project.pk, background=True)
        if waiting.in_project is not None:
            _wake_for_slot(project, job.branch_id, waiting)
    if effective_limit(project, "max_live_per_session"):
        enqueue_next_in_session(job.session_id)


def enqueue_next_on_branch(branch_id: str) -> None:
    """Wake the oldest queued job on the branch (queued behind the one that just ended)."""
    nxt = (
        Job.objects.filter(branch_id=branch_id, status=JobStatus.QUEUED)
        .order_by("created_at", "pk")
        .values_list("pk", flat=True)
        .first()
    )
    if nxt:
        enqueue_job(nxt)


def enqueue_next_in_session(session_id: str) -> None:
    """A live slot was freed: wake the oldest queued job of the session whose branch is idle."""
    busy = Job.objects.holding().filter(branch=OuterRef("branch"))
    nxt = (
        Job.objects.filter(session_id=session_id, status=JobStatus.QUEUED, run_in_background=True)
        .filter(~Exists(busy)).order_by("created_at", "pk").values_list("pk", flat=True).first()
    )
    if nxt:
        enqueue_job(nxt)
