"""Agent specs: the one lookup of an ``agent_id`` in a project, and a project's
specs as the pages list them."""

from collab.errors import NotFound
from collab.models import AgentSpec


def spec_by_agent_id(project_id: int, agent_id: str) -> AgentSpec:
    """The project's AgentSpec called ``agent_id`` (with its model connection), or NotFound
    ``unknown_agent_id``. Callers authorize the project first."""
    spec = AgentSpec.objects.filter(project_id=project_id, agent_id=agent_id).select_related("connection").first()
    if spec is None:
        raise NotFound(f"no agent spec {agent_id!r} in this project", code="unknown_agent_id")
    return spec


def specs_of(project):
    """The project's specs by ``agent_id``, each with its model connection."""
    return AgentSpec.objects.filter(project=project).select_related("connection").order_by("agent_id")
