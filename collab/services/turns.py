"""A person's turn on a session (SPEC §11.1 ``POST /api/sessions/{sid}/turns``)."""

from django.db import transaction

from collab.errors import Conflict, Invalid, NotFound
from collab.models import AgentSpec, Branch, Job, JobKind, Session
from collab.services.addressing import Caller, find_branch
from collab.services.admission import admit_job
from collab.services.retry import retry_on_deadlock

MAX_PROMPT_CHARS = 200_000


def check_prompt(prompt: str) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise Invalid("prompt must be a non-empty string", code="invalid_prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise Invalid(f"prompt is longer than {MAX_PROMPT_CHARS} characters", code="prompt_too_long")
    return prompt


def check_not_child(session: Session) -> None:
    """A sub-agent's session is read-only for people (OW acc. 21): its parent directs it."""
    if session.parent_session_id:
        raise Conflict(
            "this is a sub-agent's session: it is read-only; its parent agent directs it with followup_task",
            code="child_session_read_only",
        )


def selected_branch(session: Session) -> Branch:
    """The branch a person's turn goes to by default: the selected HEAD's, else the first one."""
    if session.head_id:
        return Branch.objects.get(pk=session.head.branch_id)
    branch = session.branches.order_by("created_at").first()
    if branch is None:  # sessions are created with a main branch; be robust to old rows
        branch = Branch.objects.create(session=session, name="main", name_stage=3)
    return branch


@retry_on_deadlock
def do_start_user_turn(user, session: Session, prompt: str, *, branch: str | None = None, agent_id: str | None = None) -> Job:
    """Admit a user turn. Preconditions: ``session`` came from ``access_session(…, "turn.start")``."""
    check_prompt(prompt)
    check_not_child(session)
    spec = None
    if agent_id:
        spec = AgentSpec.objects.filter(project_id=session.project_id, agent_id=agent_id).first()
        if spec is None:
            raise NotFound(f"no agent spec {agent_id!r} in this project", code="unknown_agent_id")
    with transaction.atomic():
        if branch:
            target = find_branch(Caller(user=user, session_id=session.pk), branch)
            if target.session_id != session.pk:
                raise NotFound(f"no branch {branch!r} in this session")
        else:
            target = selected_branch(session)
        return admit_job(session=session, branch=target, kind=JobKind.USER, prompt=prompt, started_by=user, agent_spec=spec)


@retry_on_deadlock
def do_fork_and_start(user, session: Session, message, prompt: str) -> Job:
    """A person forks at any visible node and runs a prompt there (OP §2.4: the fork gets a
    stage-1 label like an agent's). The session's selected HEAD stays where it is: what the
    person reads next is theirs to choose (the page shows them their fork), and nobody else who
    opens the session is moved to it (issue 13 item 2).
    Preconditions: ``message`` came from ``access_message(…, "turn.start")``."""
    from collab.services.branches import create_branch, name_for

    check_prompt(prompt)
    check_not_child(session)
    with transaction.atomic():
        name, stage = name_for("", prompt)
        branch = create_branch(
            session, name=name, name_stage=stage, forked_from=message,
            agent_spec=message.branch.agent_spec or session.agent_spec, created_by=user,
        )
        return admit_job(session=session, branch=branch, kind=JobKind.USER, prompt=prompt, started_by=user)
