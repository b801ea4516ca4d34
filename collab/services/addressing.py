"""Where a delivery goes (docs/contract.md#addresses): the live branch an address names.

References are resolved and authorized in ``collab.access`` (``access_branch``: ``SID:HEAD`` or
a name, seen as the caller — an agent confined to its project, blind to internal names); this
module adds what a *delivery* asks of its target beyond that: it is not archived and it is not
the caller's own branch.
"""

from collab.access import Caller, access_branch
from collab.errors import Invalid
from collab.models import Branch


def resolve_target(caller: Caller, address: str) -> Branch:
    """The live branch a delivery goes to: not archived, not the caller's own branch."""
    branch = access_branch(caller.user, address, caller=caller)
    if branch.archived:
        raise Invalid(f"agent {address} is archived; fork it with start_from to continue its work", code="archived")
    if caller.branch_id and branch.pk == caller.branch_id:
        raise Invalid("an agent cannot deliver to its own branch", code="self_delivery")
    return branch
