"""OpenWork sub-agents (docs/contract.md#the-openwork-toolset): children as child sessions of a root session.

A child is a Session with ``parent_session`` (the root) and ``agent_role``
(``explorer``) whose one branch carries the ``task_name`` and the parent
branch that spawned it. Creating it — session, branch and its first Job — is
one transaction: a refused or failed spawn writes nothing, so the name and the
slot are released by the rollback. The concurrency limit
(``Project.max_active_turns``) counts the open child jobs of one root session,
checked with the root session row locked so two spawns cannot both take the
last slot; under the same lock a task_name is checked unique in the
whole root session, the child sessions' ``task_name`` index backing it
up. Results travel back through the ordinary follow-up debt
(``Job.followup_state``) in mode ``mailbox``: drained into the parent's running
turn, or held for its next user turn; never a new parent turn.
"""

import re
import uuid

from django.db import IntegrityError, transaction

from accounts.limits import effective_limit
from collab.errors import Conflict, DomainError
from collab.events import send_event_on_commit
from collab.models import AgentRole, Branch, Job, JobKind, NameStage, Session, effective_spec, is_occupied
from collab.selectors.children import children_of
from collab.selectors.jobs import sessions_owing_results
from collab.services.acting import Actor
from collab.services.admission import admit_job, check_prompt
from collab.services.branches import create_branch
from collab.services.cancel import CANCEL, do_execution_command
from collab.services.followup import results_owed
from collab.services.locking import lock_sessions
from collab.services.retry import retry_on_deadlock
from collab.realtime.bounds import AGENT_WAIT_MAX_MS, AGENT_WAIT_MIN_MS
from collab.realtime.changes import wait_for_change

TASK_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")  # always fullmatch: "$" alone would accept a trailing newline
MAILBOX = "mailbox"



def ow_error(code: str, message: str) -> DomainError:
    return DomainError(message, code=code)


def check_task_name(task_name: str) -> None:
    if not isinstance(task_name, str) or not TASK_NAME.fullmatch(task_name):
        raise ow_error(
            "invalid_task_name",
            f"{task_name!r} is not a valid task_name: use lowercase letters, digits and underscores, "
            "starting with a letter, at most 48 characters (^[a-z][a-z0-9_]{0,47}$)",
        )


def root_of(session: Session) -> Session:
    return session.parent_session if session.parent_session_id else session


def find_child(actor: Actor, task_name: str) -> Branch:
    child = children_of(actor.branch).select_related("session").filter(task_name=task_name).first()
    if child is None:
        raise ow_error("unknown_agent", f"no sub-agent named {task_name!r}; list_agents shows yours")
    return child


def active_child_turns(root: Session) -> int:
    return Job.objects.open().filter(session__parent_session=root).count()


def _lock_root(actor: Actor) -> Session:
    """Lock the root session row: spawns, follow-ups and names of one root are decided one at a time."""
    root_id = actor.session.parent_session_id or actor.session.pk
    return lock_sessions(root_id, actor.session.pk)[root_id]  # the row alone; its project loads after


def task_name_taken(root: Session, task_name: str) -> bool:
    """Whether a child of ``root`` (from any of its branches) already has this name."""
    return Session.objects.filter(parent_session=root, task_name=task_name).exists() or Branch.objects.filter(
        session__parent_session=root, task_name=task_name).exists()


def _take_slot(root: Session) -> None:
    """Check a child turn slot of the (locked) root session is free."""
    limit = effective_limit(root.project, "max_active_turns")
    if active_child_turns(root) >= limit:
        raise ow_error(
            "agent_limit_reached",
            f"{limit} sub-agent turns are already running (max_active_turns); wait_agent for one to finish "
            "or do the work yourself",
        )


def _child_job_fields(actor: Actor) -> dict:
    messages, generations = actor.chain
    return dict(
        caller_session=actor.session, caller_msg=actor.calling_node, caller_branch=actor.branch,
        caller_job=actor.job, parent_job=actor.job, run_in_background=True, followup_mode=MAILBOX,
        chain_messages=messages, chain_generations=generations,
    )


@retry_on_deadlock
def do_spawn_child(actor: Actor, *, task_name: str, message: str) -> Job:
    """``spawn_agent``: a new explorer child with its first turn; returns that turn's Job."""
    actor.require("turn.start")
    check_task_name(task_name)
    check_prompt(message)
    if actor.session.parent_session_id:
        raise ow_error("agent_start_failed", "a sub-agent cannot start sub-agents (one level only)")
    spec = effective_spec(actor.branch, actor.session)
    try:
        with transaction.atomic():
            root = _lock_root(actor)
            if task_name_taken(root, task_name):  # the name is checked before the slot
                raise ow_error("duplicate_task_name", f"a sub-agent named {task_name!r} already exists in this session")
            _take_slot(root)
            child_session = Session.objects.create(
                project_id=actor.session.project_id, title=task_name, agent_spec=spec, created_by=actor.user,
                parent_session=actor.session, agent_role=AgentRole.EXPLORER, task_name=task_name,
            )
            branch = create_branch(
                child_session, name=task_name, name_stage=NameStage.MANUAL, agent_spec=spec, created_by=actor.user,
                created_by_job=actor.job, parent_branch=actor.branch, task_name=task_name,
            )
            job = admit_job(session=child_session, branch=branch, kind=JobKind.SPAWN, prompt=message,
                            started_by=actor.user, agent_spec=spec, **_child_job_fields(actor))
            send_event_on_commit(
                actor.session.pk, "agent.spawned",
                {"job": job.pk, "session": child_session.pk, "branch": branch.pk, "name": task_name,
                 "task_name": task_name, "background": True, "toolset": "openwork"},
                actor=actor.user,
            )
    except IntegrityError as exc:  # the database's own refusals (the unique name index, the CHECKs)
        if task_name_taken(root_of(actor.session), task_name):
            raise ow_error("duplicate_task_name", f"a sub-agent named {task_name!r} already exists in this session") from None
        raise ow_error("agent_start_failed", f"could not start {task_name!r}: {exc}") from None
    except DomainError as exc:
        if exc.code in ("agent_limit_reached", "duplicate_task_name"):
            raise
        raise ow_error("agent_start_failed", f"could not start {task_name!r}: {exc.detail}") from None
    return job


@retry_on_deadlock
def do_followup_child(actor: Actor, *, task_name: str, message: str) -> Job:
    """``followup_task``: a new turn on an idle child, sharing the concurrency limit. A running
    child answers ``agent_turn_start_failed`` before a full limit answers ``agent_limit_reached``
    (its own turn holds one of those slots)."""
    actor.require("turn.start")
    child = find_child(actor, task_name)
    check_prompt(message)
    try:
        with transaction.atomic():
            root = _lock_root(actor)
            if is_occupied(child):
                raise ow_error("agent_turn_start_failed", f"{task_name!r} is still running; wait_agent for its result first")
            _take_slot(root)
            job = admit_job(session=child.session, branch=child, kind=JobKind.TASK, prompt=message,
                            started_by=actor.user, **_child_job_fields(actor))
    except DomainError as exc:
        if exc.code in ("agent_limit_reached", "agent_turn_start_failed"):
            raise
        raise ow_error("agent_turn_start_failed", f"could not start a turn on {task_name!r}: {exc.detail}") from None
    return job


def do_interrupt_child(actor: Actor, *, task_name: str) -> Job:
    """``interrupt_agent``: cancel the child's open turn with a versioned ``execution.cancel``
    command (docs/contract.md#cancel), recorded as an ExecutionCommand like one from the UI or the API. A
    version that moved meanwhile (the turn was claimed) is read again; a turn that ended
    meanwhile answers ``agent_interrupt_failed``."""
    child = find_child(actor, task_name)
    command_id = f"interrupt_agent:{uuid.uuid4().hex}"
    for _ in range(3):
        job = Job.objects.open().filter(branch=child).order_by("-created_at").first()
        if job is None:
            raise ow_error("agent_interrupt_failed", f"{task_name!r} has no running turn to interrupt")
        try:
            do_execution_command(actor.user, job, command_id=command_id, action=CANCEL,
                                 expected_version=job.version, payload={})
        except Conflict:
            continue
        except DomainError as exc:
            raise ow_error("agent_interrupt_failed", exc.detail) from None
        with transaction.atomic():
            send_event_on_commit(actor.session.pk, "agent.interrupted",
                                 {"job": job.pk, "task_name": task_name, "command_id": command_id}, actor=actor.user)
        return job
    raise ow_error("agent_interrupt_failed", f"{task_name!r} kept changing state; try again")


def wait_for_mail(actor: Actor, timeout_ms: int) -> bool:
    """Block until a result is owed to the acting branch (True) or the timeout passes (False).
    A running turn checks its stop flag while waiting, so a cancel ends the wait at once."""
    if not AGENT_WAIT_MIN_MS <= timeout_ms <= AGENT_WAIT_MAX_MS:
        raise ow_error("invalid_arguments", f"timeout_ms must be between {AGENT_WAIT_MIN_MS} and {AGENT_WAIT_MAX_MS}")
    stop = (lambda: actor.turn.check_stop(force=True)) if actor.turn is not None else None
    sessions = [actor.session.pk, *sessions_owing_results(actor.branch)]
    return bool(wait_for_change(lambda: results_owed(actor.branch), timeout_ms / 1000, sessions=sessions, stop=stop))
