from django.db import transaction

from accounts.limits import limits_of, set_limits
from accounts.models import WatchPolicy
from collab.errors import Invalid
from collab.events import record_project_event
from collab.workspace import WorkspaceError, check_workspace_path


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


def do_update_project(actor, project, *, name=None, watch_policy=None):
    changes = {}
    if name is not None:
        if not name.strip():
            raise Invalid("name must not be empty", code="invalid_name")
        changes["name"] = name.strip()
    if watch_policy is not None:
        if watch_policy not in WatchPolicy.values:
            raise Invalid(f"watch_policy must be one of {', '.join(WatchPolicy.values)}", code="invalid_watch_policy")
        changes["watch_policy"] = watch_policy
    with transaction.atomic():
        for field, value in changes.items():
            setattr(project, field, value)
        if changes:
            project.save(update_fields=list(changes))
            record_project_event(project.pk, "project.updated", changes, actor=actor)
    return project


def do_set_workspace(actor, project, path: str):
    """An operator points a project at a directory on the workers: its explorers read it.
    ``path=""`` clears it. The one entry for ``manage.py workspace`` and the admin, audited.

    Not offered to project owners through the API or pages: a path on the workers is a
    server-side decision. Refused (``invalid_workspace``): the filesystem root, a path
    that is not an existing directory, and any directory that contains or lies inside
    Trellis's own files (``check_workspace_path``)."""
    path = (path or "").strip()
    if path:
        try:
            path = str(check_workspace_path(path))
        except WorkspaceError as exc:
            raise Invalid(exc.detail, code=exc.code) from None
    with transaction.atomic():
        before = project.workspace
        project.workspace = path
        project.save(update_fields=["workspace"])
        if before != path:
            record_project_event(project.pk, "workspace.changed", {"from": before, "to": path}, actor=actor)
    return project
