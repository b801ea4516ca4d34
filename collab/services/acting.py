"""Who acts, and from where: the principal plus the branch (and running job) an agent speaks from."""

from dataclasses import dataclass
from typing import Any

from accounts.policy import role_allows, role_of
from collab.errors import Forbidden, NotFound
from collab.services.addressing import Caller


@dataclass
class Actor:
    """An agent's standing: ``user`` is the person whose permissions it acts with
    (the starter of the root turn, never wider); ``job`` is None for gateway calls."""

    user: Any
    session: Any
    branch: Any
    job: Any = None
    turn: Any = None  # the running TurnContext, when a turn (not the gateway) calls the tool

    @property
    def calling_node(self):
        """The node the current call hangs off: the branch tip (the assistant tool-call node in a turn)."""
        return self.branch.tip

    @property
    def address(self) -> str:
        return f"{self.session.pk}:{self.branch.tip_id}" if self.branch.tip_id else self.session.pk

    @property
    def caller(self):
        """This agent as an addresser: every lookup it makes stays in its branch's project (SPEC §8)."""
        return Caller(user=self.user, session_id=self.session.pk, branch_id=self.branch.pk,
                      project_id=self.session.project_id)

    @property
    def chain(self) -> tuple[int, int]:
        """(messages, generations) spent by the chain so far (OP §5.1)."""
        if self.job is None:
            return 0, 0
        return self.job.chain_messages, self.job.chain_generations

    @property
    def followup_mode(self) -> str:
        spec = self.branch.agent_spec or self.session.agent_spec
        return getattr(spec, "followup_mode", "") or "turn"

    def require(self, capability: str, project_id: int | None = None) -> None:
        """The principal must hold ``capability`` in the project (default: the acting session's)."""
        role = role_of(self.user, project_id or self.session.project_id)
        if role is None:
            raise NotFound()
        if not role_allows(role, capability):
            raise Forbidden(f"your role ({role}) does not allow {capability}")


def task_header(address: str) -> str:
    return (
        f"[task from {address}]\n"
        "This turn is a task: your final reply is returned to the sender automatically."
    )


def message_header(address: str) -> str:
    return (
        f"[message from {address}]\n"
        "A reply is optional: if you have nothing to add, do not reply. To answer, use "
        f'send_message(to="{address}", …).'
    )
