"""A person's turn on a session (``POST /api/sessions/{sid}/turns``, docs/contract.md#http-api).

Double-texting (after LangGraph Agent Server's ``multitask_strategy``): a turn
posted while its branch is busy — it has a running or stopping job (``collab.models.is_busy``, the one
definition the branch rows' ``busy`` flag uses) — follows a strategy chosen per request,
else the branch's agent spec's default (``AgentSpec.limits["multitask_strategy"]``), else
``enqueue``:

- ``enqueue``: queued behind what the branch has open (the behaviour before strategies);
- ``reject``: refused, 409 ``branch_busy``; checked with the branch row locked;
- ``interrupt``: the running turn is cancelled through the cancel command (an
  ``ExecutionCommand`` is recorded; the caller needs the right to cancel it) and
  the new input is queued on the same branch; it starts once the cancelled turn has ended,
  and that turn's completion gives every tool call it left unanswered a "cancelled"
  result first (``services.execution.close_dangling_calls``), so the new turn's history
  never holds a call without its result;
- ``rollback``: non-destructive — the running turn is cancelled the same way, a new branch
  is forked from the node just before that turn's prompt, the new input runs there, the old
  branch is archived with reason "rolled back" (the caller needs the right to archive it)
  and the person's selection moves to the fork.

Inputs already queued on the branch keep their place under every strategy (nothing a
person or an agent sent is dropped); a strategy only acts on the running turn. On an idle
branch every strategy admits the turn like ``enqueue``.
"""

import uuid

from django.db import transaction
from django.db.models import Subquery

from collab.access import Caller, access_branch, require_can_archive
from collab.errors import Conflict, Invalid, NotFound
from collab.models import (
    STRATEGIES,
    TERMINAL_STATUSES,
    Branch,
    Job,
    JobKind,
    JobStatus,
    Message,
    Session,
    effective_spec,
)
from collab.selectors.specs import spec_by_agent_id
from collab.services.admission import admit_job, check_prompt
from collab.services.archive import do_archive_branch
from collab.services.branches import create_branch, name_for
from collab.services.cancel import CANCEL, do_execution_command
from collab.services.locking import lock_branch, lock_sessions
from collab.services.retry import retry_on_deadlock
from collab.infra.prepared import Param, Select

ENQUEUE, REJECT, INTERRUPT, ROLLBACK = STRATEGIES
ROLLED_BACK = "rolled back"
INTERRUPT_ATTEMPTS = 5

MAX_BRANCH_NAME_CHARS = 100  # Branch.name


def check_not_child(session: Session) -> None:
    """A sub-agent's session is read-only for people: its parent directs it."""
    if session.parent_session_id:
        raise Conflict(
            "this is a sub-agent's session: it is read-only; its parent agent directs it with followup_task",
            code="child_session_read_only",
        )


# every person's turn without a ``branch`` asks one of these (compiled once per process: collab.infra.prepared)
_HEAD_BRANCH = Select("head_branch", lambda: Branch.objects.filter(
    pk=Subquery(Message.objects.filter(pk=Param("head")).values("branch_id")))[:1])
_FIRST_BRANCH = Select("first_branch", lambda: Branch.objects.filter(session_id=Param("session"))
                       .order_by("created_at")[:1])


def selected_branch(session: Session) -> Branch:
    """The branch a person's turn goes to by default: the selected HEAD's, else the first one."""
    if session.head_id:  # one query: the branch of the head node
        return _HEAD_BRANCH.get(head=session.head_id)
    branch = _FIRST_BRANCH.first(session=session.pk)  # a new session's first turn
    if branch is None:  # sessions are created with a main branch; be robust to old rows
        branch = Branch.objects.create(session=session, name="main", name_stage=3)
    return branch


def check_strategy(value) -> str | None:
    """A ``multitask_strategy`` as given (None when absent); anything else is a 400 with the choices."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or value not in STRATEGIES:
        raise Invalid(f"multitask_strategy must be one of {', '.join(STRATEGIES)}; got {value!r}",
                      code="invalid_multitask_strategy")
    return value


def spec_strategy(spec) -> str:
    """The agent spec's default strategy (``limits.multitask_strategy``), else ``enqueue``.
    Saved specs are validated (services/specs.py); an unknown stored value counts as absent."""
    limits = getattr(spec, "limits", None) or {}
    value = limits.get("multitask_strategy") if isinstance(limits, dict) else None
    return value if value in STRATEGIES else ENQUEUE


def running_job(branch: Branch) -> Job | None:
    """The branch's running or stopping job — what makes it busy (``collab.models.is_busy``)."""
    return Job.objects.running().filter(branch_id=branch.pk).order_by("created_at", "pk").first()


def do_start_user_turn(user, session: Session, prompt: str, *, branch: str | None = None, agent_id: str | None = None,
                       multitask_strategy: str | None = None) -> Job:
    """Admit a user turn, by the double-texting strategy (module doc) when the branch is busy.
    Preconditions: ``session`` came from ``access_session(…, "turn.start")``."""
    check_prompt(prompt)
    check_not_child(session)
    strategy = check_strategy(multitask_strategy)
    spec = None
    if agent_id:
        spec = spec_by_agent_id(session.project_id, agent_id)
    target = target_branch(user, session, branch)
    if strategy is None:
        strategy = spec_strategy(spec or effective_spec(target, session))
    if strategy in (INTERRUPT, ROLLBACK):
        current = running_job(target)
        if current is not None:
            if strategy == ROLLBACK:
                require_can_archive(user, target)  # before anything is cancelled
            interrupt_job(user, current)
            if strategy == ROLLBACK:
                return rollback_and_start(user, session, target, current, prompt, spec)
    return admit_user_turn(user, session, target, prompt, spec, reject_if_busy=strategy == REJECT)


def target_branch(user, session: Session, branch: str | None) -> Branch:
    if branch:
        target = access_branch(user, branch, caller=Caller(user=user, session_id=session.pk))
        if target.session_id != session.pk:
            raise NotFound(f"no branch {branch!r} in this session")
        return target
    return selected_branch(session)


@retry_on_deadlock
def admit_user_turn(user, session: Session, target: Branch, prompt: str, spec, *, reject_if_busy: bool = False) -> Job:
    with transaction.atomic():
        if reject_if_busy:
            lock_sessions(session.pk)
            lock_branch(target.pk)  # what is running is read with the branch locked: admissions serialize here
            current = running_job(target)
            if current is not None:
                raise Conflict(
                    f"the branch is busy: execution {current.pk} is {current.status} "
                    "(multitask_strategy=reject); send again when it has ended, or choose enqueue, interrupt or rollback",
                    code="branch_busy", execution_id=current.pk,
                )
        return admit_job(session=session, branch=target, kind=JobKind.USER, prompt=prompt, started_by=user, agent_spec=spec)


def interrupt_job(user, job: Job) -> None:
    """Cancel ``job`` through the cancel command (versioned, audited, cascading: docs/contract.md#cancel), with
    the caller's own right to cancel it. A job that ended meanwhile is left alone; a version
    that moved between the read and the command's lock is read again."""
    for _ in range(INTERRUPT_ATTEMPTS):
        current = Job.objects.filter(pk=job.pk).first()
        if current is None or current.status in TERMINAL_STATUSES:
            return
        try:
            do_execution_command(user, current, command_id=f"double-text-{uuid.uuid4().hex}", action=CANCEL,
                                 expected_version=current.version, payload={})
            return
        except Conflict as exc:
            if exc.code != "stale_version":
                raise
    raise Conflict(f"execution {job.pk} kept changing state; its interrupt was not sent", code="branch_busy")


@retry_on_deadlock
def rollback_and_start(user, session: Session, old: Branch, rolled: Job, prompt: str, spec) -> Job:
    """Fork a branch at the node before ``rolled``'s prompt, start ``prompt`` there, archive
    ``old`` (reason "rolled back") and move the person's selection to the fork: one transaction,
    locks session → old branch → the fork (new, so nobody else holds it)."""
    with transaction.atomic():
        lock_sessions(session.pk)
        locked = lock_branch(old.pk)
        if locked.archived:
            raise Invalid(f"agent {locked.display_name} is archived; fork it with start_from to continue", code="archived")
        rolled = Job.objects.select_related("prompt_msg__predecessor").get(pk=rolled.pk)
        fork_at = rolled.prompt_msg.predecessor if rolled.prompt_msg_id else locked.tip
        name, stage = name_for("", prompt)
        fork = create_branch(session, name=name, name_stage=stage, forked_from=fork_at,
                             agent_spec=effective_spec(locked, session), created_by=user)
        job = admit_job(session=session, branch=fork, kind=JobKind.USER, prompt=prompt, started_by=user, agent_spec=spec)
        do_archive_branch(locked, user=user, reason=ROLLED_BACK)
        Session.objects.filter(pk=session.pk).update(head=job.prompt_msg)
    return job


def fork_and_follow(user, session: Session, message, prompt: str, *, spec, strategy: str) -> Job:
    """A run that leaves the thread's branch for a fork the thread then follows (a LangGraph run
    from an earlier checkpoint, or a message asked again: docs/langgraph.md#runs). What is open
    on the branch it leaves is dealt with by ``strategy`` as a new input there would be:
    ``interrupt`` and ``rollback`` cancel its running or waiting run first (the fork already
    leaves that line: nothing more is rolled back); otherwise a run waiting for a person holds the
    thread (409 ``thread_interrupted``: decide it first), and ``reject`` is refused while one runs
    (409 ``branch_busy``); with ``enqueue`` a running run goes on on its own branch while the fork
    starts at once. Preconditions: as ``do_fork_and_start``'s."""
    if strategy in (INTERRUPT, ROLLBACK):
        left = selected_branch(session)
        for job in Job.objects.filter(branch_id=left.pk, status__in=(JobStatus.RUNNING, JobStatus.WAITING)) \
                .order_by("created_at", "pk"):
            interrupt_job(user, job)
        return do_fork_and_start(user, session, message, prompt, agent_spec=spec, select=True)
    return _fork_when_free(user, session, message, prompt, spec, reject_if_busy=strategy == REJECT)


@retry_on_deadlock
def _fork_when_free(user, session: Session, message, prompt: str, spec, *, reject_if_busy: bool) -> Job:
    with transaction.atomic():
        lock_sessions(session.pk)
        left = selected_branch(Session.objects.get(pk=session.pk))  # the head as it is now, under its lock
        lock_branch(left.pk)
        waiting = Job.objects.filter(branch_id=left.pk, status=JobStatus.WAITING).order_by("created_at", "pk").first()
        if waiting is not None:
            raise Conflict(f"the thread waits for a person (run {waiting.pk}): decide what it asks first "
                           "(command.resume), or send with multitask_strategy interrupt or rollback to cancel it",
                           code="thread_interrupted", run_id=waiting.pk)
        current = running_job(left) if reject_if_busy else None
        if current is not None:
            raise Conflict(f"the thread is busy: run {current.pk} is {current.status} (multitask_strategy=reject); "
                           "send again when it has ended, or choose enqueue, interrupt or rollback",
                           code="branch_busy", execution_id=current.pk)
        return do_fork_and_start(user, session, message, prompt, agent_spec=spec, select=True)


@retry_on_deadlock
def do_fork_and_start(user, session: Session, message, prompt: str, *, name: str = "", agent_spec=None,
                      select: bool = False) -> Job:
    """A person forks at any visible node and runs a prompt there. A ``name`` they give is kept
    (never renamed); without one the fork gets a stage-1 label like an agent's.
    The session's selected HEAD stays where it is: what the person reads next is theirs to
    choose (the page shows them their fork), and nobody else who opens the session is moved to it
    — unless ``select``: a LangGraph run from a checkpoint (docs/langgraph.md#runs) makes the fork
    the thread's latest state, as LangGraph does. ``agent_spec``: the spec this turn runs with
    (default: the forked branch's). ``message`` None: a new root (the prompt asked again of the
    session's first message; its spec is the session's). Preconditions: ``message`` came from
    ``access_message(…, "turn.start")``, or the session from ``access_session(…, "turn.start")``."""
    check_prompt(prompt)
    check_not_child(session)
    if len((name or "").strip()) > MAX_BRANCH_NAME_CHARS:
        raise Invalid(f"a branch name is at most {MAX_BRANCH_NAME_CHARS} characters", code="invalid_name")
    with transaction.atomic():
        name, stage = name_for(name, prompt)
        branch = create_branch(
            session, name=name, name_stage=stage, forked_from=message,
            agent_spec=effective_spec(message.branch, session) if message is not None else session.agent_spec,
            created_by=user,
        )
        job = admit_job(session=session, branch=branch, kind=JobKind.USER, prompt=prompt, started_by=user,
                        agent_spec=agent_spec)
        if select:
            Session.objects.filter(pk=session.pk).update(head=job.prompt_msg)
        return job
