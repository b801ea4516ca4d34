"""Which tools a branch is offered — and may call (what is not offered is not dispatched).

One function for the turn loop and the tool gateway: the spec's toolset narrowed
by its allow-list; an explorer gets only the read-only workspace tools and
never more than its parent branch; workspace tools need the project's workspace,
``bash`` also a working bubblewrap (never unsandboxed).
"""

from collab.models import AgentRole, Branch, effective_spec
from collab.sandbox import sandbox_status
from collab.tools.registry import Tool, tools_for

EXPLORER_TOOLS = frozenset({"read", "grep", "glob", "list", "bash"})


def agent_role_of(branch: Branch) -> str:
    """The agent's role (``AgentRole``; not a person's membership role, ``accounts.policy.role_of``):
    a child session's role (set at spawn) wins over the spec's."""
    session = branch.session
    if session.agent_role:
        return session.agent_role
    return getattr(effective_spec(branch), "role", "") or AgentRole.GENERAL


def spec_toolset(spec) -> str:
    return getattr(spec, "toolset", "") or "collab"


def toolset_of(branch: Branch) -> str:
    return spec_toolset(effective_spec(branch))


def withheld_tools(project) -> dict[str, str]:
    """Tools of the openwork toolset that this project cannot offer, with the reason (for pages)."""
    reasons = {}
    if not project.workspace:
        for tool in tools_for("openwork"):
            if tool.needs:
                reasons[tool.name] = "the project has no workspace"
        return reasons
    ok, why = sandbox_status()
    if not ok:
        for tool in tools_for("openwork"):
            if tool.needs == "sandbox":
                reasons[tool.name] = f"sandbox unavailable: {why}"
    return reasons


def spec_tools(toolset: str, allow: list[str], *, role: str, project) -> list[Tool]:
    """What an agent of a spec with this toolset and allow-list (``AgentSpec.tools``) is offered
    in the role ``role`` in ``project``: the toolset narrowed by the allow-list, less what the
    project cannot offer; an explorer only the workspace tools (the spec page shows the same)."""
    tools = tools_for(toolset, allow)
    withheld = withheld_tools(project) if any(t.needs for t in tools) else {}
    tools = [t for t in tools if t.name not in withheld]
    if role == AgentRole.EXPLORER:
        tools = [t for t in tools if t.name in EXPLORER_TOOLS]
    return tools


def branch_tools(branch: Branch, spec=None) -> list[Tool]:
    """The tools an agent on ``branch`` is offered: by ``spec`` (a turn's own, the one its job
    was admitted with, which may differ from the branch's: a run naming another assistant), else
    the branch's spec."""
    spec, role = spec if spec is not None else effective_spec(branch), agent_role_of(branch)
    tools = spec_tools(spec_toolset(spec), list(getattr(spec, "tools", None) or []), role=role,
                       project=branch.session.project)
    if role == AgentRole.EXPLORER and branch.parent_branch_id:  # never wider than the parent that spawned it
        parent = {t.name for t in branch_tools(branch.parent_branch)}
        tools = [t for t in tools if t.name in parent]
    return tools
