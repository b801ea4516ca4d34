"""Who acts, and from where: the principal plus the branch (and running job) an agent speaks from."""

from dataclasses import dataclass
from typing import Any

from collab.access import Caller, require_in_session, require_role, require_standing
from collab.models import Job, JobStatus, effective_spec
from collab.models.branches import NO_ADDRESS


@dataclass
class Actor:
    """An agent's standing: ``user`` is the person whose permissions it acts with
    (the starter of the root turn, never wider); ``job`` is None for gateway calls, whose
    chain counters come from the branch instead (``gateway_actor``)."""

    user: Any
    session: Any
    branch: Any
    job: Any = None
    turn: Any = None  # the running TurnContext, when a turn (not the gateway) calls the tool
    chain_counters: tuple[int, int] = (0, 0)  # used when there is no running job
    # the principal's role in the acting session, read afresh by the tool call in progress
    # (``require_standing``) and forgotten when it ends (``collab.tools.registry``)
    standing: str | None = None

    @property
    def calling_node(self):
        """The node the current call hangs off: the branch tip (the assistant tool-call node in a turn)."""
        return self.branch.tip

    @property
    def address(self) -> str | None:
        """The acting branch's ``SID:HEAD`` (``Branch.address``; None while it has no message)."""
        return self.branch.address

    @property
    def caller(self):
        """This agent as an addresser: every lookup it makes stays in its branch's project
        (docs/contract.md#addresses)."""
        return Caller(user=self.user, session_id=self.session.pk, branch_id=self.branch.pk,
                      project_id=self.session.project_id)

    @property
    def chain(self) -> tuple[int, int]:
        """(messages, generations) spent by the chain so far (docs/contract.md#topology-budgets)."""
        if self.job is None:
            return self.chain_counters
        return self.job.chain_messages, self.job.chain_generations

    @property
    def followup_mode(self) -> str:
        spec = effective_spec(self.branch, self.session)
        return getattr(spec, "followup_mode", "") or "turn"

    def require(self, capability: str, *, session=None) -> None:
        """The principal must hold ``capability`` by their effective role in ``session`` (default:
        the acting one); a session they may not see is "not found". In the acting session, the
        role this call's ``require_standing`` read is used (no second read)."""
        if self.standing is not None and (session is None or session.pk == self.session.pk):
            require_role(self.standing, capability)
        else:
            require_in_session(self.user, session or self.session, capability)

    def require_standing(self) -> None:
        """Refuse the call when the principal can no longer see the acting session
        (``collab.access.require_standing``); keeps their role there for this call (``standing``)."""
        self.standing = None
        self.standing = require_standing(self.user, self.session.pk)


def gateway_actor(user, branch) -> Actor:
    """The standing of a call made as ``branch`` from outside a turn. It has no job of its own
    but continues the branch's chain (docs/contract.md#topology-budgets): the counters of its running job, else of its
    latest one, so topology budgets bind across gateway calls as they do across turns."""
    jobs = Job.objects.filter(branch=branch).order_by("-created_at", "-pk")
    counters = (
        jobs.filter(status=JobStatus.RUNNING).values_list("chain_messages", "chain_generations").first()
        or jobs.values_list("chain_messages", "chain_generations").first()
        or (0, 0)
    )
    return Actor(user=user, session=branch.session, branch=branch, chain_counters=tuple(counters))


def task_header(address: str | None) -> str:
    return (
        f"[task from {address or NO_ADDRESS}]\n"
        "This turn is a task: your final reply is returned to the sender automatically."
    )


def message_header(address: str | None) -> str:
    if address is None:
        return f"[message from {NO_ADDRESS}]\nA reply is optional; this sender cannot be answered until it has a message."
    return (
        f"[message from {address}]\n"
        "A reply is optional: if you have nothing to add, do not reply. To answer, use "
        f'send_message(to="{address}", …).'
    )
