from django.db import transaction

from collab.errors import NotFound
from collab.events import send_event_on_commit
from collab.models import AgentSpec, Branch, NameStage, Session

MAIN_BRANCH = "main"


def do_create_session(user, project, *, title: str = "", agent_id: str = "") -> Session:
    """A new session with its (empty) main branch. ``agent_id`` picks the default AgentSpec."""
    spec = None
    if agent_id:
        spec = AgentSpec.objects.filter(project=project, agent_id=agent_id).first()
        if spec is None:
            raise NotFound(f"no agent spec {agent_id!r} in this project", code="unknown_agent_id")
    with transaction.atomic():
        session = Session.objects.create(project=project, title=title.strip(), agent_spec=spec, created_by=user)
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
