"""The one address resolver (SPEC §3, OP §1/§2.1) used by every delivery path.

An address is ``"SID:HEAD"`` (any message written on the branch; a stale head
still finds its branch) or a branch name. Names resolve in the caller's session
first, then across the other sessions of the caller's project. The result is
always the branch itself (whose tip is current); archived branches, the caller's
own branch and ambiguous names are refused with a reason, and a target that does
not exist answers exactly like one the principal may not see.

Agents stay in their project (SPEC §8): an agent's ``Caller`` carries the acting
branch's project, and nothing outside it is ever found, whatever else the person
who started the turn may see. A person (the REST routes) has no project and may
address any project they have accepted.

Internal branches (issue 14 item 6) are hidden from agents: an agent's ``Caller`` (one with a
``branch_id``) never finds an internal branch by NAME — it answers like a missing name. Its explicit
``SID:HEAD`` address still resolves for whoever may see the session, and people (the REST routes,
a user turn) still find it by name.

Row-level visibility (issue 17): every lookup is limited to ``collab.access.visible_sessions``
of the principal, so a private or shared session they may not see is never found (an agent
acts with the permissions of the person who started its root turn).
"""

from dataclasses import dataclass

from collab.access import visible_session_ids
from collab.errors import Invalid, NotFound
from collab.models import Branch, Message, Session


class Ambiguous(Invalid):
    code = "ambiguous_target"


@dataclass(frozen=True)
class Caller:
    """Who is addressing: the principal (a user) and, for agents, where they stand.
    ``project_id`` confines every lookup to that project (agents always set it)."""

    user: object
    session_id: str | None = None
    branch_id: str | None = None
    project_id: int | None = None

    def confine(self, rows, session_field: str, project_field: str):
        """``rows`` limited to the sessions the principal may see and, for an agent, its project."""
        rows = rows.filter(**{f"{session_field}__in": visible_session_ids(self.user)})
        if self.project_id is not None:
            rows = rows.filter(**{project_field: self.project_id})
        return rows

    @property
    def is_agent(self) -> bool:
        """An agent addresses (it stands on a branch); a person does not."""
        return self.branch_id is not None


def visible_sessions(caller: Caller):
    return caller.confine(Session.objects.all(), "pk", "project_id")


def _visible_branches(caller: Caller):
    return caller.confine(Branch.objects.all(), "session_id", "session__project_id")


def parse_address(address: str) -> tuple[str, str] | None:
    """``(session_id, message_id)`` for a ``SID:HEAD`` address, None for a name."""
    sid, sep, head = address.partition(":")
    if sep and sid and head:
        return sid, head
    return None


def find_branch(caller: Caller, address: str) -> Branch:
    """The branch an address names, archived or not (for reads and forks)."""
    address = (address or "").strip()
    if not address:
        raise Invalid("an address is required: 'SID:HEAD' or a branch name", code="invalid_address")
    if not caller.user or not caller.user.is_authenticated:
        raise NotFound()
    parsed = parse_address(address)
    if parsed is not None:
        sid, head = parsed
        message = (
            caller.confine(Message.objects.filter(pk=head, session_id=sid), "session_id", "session__project_id")
            .select_related("branch", "branch__session", "branch__tip")
            .first()
        )
        if message is None:
            raise NotFound(f"no agent at {address}")
        return message.branch
    return _find_by_name(caller, address)


def _find_by_name(caller: Caller, name: str) -> Branch:
    """The caller's own session answers first: its live branch of that name, else its archived
    one (reported as archived by deliveries, never silently replaced by another session's
    branch). Only when the caller's session has none does the rest of the project answer,
    live branches before archived ones (so an archived branch stays readable by name)."""
    visible = _visible_branches(caller).filter(name=name).select_related("session", "tip")
    if caller.is_agent:  # internal branches are hidden from agents by name (issue 14 item 6)
        visible = visible.filter(internal=False)
    pools = []
    if caller.session_id:
        own = visible.filter(session_id=caller.session_id)
        pools += [own.filter(archived=False), own.filter(archived=True)]
        visible = visible.exclude(session_id=caller.session_id)
    pools += [visible.filter(archived=False).order_by("-last_active_at"),
              visible.filter(archived=True).order_by("-last_active_at")]
    candidates = []
    for pool in pools:
        candidates = list(pool[:11])
        if candidates:
            break
    if not candidates:
        raise NotFound(f"no agent named {name!r}")
    if len(candidates) > 1:
        listed = ", ".join(f"{b.address or b.session_id + ':(empty)'}" for b in candidates[:10])
        raise Ambiguous(
            f"{len(candidates) if len(candidates) <= 10 else 'more than 10'} agents are named {name!r}: {listed}; "
            "address one as SID:HEAD",
            candidates=[b.address for b in candidates[:10]],
        )
    return candidates[0]


def resolve_target(caller: Caller, address: str) -> Branch:
    """The live branch a delivery goes to: not archived, not the caller's own branch."""
    branch = find_branch(caller, address)
    if branch.archived:
        raise Invalid(f"agent {address} is archived; fork it with start_from to continue its work", code="archived")
    if caller.branch_id and branch.pk == caller.branch_id:
        raise Invalid("an agent cannot deliver to its own branch", code="self_delivery")
    return branch
