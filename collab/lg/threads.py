"""LangGraph-compatible threads routes (docs/langgraph.md#threads, #state-and-checkpoints): a
thread is a Trellis session; its state is the line of messages ending at its latest
checkpoint, a checkpoint any message of its DAG. Every route authorizes through
``collab.access`` (a thread the caller may not see is the 404 of a missing one) and writes
through Trellis's services."""

from typing import Any, Literal

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router, Status
from pydantic import Field

from accounts.models import TokenScope
from accounts.policy import project_ids_with
from collab import access
from collab.errors import Conflict, Invalid, NotFound
from collab.lg.values import (
    DERIVED_METADATA,
    MAX_HISTORY,
    Unsupported,
    assistant_of,
    checkpoint_id_in,
    history_shape,
    metadata_filter,
    paginate,
    selected,
    state_shape,
    status_filter,
    thread_metadata,
    thread_of,
    thread_shape,
    thread_shapes,
    with_thread_status,
)
from collab.schemas import StrictIn
from collab.scopes import token_scope
from collab.selectors.specs import spec_by_agent_id
from collab.services.sessions import do_create_session, do_delete_session, do_update_session_metadata
from accounts.models import Project

router = Router(tags=["threads"])

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
THREAD_FIELDS = ("thread_id", "created_at", "updated_at", "metadata", "status", "values", "interrupts")
STATE_FIELDS = ("values", "next", "checkpoint", "metadata", "created_at", "parent_checkpoint", "tasks", "interrupts")
MAX_LIMIT = 1000
MAX_IDS = 1000
# ``?select=values&select=next``: the fields of a state to answer (langgraph_sdk sends a list)
SELECT_QUERY = Query(None, description="the state's fields to answer (values.KEY: one key of values)")


class ThreadCreateIn(StrictIn):
    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None
    graph_id: str | None = None
    supersteps: list[Any] | None = None
    ttl: Any = None


class ThreadPatchIn(StrictIn):
    metadata: dict[str, Any] | None = None
    ttl: Any = None


class ThreadSearchIn(StrictIn):
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    ids: list[str] | None = Field(None, max_length=MAX_IDS)
    status: ThreadStatus | None = None
    limit: int = Field(10, ge=1, le=MAX_LIMIT)
    offset: int = Field(0, ge=0)
    sort_by: Literal["thread_id", "status", "created_at", "updated_at"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[Literal[THREAD_FIELDS]] | None = None  # type: ignore[valid-type]
    extract: dict[str, Any] | None = None


class ThreadCountIn(StrictIn):
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: ThreadStatus | None = None


class CheckpointIn(StrictIn):
    thread_id: str | None = None
    checkpoint_ns: str = ""
    checkpoint_id: str | None = None
    checkpoint_map: dict[str, Any] | None = None


class StateCheckpointIn(StrictIn):
    checkpoint: CheckpointIn
    subgraphs: bool = False
    select: list[str] | None = None


class HistoryIn(StrictIn):
    limit: int = Field(10, ge=1, le=MAX_HISTORY)
    before: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: CheckpointIn | None = None
    select: list[str] | None = None


def _project_for(viewer, slug) -> Project:
    """The project a new thread goes to: ``metadata.project`` (a slug), else the caller's only
    project where they may start turns."""
    if slug is not None:
        if not isinstance(slug, str):
            raise Invalid("metadata.project must be a project's slug", code="invalid_metadata")
        return access.access_project(viewer, slug, "turn.start")
    projects = list(Project.objects.filter(pk__in=project_ids_with(viewer, "turn.start"))[:2])
    if len(projects) != 1:
        raise Invalid("metadata.project must name the thread's project (its slug)"
                      + ("" if not projects else ": you may start threads in several"), code="project_required")
    return projects[0]


def _pick_spec(viewer, project, metadata: dict, graph_id):
    """The agent spec a new thread names (``metadata.assistant_id`` or ``graph_id``), if any."""
    assistant_id = metadata.get("assistant_id")
    graph_id = metadata.get("graph_id", graph_id)
    spec = None
    if assistant_id is not None:
        spec = assistant_of(viewer, assistant_id if isinstance(assistant_id, str) else "", project_id=project.pk)
    if graph_id is not None:
        if not isinstance(graph_id, str) or not graph_id:
            raise Invalid("graph_id must be an agent spec's agent_id", code="invalid_metadata")
        if spec is None:
            spec = spec_by_agent_id(project.pk, graph_id)
        elif spec.agent_id != graph_id:
            raise Invalid(f"assistant {assistant_id} is graph {spec.agent_id!r}, not {graph_id!r}",
                          code="invalid_metadata")
    return spec


def _threads(viewer, metadata, values, status, ids=None):
    """The root sessions ``viewer`` may see that match a search's filters (with their status)."""
    if values:
        raise Unsupported("values: Trellis does not filter threads by their state")
    rows = with_thread_status(access.visible_sessions(viewer).filter(parent_session__isnull=True))
    if ids is not None:
        rows = rows.filter(pk__in=ids)
    if status:
        rows = rows.filter(status_filter(status))
    return metadata_filter(rows, metadata or {})


SORTS = {"thread_id": "pk", "created_at": "created_at", "updated_at": "last_active_at", "status": "lg_status"}


@router.post("threads/search", response={200: list[dict]})
@token_scope(TokenScope.READ)
def search_threads(request: HttpRequest, payload: ThreadSearchIn, response: HttpResponse):
    """The caller's threads — the root sessions they may see; sub-agents' sessions are reached
    by id — filtered by ``metadata`` (every pair held), ``status`` and ``ids``, newest activity
    first unless ``sort_by`` says otherwise."""
    if payload.extract:
        raise Unsupported("extract: Trellis answers whole threads (use select)")
    rows = _threads(request.auth, payload.metadata, payload.values, payload.status, payload.ids)
    field = SORTS[payload.sort_by or "updated_at"]
    descending = (payload.sort_order or "desc") == "desc"
    rows = rows.select_related("project", "agent_spec").order_by(*(f"-{f}" if descending else f for f in (field, "pk")))
    page = paginate(rows, payload.limit, payload.offset, response)
    values = not payload.select or "values" in payload.select
    return [selected(shape, payload.select) for shape in thread_shapes(request.auth, page, values=values)]


@router.post("threads/count", response={200: int})
@token_scope(TokenScope.READ)
def count_threads(request: HttpRequest, payload: ThreadCountIn):
    return _threads(request.auth, payload.metadata, payload.values, payload.status).count()


@router.post("threads/prune", response={200: dict})
def prune_threads(request: HttpRequest):
    raise Unsupported("pruning threads: delete them one by one (DELETE /threads/{thread_id})")


@router.post("threads", response={200: dict})
def create_thread(request: HttpRequest, payload: ThreadCreateIn):
    """A new session in ``metadata.project``, with the agent spec ``metadata.graph_id`` /
    ``metadata.assistant_id`` names (if any); the other metadata keys are kept as given."""
    viewer = request.auth
    if payload.supersteps:
        raise Unsupported("supersteps: a Trellis thread's history is written by its runs only")
    if payload.ttl is not None:
        raise Unsupported("ttl: Trellis keeps a thread until it is deleted")
    if payload.thread_id is not None:
        try:
            existing = thread_of(viewer, payload.thread_id)
        except NotFound:
            raise Unsupported("thread_id: Trellis names its threads; leave thread_id out") from None
        if payload.if_exists == "do_nothing":
            return thread_shape(viewer, existing)
        raise Conflict(f"thread {existing.pk} exists", code="thread_exists")
    metadata = dict(payload.metadata or {})
    project = _project_for(viewer, metadata.get("project"))
    spec = _pick_spec(viewer, project, metadata, payload.graph_id)
    own = {k: v for k, v in metadata.items() if k not in DERIVED_METADATA}
    session = do_create_session(viewer, project, agent_id=spec.agent_id if spec else "", metadata=own)
    return thread_shape(viewer, access.access_session(viewer, session.pk))


@router.get("threads/{thread_id}", response={200: dict})
def get_thread(request: HttpRequest, thread_id: str, include: str | None = None):
    if include:
        raise Unsupported(f"include: Trellis threads have no {include!r} (no ttl)")
    return thread_shape(request.auth, thread_of(request.auth, thread_id))


@router.patch("threads/{thread_id}", response={200: dict})
def patch_thread(request: HttpRequest, thread_id: str, payload: ThreadPatchIn):
    """Merge ``metadata`` into the thread's (a key set to null is kept as null). ``project``,
    ``graph_id`` and ``assistant_id`` are the thread's own: sent back unchanged they are
    accepted, changed they are refused."""
    if payload.ttl is not None:
        raise Unsupported("ttl: Trellis keeps a thread until it is deleted")
    session = thread_of(request.auth, thread_id, "update")
    changes = dict(payload.metadata or {})
    current = thread_metadata(session)
    for key in DERIVED_METADATA:
        if key in changes:
            if changes.pop(key) != current[key]:
                raise Unsupported(f"metadata.{key} is the thread's {key}; it does not change")
    if changes:
        do_update_session_metadata(request.auth, session, changes)
    return thread_shape(request.auth, thread_of(request.auth, thread_id))


@router.delete("threads/{thread_id}", response={204: None})
def delete_thread(request: HttpRequest, thread_id: str):
    """Delete the session and everything in it (refused, 409, while one of its runs is open)."""
    session = thread_of(request.auth, thread_id)
    access.require_can_delete_session(request.auth, session)
    do_delete_session(request.auth, session)
    return Status(204, None)


def _select_state(state: dict, select) -> dict:
    """A state with only the fields ``select`` names (``values.KEY``: that key of ``values``)."""
    if not select:
        return state
    keys = {f.split(".", 1)[0] for f in select}
    unknown = keys - set(STATE_FIELDS)
    if unknown:
        raise Invalid(f"select: no field {sorted(unknown)[0]!r}; the fields are {', '.join(STATE_FIELDS)}",
                      code="invalid_request")
    shaped = {k: v for k, v in state.items() if k in keys}
    wanted = [f.split(".", 1)[1] for f in select if f.startswith("values.")]
    if "values" in shaped and wanted and "values" not in select:
        shaped["values"] = {k: v for k, v in shaped["values"].items() if k in wanted}
    return shaped


@router.get("threads/{thread_id}/state", response={200: dict})
def get_state(request: HttpRequest, thread_id: str, subgraphs: bool = False, select: list[str] | None = SELECT_QUERY):
    """The thread's latest state (``subgraphs``: Trellis has none, so the answer is the same)."""
    return _select_state(state_shape(request.auth, thread_of(request.auth, thread_id)), select)


def _checkpoint_in(thread_id: str, checkpoint: CheckpointIn | None) -> str | None:
    if checkpoint is None:
        return None
    if checkpoint.thread_id not in (None, "", thread_id):
        raise NotFound("no such checkpoint in this thread", code="unknown_checkpoint")
    return checkpoint_id_in(checkpoint.model_dump())


@router.post("threads/{thread_id}/state/checkpoint", response={200: dict})
@token_scope(TokenScope.READ)
def post_state_at(request: HttpRequest, thread_id: str, payload: StateCheckpointIn):
    session = thread_of(request.auth, thread_id)
    checkpoint_id = _checkpoint_in(thread_id, payload.checkpoint)
    return _select_state(state_shape(request.auth, session, checkpoint_id=checkpoint_id), payload.select)


@router.get("threads/{thread_id}/state/{checkpoint_id}", response={200: dict})
def get_state_at(request: HttpRequest, thread_id: str, checkpoint_id: str, subgraphs: bool = False,
                 select: list[str] | None = SELECT_QUERY):
    """The state at a checkpoint: any message of the thread's DAG, the line ending there."""
    session = thread_of(request.auth, thread_id)
    return _select_state(state_shape(request.auth, session, checkpoint_id=checkpoint_id), select)


@router.post("threads/{thread_id}/state", response={200: dict})
def update_state(request: HttpRequest, thread_id: str):
    thread_of(request.auth, thread_id)
    raise Unsupported("updating a thread's state: a Trellis thread's history is written by its runs only "
                      "(start a run, or fork one from a checkpoint)")


@router.post("threads/{thread_id}/history", response={200: list[dict]})
@token_scope(TokenScope.READ)
def post_history(request: HttpRequest, thread_id: str, payload: HistoryIn):
    """The thread's states newest first: one per message along the line of its latest checkpoint
    (or of ``checkpoint``), ``before`` a checkpoint, matching ``metadata``."""
    session = thread_of(request.auth, thread_id)
    before = payload.before
    before_id = checkpoint_id_in(before) if before is not None else None
    states = history_shape(request.auth, session, limit=payload.limit,
                           checkpoint_id=_checkpoint_in(thread_id, payload.checkpoint),
                           before_id=before_id, metadata=payload.metadata)
    return [_select_state(s, payload.select) for s in states]


@router.post("threads/{thread_id}/copy", response={200: dict})
def copy_thread(request: HttpRequest, thread_id: str):
    thread_of(request.auth, thread_id)
    raise Unsupported("copying a thread: fork it instead (a run from a checkpoint)")

