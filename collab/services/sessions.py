from django.db import transaction

from collab.errors import Invalid
from collab.events import send_event_on_commit
from collab.models import Branch, NameStage, Session
from collab.selectors.specs import spec_by_agent_id
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
        spec = spec_by_agent_id(project.pk, agent_id)
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
