import re

from django.db import transaction
from django.utils.text import slugify

from accounts.limits import limits_of, set_limits
from accounts.models import PROJECT_NAME_CHARS, PROJECT_SLUG_PATTERN, WatchPolicy
from accounts.services import ProjectLimitReached, SlugTaken, create_project
from collab.errors import Conflict, Forbidden, Invalid
from collab.events import record_project_event
from collab.services.specs import do_add_agent_spec
from collab.text import clean_text
from collab.workspace import WorkspaceError, check_workspace_path

SLUG_CHARS = 64  # Project.slug

# The agent every new project starts with (and the demo project has, ``manage.py demo``): a
# scripted one, so it answers with no model at all and says how to give it one.
STARTER_AGENT_ID = "assistant"
STARTER_REPLY = (
    "Hello! I am this project's scripted demo agent: I play a fixed script, not a language model, "
    "so all I can do is answer like this. You said: “{{prompt}}”\n\n"
    "To talk to a real model: the operator connects one (a model connection, in the admin or "
    "TRELLIS_MODEL_CONNECTIONS), then a maintainer opens this project's Agent specs page, picks that "
    "connection and a model for “assistant” and saves it. The next turn runs on the real model."
)
STARTER_SPEC = {
    "agent_id": STARTER_AGENT_ID,
    "provider": "scripted",
    "system_prompt": "You are a helpful assistant working with a team in this project.",
    "script": [{"sleep_ms": 400}, {"text": STARTER_REPLY}],  # every kind of turn: the same answer
}


def do_add_starter_agent(actor, project):
    """The starter agent ``STARTER_SPEC``, saved and audited like any new spec."""
    return do_add_agent_spec(actor, project, **STARTER_SPEC)


def slug_from_name(name: str) -> str:
    """The slug a name gives when none is chosen ("My Team's Bot" → "my-teams-bot"); "" when
    it gives none (a name without ASCII letters or digits)."""
    return slugify(name).replace("_", "-").strip("-")[:SLUG_CHARS].rstrip("-")


def do_create_project(actor, *, slug: str = "", name: str = ""):
    """A new project owned by ``actor``, with its starter agent: the one way to create one
    (``POST /api/projects`` and the projects page). Without a ``slug`` it is derived from
    ``name``; without a name the slug is the name. Refusals name the form field they are about
    (``field``): ``invalid_slug``/``invalid_name`` (400), ``slug_taken`` (409); past
    ``TRELLIS_MAX_PROJECTS_PER_USER`` (staff exempt), ``project_limit_reached`` (403)."""
    name, slug = clean_text(name or "").strip(), clean_text(slug or "").strip()
    if len(name) > PROJECT_NAME_CHARS:
        raise Invalid(f"name is longer than {PROJECT_NAME_CHARS} characters", code="invalid_name", field="name")
    if not slug:
        if not name:
            raise Invalid("give the project a name (or a slug)", code="invalid_name", field="name")
        slug = slug_from_name(name)
        if not slug:
            raise Invalid(f"no slug can be made from the name {name!r}: choose one (a–z, 0–9 and -)",
                          code="invalid_slug", field="slug")
    if not re.fullmatch(PROJECT_SLUG_PATTERN, slug):
        raise Invalid(f"slug must be 1–{SLUG_CHARS} lowercase letters, digits and '-', starting with a letter "
                      f"or digit; got {slug!r}", code="invalid_slug", field="slug")
    try:
        with transaction.atomic():
            project = create_project(actor, slug=slug, name=name)
            do_add_starter_agent(actor, project)
    except SlugTaken:
        raise Conflict(f"a project with slug {slug!r} already exists", code="slug_taken", field="slug") from None
    except ProjectLimitReached as exc:
        raise Forbidden(str(exc), code="project_limit_reached") from None
    return project


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
