"""``agent`` without ``to``: create a branch and run a prompt on it (docs/contract.md#agent).

One call forks (clean / inherit / exact ``SID:MSG``), names the branch, admits
a Job and stores an attach pointer next to the calling node. A background job
is enqueued. A foreground one made by a turn is admitted without being enqueued,
and the caller (the ``agent`` tool) runs it inline in the calling turn's slot
through its ``TurnContext.run_foreground`` (``collab.runtime.loop``), so a full worker pool cannot
deadlock and no service imports the runtime. A foreground one made from outside a
turn (the tool gateway, MCP) is enqueued like a background job — it runs on a
worker, within the project's running cap — and marked ``answers_call``: the call
waits for it (``collab.gateway``) and no follow-up carries its result
(docs/capacity.md, "No agent turn runs in a web process").
"""

from django.db import transaction

from collab.access import access_message, parse_address
from collab.errors import Invalid
from collab.events import deferred_event, send_events_on_commit
from collab.models import Job, JobKind, MessageKind, MessageRole, effective_spec
from collab.selectors.specs import spec_by_agent_id
from collab.services.acting import Actor, task_header
from collab.services.admission import admit_job, check_prompt
from collab.services.branches import create_branch, name_for
from collab.services.budgets import check_topology, lock_caller
from collab.services.locking import lock_sessions
from collab.services.messages import append_message
from collab.services.retry import retry_on_deadlock


def resolve_start_from(actor: Actor, start_from: str):
    """(target session, fork node or None) for ``clean`` / ``inherit`` / ``"SID:MSG"``.

    Forking another session's history needs the right to start turns there, and that session
    must be in the acting branch's project (anything else is "not found"); archived
    history may be a fork source (a fork makes a new branch, it delivers nothing). A sub-agent's
    session is read-only: nobody adds branches to it.
    """
    value = (start_from or "clean").strip()
    if value == "clean":
        return actor.session, None
    if value == "inherit":
        return actor.session, actor.calling_node
    parsed = parse_address(value)
    if parsed is None:
        raise Invalid('start_from must be "clean", "inherit" or "SID:MSG"', code="invalid_start_from")
    message = access_message(actor.user, parsed[0], parsed[1], "turn.start", project_id=actor.session.project_id)
    if message.session.parent_session_id:
        raise Invalid(
            f"session {message.session_id} belongs to a sub-agent and is read-only: fork from your own "
            "session's history, or read it with read_conversation",
            code="child_session_read_only",
        )
    return message.session, message


def pick_spec(actor: Actor, session, agent_id: str):
    if agent_id:
        return spec_by_agent_id(session.project_id, agent_id)
    return effective_spec(actor.branch, actor.session)  # forks stay in the project


def do_spawn(actor: Actor, *, prompt: str, description: str = "", agent_id: str = "", start_from: str = "clean",
             run_in_background: bool = False, archive_when_done: bool = False) -> Job:
    """Create the branch and admit its job. A background job is enqueued; a foreground one is
    returned unstarted for the calling turn to run inline (``TurnContext.run_foreground``)
    — or, with no calling turn (``actor.job`` is None: the gateway), enqueued with
    ``answers_call`` for the call to wait on."""
    check_prompt(prompt)
    actor.require("turn.start")
    return _admit_spawn(actor, prompt=prompt, description=description, agent_id=agent_id, start_from=start_from,
                        run_in_background=run_in_background, archive_when_done=archive_when_done)


@retry_on_deadlock
def _admit_spawn(actor: Actor, *, prompt, description, agent_id, start_from, run_in_background, archive_when_done) -> Job:
    answers_call = not run_in_background and actor.job is None  # no turn to run it inline: a worker does
    on_worker = run_in_background or answers_call
    messages, generations = actor.chain
    with transaction.atomic():
        session, fork_node = resolve_start_from(actor, start_from)
        lock_sessions(actor.session.pk, session.pk)  # both logs get events: sessions first (locking.py)
        spec = pick_spec(actor, session, agent_id)
        name, stage = name_for(description, prompt)
        lock_caller(actor)
        check_topology(actor, spawn=True)  # counted under the caller's lock
        events = []  # the target session's: the branch's, its prompt node's and its job's in one statement
        branch = create_branch(
            session, name=name, name_stage=stage, forked_from=fork_node, agent_spec=spec,
            created_by=actor.user, created_by_job=actor.job, near=actor.branch, session_locked=True, events=events,
        )
        calling = actor.calling_node
        job = admit_job(
            session=session, branch=branch, kind=JobKind.SPAWN, prompt=prompt, started_by=actor.user,
            agent_spec=spec, header=task_header(actor.address), enqueue=on_worker,
            sessions_locked=True, fresh_branch=True, events=events,  # both sessions locked above
            caller_session=actor.session, caller_msg=calling, caller_branch=actor.branch, caller_job=actor.job,
            parent_job=actor.job, run_in_background=on_worker, answers_call=answers_call, archive_when_done=archive_when_done,
            chain_messages=messages + 1, chain_generations=generations + 1, followup_mode=actor.followup_mode,
        )
        events = []  # the calling session's: the attach node's and agent.spawned, in one statement
        if calling is not None:
            attach = append_message(
                actor.branch, role=MessageRole.SYSTEM, kind=MessageKind.ATTACH, predecessor=calling, move_tip=False,
                text=f"spawned {name!r}", job=actor.job, events=events,
                metadata={"attach": {"session_id": session.pk, "head_id": job.prompt_msg_id, "branch": branch.pk,
                                     "execution_id": job.pk}},
            )
        else:
            attach = None
        events.append(deferred_event(
            "agent.spawned",
            {"job": job.pk, "session": session.pk, "branch": branch.pk, "name": name, "background": run_in_background,
             "attach": getattr(attach, "pk", None), "start_from": start_from or "clean"},
            actor.user,
        ))
        send_events_on_commit(actor.session.pk, events)
    return job
