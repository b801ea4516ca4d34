from django.db import transaction

from collab.errors import Invalid, NotFound
from collab.events import send_event_on_commit
from collab.models import AgentSpec, Branch, NameStage, Session
from collab.text import clean_text

MAIN_BRANCH = "main"
TITLE_CHARS = 200


def do_create_session(user, project, *, title: str = "", agent_id: str = "") -> Session:
    """A new session with its (empty) main branch. ``agent_id`` picks the default AgentSpec."""
    title = clean_text(title or "").strip()
    if len(title) > TITLE_CHARS:
        raise Invalid(f"title is longer than {TITLE_CHARS} characters", code="title_too_long")
    spec = None
    if agent_id:
        spec = AgentSpec.objects.filter(project=project, agent_id=agent_id).first()
        if spec is None:
            raise NotFound(f"no agent spec {agent_id!r} in this project", code="unknown_agent_id")
    with transaction.atomic():
        session = Session.objects.create(project=project, title=title, agent_spec=spec, created_by=user)
        branch = Branch.objects.create(
            session=session, name=MAIN_BRANCH, name_stage=NameStage.MANUAL, agent_spec=spec, created_by=user
        )
        send_event_on_commit(
            session.pk,
            "session.created",
            {"session": session.pk, "title": session.title, "agent_id": agent_id or None, "branch": branch.pk},
            actor=user,
        )
    return session
