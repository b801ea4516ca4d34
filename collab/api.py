"""REST routes (SPEC §11.1). Each: authorize through ``collab.access``, call one service or selector."""

from django.http import HttpRequest
from ninja import Router, Status

from accounts.models import Membership
from accounts.policy import visible_projects
from accounts.services import SlugTaken, create_project
from collab import access
from collab.errors import Conflict
from collab.schemas import (
    AgentSpecIn,
    AgentSpecOut,
    ErrorOut,
    EventsOut,
    ExecutionOut,
    ProjectIn,
    ProjectOut,
    SessionIn,
    SessionOut,
    TurnIn,
    TurnOut,
)
from collab.selectors.events import PAGE, events_after
from collab.selectors.shapes import execution_shape, session_shape
from collab.services.sessions import do_create_session
from collab.services.specs import do_create_agent_spec
from collab.services.turns import do_start_user_turn

router = Router()
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


def _project_out(project, role=None) -> dict:
    return {"slug": project.slug, "name": project.name, "role": role, "created_at": project.created_at}


@router.get("projects", response=list[ProjectOut], tags=["projects"])
def list_projects(request: HttpRequest):
    roles = dict(Membership.objects.filter(user=request.auth).values_list("project_id", "role"))
    return [_project_out(p, roles.get(p.pk)) for p in visible_projects(request.auth)]


@router.post("projects", response={201: ProjectOut, **ERRORS}, tags=["projects"])
def post_project(request: HttpRequest, payload: ProjectIn):
    try:
        project = create_project(request.auth, slug=payload.slug, name=payload.name)
    except SlugTaken:
        raise Conflict(f"a project with slug {payload.slug!r} already exists", code="slug_taken") from None
    return Status(201, _project_out(project, "owner"))


@router.post("projects/{slug}/agent-specs", response={201: AgentSpecOut, **ERRORS}, tags=["projects"])
def post_agent_spec(request: HttpRequest, slug: str, payload: AgentSpecIn):
    project = access.access_project(request.auth, slug, "project.visibility")
    return Status(201, do_create_agent_spec(project, **payload.model_dump()))


@router.post("projects/{slug}/sessions", response={201: SessionOut, **ERRORS}, tags=["sessions"])
def post_session(request: HttpRequest, slug: str, payload: SessionIn):
    project = access.access_project(request.auth, slug, "turn.start")
    session = do_create_session(request.auth, project, title=payload.title, agent_id=payload.agent_id)
    return Status(201, session_shape(session))


@router.get("sessions/{sid}", response={200: SessionOut, **ERRORS}, tags=["sessions"])
def get_session(request: HttpRequest, sid: str):
    return session_shape(access.access_session(request.auth, sid))


@router.post("sessions/{sid}/turns", response={202: TurnOut, **ERRORS}, tags=["sessions"])
def post_turn(request: HttpRequest, sid: str, payload: TurnIn):
    session = access.access_session(request.auth, sid, "turn.start")
    job = do_start_user_turn(request.auth, session, payload.prompt, branch=payload.branch, agent_id=payload.agent_id)
    return Status(202, {"execution_id": job.pk, "status": job.status, "version": job.version})


@router.get("executions/{execution_id}", response={200: ExecutionOut, **ERRORS}, tags=["executions"])
def get_execution(request: HttpRequest, execution_id: str):
    return execution_shape(access.access_job(request.auth, execution_id))


@router.get("sessions/{sid}/events", response={200: EventsOut, **ERRORS}, tags=["events"])
def get_events(request: HttpRequest, sid: str, after: int = 0, limit: int = PAGE):
    session = access.access_session(request.auth, sid)
    limit = max(1, min(limit, PAGE))
    return {"events": [e.as_wire() for e in events_after(session.pk, max(after, 0), limit)]}
