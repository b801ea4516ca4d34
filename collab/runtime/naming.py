"""Branch naming stage 2 (docs/contract.md#names): the model is asked for a title, the service writes it.

The task ``collab.tasks.name_branch`` runs this; ``collab.services.naming`` decides which
branches may be renamed and writes the new name, so no service imports a provider.
"""

from collab.models import Branch
from collab.runtime.providers import ProviderError, get_provider
from collab.services.naming import do_apply_auto_title, naming_input


def auto_name_branch(branch_id: str) -> Branch | None:
    """The branch, renamed when the model gave a new title; None when it may not be renamed or
    the model failed (the name stays as it is)."""
    found = naming_input(branch_id)
    if found is None:
        return None
    branch, spec, messages = found
    try:
        title = get_provider(spec).title(messages)
    except ProviderError:
        return None
    return do_apply_auto_title(branch, title)
