"""Who acts, and from where: the principal plus the branch (and running job) an agent speaks from."""

from dataclasses import dataclass
from typing import Any

from collab.access import require_in_project, require_in_session
from collab.services.addressing import Caller
from collab.errors import NotFound
from collab.models import Job, JobStatus, Session, effective_spec
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
        """This agent as an addresser: every lookup it makes stays in its branch's project (SPEC §8)."""
        return Caller(user=self.user, session_id=self.session.pk, branch_id=self.branch.pk,
                      project_id=self.session.project_id)

    @property
    def chain(self) -> tuple[int, int]:
        """(messages, generations) spent by the chain so far (OP §5.1)."""
        if self.job is None:
            return self.chain_counters
        return self.job.chain_messages, self.job.chain_generations

    @property
    def followup_mode(self) -> str:
        spec = effective_spec(self.branch, self.session)
        return getattr(spec, "followup_mode", "") or "turn"

    def require(self, capability: str, project_id: int | None = None, *, session=None) -> None:
        """The principal must hold ``capability`` in ``session`` (default: the acting one) —
        their effective role there, a session they may not see being "not found" (issue 17) —
        or, given only another ``project_id``, in that project."""
        if session is not None or project_id is None or project_id == self.session.project_id:
            require_in_session(self.user, session or self.session, capability)
            return
        require_in_project(self.user, project_id, capability)

    def check_standing(self) -> None:
        """Refuse the call when the principal can no longer see the acting session (its
        visibility changed under a running turn, issue 17): "not found", as for any other.
        The session row is read afresh: the turn's copy may predate the change."""
        fresh = Session.objects.select_related("parent_session").filter(pk=self.session.pk).first()
        if fresh is None:
            raise NotFound()
        require_in_session(self.user, fresh, "project.read")


def owns_branch(user, branch) -> bool:
    """A branch is the person's own when they started it: the root branch of a session they
    created, or a branch made by a job they started (``Branch.created_by`` records both)."""
    return branch.created_by_id is not None and branch.created_by_id == getattr(user, "pk", None)


def check_can_act_as(user, branch) -> None:
    """Who may act as a branch from outside a turn (the tool gateway, P-SEC-7): members as
    branches they started, maintainers and owners as any; viewers never."""
    actor = Actor(user=user, session=branch.session, branch=branch)
    actor.require("turn.start")
    if not owns_branch(user, branch):
        actor.require("branch.act_any")


def gateway_actor(user, branch) -> Actor:
    """The standing of a call made as ``branch`` from outside a turn. It has no job of its own
    but continues the branch's chain (OP §5.1): the counters of its running job, else of its
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
