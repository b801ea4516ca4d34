import json

from django.db import transaction
from django.db.models import Q

from collab.errors import Conflict, Invalid, NotFound
from collab.events import record_project_event, send_event_on_commit
from collab.models import Branch, Job, NameStage, Session
from collab.services.locking import lock_session
from collab.services.retry import retry_on_deadlock
from collab.selectors.specs import spec_by_agent_id
from collab.text import clean_text

MAIN_BRANCH = "main"
TITLE_CHARS = 200


def do_create_session(user, project, *, title: str = "", agent_id: str = "", metadata: dict | None = None) -> Session:
    """A new session with its (empty) main branch. ``agent_id`` picks the default AgentSpec;
    ``metadata`` is a client's own (``check_metadata``)."""
    title = clean_text(title or "").strip()
    metadata = check_metadata(metadata) if metadata is not None else {}
    if len(title) > TITLE_CHARS:
        raise Invalid(f"title is longer than {TITLE_CHARS} characters", code="title_too_long")
    spec = None
    if agent_id:
        spec = spec_by_agent_id(project.pk, agent_id)
    with transaction.atomic():
        session = Session.objects.create(project=project, title=title, agent_spec=spec, created_by=user,
                                         metadata=metadata)
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


# --- a client's metadata, and deleting a session (the LangGraph-compatible API: docs/langgraph.md#threads)

MAX_METADATA_CHARS = 16_000  # a session's metadata as JSON
MAX_METADATA_KEY_CHARS = 200


def check_metadata(metadata) -> dict:
    """A client's metadata: a JSON object of at most ``MAX_METADATA_CHARS`` (as JSON), with keys
    of 1 to ``MAX_METADATA_KEY_CHARS`` characters; anything else is a 400 ``invalid_metadata``."""
    if not isinstance(metadata, dict):
        raise Invalid("metadata must be a JSON object", code="invalid_metadata")
    for key in metadata:
        if not isinstance(key, str) or not key or len(key) > MAX_METADATA_KEY_CHARS:
            raise Invalid(f"metadata keys are 1 to {MAX_METADATA_KEY_CHARS} characters", code="invalid_metadata")
    if len(json.dumps(metadata, ensure_ascii=False)) > MAX_METADATA_CHARS:
        raise Invalid(f"metadata is larger than {MAX_METADATA_CHARS} characters as JSON", code="invalid_metadata")
    return metadata


@retry_on_deadlock
def do_update_session_metadata(user, session: Session, changes: dict) -> Session:
    """Merge ``changes`` into the session's metadata (a key set to null keeps it, as null), under
    the session's lock; the merged object is checked as a whole. A change is the session event
    ``session.metadata_changed`` naming the keys. Preconditions: ``session`` came from
    ``access_session(…, "turn.start")``."""
    check_metadata(changes)
    with transaction.atomic():
        locked = lock_session(session.pk)
        merged = {**(locked.metadata or {}), **changes}
        changed = sorted(k for k in changes if k not in (locked.metadata or {}) or locked.metadata[k] != changes[k])
        if changed:
            check_metadata(merged)
            Session.objects.filter(pk=locked.pk).update(metadata=merged)
            locked.metadata = merged
            send_event_on_commit(locked.pk, "session.metadata_changed", {"session": locked.pk, "keys": changed},
                                 actor=user)
    return locked


@retry_on_deadlock
def do_delete_session(user, session: Session) -> None:
    """Delete a root session with everything in it — its sub-agents' sessions, messages, jobs,
    events — and the executions it delegated to other sessions (their rows name it as their
    caller). Refused while any of those executions is open (queued, running, stopping or waiting
    for a person): 409 ``session_busy``; cancel them first. Audited in the project's log
    (``session.deleted``). Preconditions: ``access.require_can_delete_session``."""
    if session.parent_session_id:
        raise Conflict("this is a sub-agent's session: delete its root session", code="child_session_read_only")
    with transaction.atomic():
        # FOR UPDATE, not the usual NO KEY UPDATE: nothing may be written pointing at these rows
        # between the check below and the delete
        locked = Session.objects.select_for_update().filter(pk=session.pk).first()
        if locked is None:
            raise NotFound()
        children = list(Session.objects.select_for_update().filter(parent_session_id=locked.pk)
                        .order_by("pk").values_list("pk", flat=True))
        ids = [locked.pk, *children]
        open_job = (Job.objects.open().filter(Q(session_id__in=ids) | Q(caller_session_id__in=ids))
                    .order_by("created_at", "pk").first())
        if open_job is not None:
            raise Conflict(f"the session is busy: execution {open_job.pk} is {open_job.status}; cancel it first",
                           code="session_busy", execution_id=open_job.pk)
        record_project_event(locked.project_id, "session.deleted", {"session": locked.pk, "title": locked.title},
                             actor=user)
        locked.delete()
