"""A project's saved agent specs as the pages show them (the project page's session form, the
specs page)."""

from collab.models import AgentSpec


def specs_of(project):
    """The project's specs by ``agent_id``, each with its model connection."""
    return AgentSpec.objects.filter(project=project).select_related("connection").order_by("agent_id")


def spec_named(project, agent_id: str) -> AgentSpec | None:
    """The project's spec named ``agent_id`` (with its connection), or None."""
    return specs_of(project).filter(agent_id=agent_id).first()
