"""What a model is told: the system prompt (the spec's; an explorer's role
prompt; an OpenWork root's with the delegation rules) and the history it reads
(the branch root → tip, compacted to the context window)."""

from accounts.limits import effective_limit

from collab.models import AgentRole, Toolset
from collab.runtime.compaction import compacted, history_budget
from collab.selectors.transcript import lineage

EXPLORER_SYSTEM_PROMPT = """\
You are an explorer: a read-only sub-agent answering one specific, bounded question about the workspace for a parent agent.

1. Your final answer goes straight to the parent agent. Make it self-contained and readable on its own, and cite code locations (path:line) or command output as evidence.
2. Your job is to investigate, not to change the repository: you have no tools that modify files.
3. bash runs in a sandbox that cannot write to the workspace; the temporary directory (/tmp) is writable. Nobody can approve a call the sandbox refused.
4. Do not ask questions. When information is missing, state the assumptions you made and mark what is uncertain."""

DELEGATION_RULES = """\
## Sub-agent delegation

You can run up to {limit} read-only explorer turns concurrently. Delegate when you have multiple specific, bounded codebase questions that can proceed independently, especially when their intermediate research should stay out of the parent context. Keep doing useful parent-side work while explorers run. Handle a single small question locally. Keep critical-path research local when your next action depends on its result. Do not delegate work you already investigated or repeatedly delegate the same unresolved question. Use wait_agent only when waiting is the next useful action; delivered messages appear before the next model call. Reuse an idle explorer with followup_task when its existing context helps."""


def explorer_prompt() -> str:
    return EXPLORER_SYSTEM_PROMPT


def delegation_rules(limit: int) -> str:
    return DELEGATION_RULES.format(limit=limit)


def system_prompt(spec, *, role: str, toolset: str, tools, project) -> str:
    """The spec's prompt; an explorer's role prompt; an OpenWork root's ends with the
    delegation rules carrying the project's ``max_active_turns``."""
    base = (getattr(spec, "system_prompt", "") or "").strip()
    if role == AgentRole.EXPLORER:
        return explorer_prompt()
    if toolset == Toolset.OPENWORK and any(t.name == "spawn_agent" for t in tools):
        rules = delegation_rules(effective_limit(project, "max_active_turns"))
        return "\n\n".join(part for part in (base, rules) if part)
    return base


def history(spec, tip) -> list:
    """The branch's messages from the root to ``tip`` (for providers that send history), cut
    to fit the model's context window when the spec declares one (runtime/compaction.py)."""
    limits = getattr(spec, "limits", None) or {}
    window = limits.get("context_window") if isinstance(limits, dict) else None
    return compacted(lineage(tip), history_budget(window if isinstance(window, int) else None))
