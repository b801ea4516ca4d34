"""The one address resolver (SPEC §3, OP §1/§2.1) used by every delivery path.

An address is ``"SID:HEAD"`` (any message written on the branch; a stale head
still finds its branch) or a branch name. Names resolve in the caller's session
first, then across sessions the principal may see. The result is always the
branch itself (whose tip is current); archived branches, the caller's own
branch and ambiguous names are refused with a reason, and a target that does
not exist answers exactly like one the principal may not see.
"""

from dataclasses import dataclass

from collab.errors import Invalid, NotFound
from collab.models import Branch, Message


class Ambiguous(Invalid):
    code = "ambiguous_target"


@dataclass(frozen=True)
class Caller:
    """Who is addressing: the principal (a user) and, for agents, where they stand."""

    user: object
    session_id: str | None = None
    branch_id: str | None = None


def _visible_branches(user):
    return Branch.objects.filter(session__project__memberships__user=user)


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
            Message.objects.filter(pk=head, session_id=sid, session__project__memberships__user=caller.user)
            .select_related("branch", "branch__session", "branch__tip")
            .first()
        )
        if message is None:
            raise NotFound(f"no agent at {address}")
        return message.branch
    return _find_by_name(caller, address)


def _find_by_name(caller: Caller, name: str) -> Branch:
    """Live branches win; an archived branch answers to its name only when no live one does
    (so it stays readable and re-archivable by name, and deliveries hear "archived")."""
    visible = _visible_branches(caller.user).filter(name=name).select_related("session", "tip")
    candidates = []
    for pool in (visible.filter(archived=False), visible.filter(archived=True)):
        if caller.session_id:
            candidates = list(pool.filter(session_id=caller.session_id)[:11])
        if not candidates:
            candidates = list(pool.order_by("-last_active_at")[:11])
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
