from django.db import transaction

from accounts.limits import limits_of, set_limits
from collab.events import record_project_event


def do_set_limits(actor, project, changes: dict):
    """Validate and apply a partial limits update, audited (raises ``accounts.limits.LimitError``)."""
    with transaction.atomic():
        before = limits_of(project)
        set_limits(project, changes)
        after = limits_of(project)
        diff = {k: {"from": before[k], "to": after[k]} for k in after if before[k] != after[k]}
        if diff:
            record_project_event(project.pk, "limits.changed", {"changes": diff}, actor=actor)
    return project
