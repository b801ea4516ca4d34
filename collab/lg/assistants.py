"""LangGraph-compatible assistants routes (docs/langgraph.md#assistants): a project's agent specs,
read-only. Every member of a project reads its specs, as on ``/api``; anyone else gets 404."""

from typing import Any, Literal

from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from ninja import Router
from pydantic import Field

from accounts.models import TokenScope
from collab.lg.values import (
    AGENT_NODE,
    Unsupported,
    UnsupportedRoute,
    assistant_of,
    assistant_shape,
    messages_schema,
    paginate,
    selected,
    visible_specs,
)
from collab.schemas import StrictIn
from collab.scopes import token_scope

router = Router(tags=["assistants"])

ASSISTANT_FIELDS = ("assistant_id", "graph_id", "name", "description", "config", "context", "metadata", "version",
                    "created_at", "updated_at")
SORTS = {"assistant_id": "pk", "graph_id": "agent_id", "name": "agent_id", "created_at": "created_at",
         "updated_at": "created_at"}
# what an assistant's metadata says (``assistant_shape``) → the spec's column it comes from
METADATA_COLUMNS = {"project": "project__slug", "provider": "provider", "model": "model", "toolset": "toolset"}
MAX_LIMIT = 1000


class AssistantSearchIn(StrictIn):
    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=1, le=MAX_LIMIT)
    offset: int = Field(0, ge=0)
    sort_by: Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[Literal[ASSISTANT_FIELDS]] | None = None  # type: ignore[valid-type]


class AssistantCountIn(StrictIn):
    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None


def _matching(viewer, graph_id, name, metadata):
    specs = visible_specs(viewer)
    if graph_id:
        specs = specs.filter(agent_id=graph_id)
    if name:
        specs = specs.filter(agent_id__icontains=name)
    for key, value in (metadata or {}).items():
        column = METADATA_COLUMNS.get(key)
        if column is None:  # a key no assistant's metadata has: nothing matches, as in LangGraph
            return specs.none()
        if key == "model" and value is None:
            specs = specs.filter(model="")
        elif not isinstance(value, str):
            return specs.none()
        else:
            specs = specs.filter(Q(**{column: value}))
    return specs


@router.post("assistants/search", response={200: list[dict]})
@token_scope(TokenScope.READ)
def search_assistants(request: HttpRequest, payload: AssistantSearchIn, response: HttpResponse):
    """The agent specs of the caller's projects (``graph_id``: an ``agent_id``; ``name``: a part
    of it; ``metadata``: exact values of ``project``, ``provider``, ``model``, ``toolset``)."""
    specs = _matching(request.auth, payload.graph_id, payload.name, payload.metadata)
    field = SORTS[payload.sort_by or "created_at"]
    descending = (payload.sort_order or "desc") == "desc"
    specs = specs.order_by(*(f"-{f}" if descending else f for f in (field, "pk")))
    page = paginate(specs, payload.limit, payload.offset, response)
    return [selected(assistant_shape(spec), payload.select) for spec in page]


@router.post("assistants/count", response={200: int})
@token_scope(TokenScope.READ)
def count_assistants(request: HttpRequest, payload: AssistantCountIn):
    return _matching(request.auth, payload.graph_id, payload.name, payload.metadata).count()


@router.get("assistants/{assistant_id}", response={200: dict})
def get_assistant(request: HttpRequest, assistant_id: str):
    """One agent spec, by its ``assistant_id`` (or, as LangGraph allows, its graph name when it
    names one spec among the caller's projects)."""
    return assistant_shape(assistant_of(request.auth, assistant_id))


@router.get("assistants/{assistant_id}/graph", response={200: dict})
def get_assistant_graph(request: HttpRequest, assistant_id: str, xray: bool | int = False):
    """The graph an agent spec runs: one node, the agent's turn (its model and tool loop)."""
    assistant_of(request.auth, assistant_id)
    return {
        "nodes": [{"id": "__start__", "type": "schema", "data": "__start__"},
                  {"id": AGENT_NODE, "type": "runnable", "data": {"id": ["trellis", "agent"], "name": AGENT_NODE}},
                  {"id": "__end__", "type": "schema", "data": "__end__"}],
        "edges": [{"source": "__start__", "target": AGENT_NODE}, {"source": AGENT_NODE, "target": "__end__"}],
    }


@router.get("assistants/{assistant_id}/schemas", response={200: dict})
def get_assistant_schemas(request: HttpRequest, assistant_id: str):
    """The state an agent spec's threads hold: ``messages`` in, ``messages`` out; no config."""
    spec = assistant_of(request.auth, assistant_id)
    state = messages_schema()
    return {"graph_id": spec.agent_id, "input_schema": state, "output_schema": state, "state_schema": state,
            "config_schema": {"type": "object", "properties": {}}, "context_schema": {"type": "object",
                                                                                     "properties": {}}}


@router.get("assistants/{assistant_id}/subgraphs", response={200: dict})
def get_assistant_subgraphs(request: HttpRequest, assistant_id: str):
    """An agent spec's graph has no subgraphs."""
    assistant_of(request.auth, assistant_id)
    return {}


@router.post("assistants", response={200: dict})
def create_assistant(request: HttpRequest):
    raise UnsupportedRoute("assistants are Trellis agent specs: a maintainer saves one with "
                           "POST /api/projects/{slug}/agent-specs")


@router.patch("assistants/{assistant_id}", response={200: dict})
def update_assistant(request: HttpRequest, assistant_id: str):
    raise UnsupportedRoute("assistants are Trellis agent specs: a maintainer changes one on its project's spec page")


@router.delete("assistants/{assistant_id}", response={204: None})
def delete_assistant(request: HttpRequest, assistant_id: str):
    raise UnsupportedRoute("assistants are Trellis agent specs: a maintainer deletes one in the admin")


@router.post("assistants/{assistant_id}/versions", response={200: list[dict]})
def assistant_versions(request: HttpRequest, assistant_id: str):
    raise Unsupported("assistant versions: a Trellis agent spec has one version")
