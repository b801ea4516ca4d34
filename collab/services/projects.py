import re

from django.db import transaction
from django.utils.text import slugify

from accounts.limits import limits_of, set_limits
from accounts.models import PROJECT_NAME_CHARS, PROJECT_SLUG_PATTERN, WatchPolicy
from accounts.services import ProjectLimitReached, SlugTaken, create_project
from collab.errors import Conflict, Forbidden, Invalid
from collab.events import record_project_event
from collab.selectors.specs import specs_of
from collab.models import Toolset
from collab.services.specs import do_add_agent_spec, tool_names
from collab.text import clean_text
from collab.workspace import WorkspaceError, check_workspace_path

SLUG_CHARS = 64  # Project.slug

# The agents every new project starts with (and the demo project has, ``manage.py demo``): scripted
# ones, so they work with no model at all. ``assistant`` shows multi-agent work: a person's turn
# starts a "researcher" sub-agent with the ``agent`` tool, then a "critic" that reviews the
# researcher's notes, and answers with a summary of both results (docs/web-app.md#projects-and-their-first-session).
STARTER_AGENT_ID = "assistant"
RESEARCHER_AGENT_ID = "researcher"
CRITIC_AGENT_ID = "critic"
HOW_TO_CONNECT_A_MODEL = (
    "To run these agents on a real model: the operator connects one (a model connection, in the admin or "
    "TRELLIS_MODEL_CONNECTIONS; docs/models.md), then a maintainer opens this project's Agent specs page, picks "
    "that connection and a model for an agent and saves it. Its next turn runs on the real model."
)
STARTER_REPLY = (
    "Hello! I am this project's scripted demo agent: I play a fixed script, not a language model. "
    "Start a turn of your own in a session and I will show you multi-agent work: I ask a researcher "
    "sub-agent, then a critic, and sum up what they found. You said: “{{prompt}}”\n\n" + HOW_TO_CONNECT_A_MODEL
)
STARTER_SUMMARY = (
    "I asked two sub-agents about “{{prompt}}”: “researcher” wrote notes, then “critic” reviewed them. "
    "Each is a branch of this session (see the graph), and each one's answer came back to me as the result "
    "of my agent call. The critic's review, with the notes it reviewed:\n\n{{last.text}}\n\n"
    "All three of us are scripted demo agents: we play fixed scripts, not a language model. " + HOW_TO_CONNECT_A_MODEL
)
RESEARCHER_REPLY = (
    "Notes on “{{prompt}}”:\n"
    "- what is asked, in one sentence;\n"
    "- what we know about it, and where that comes from;\n"
    "- what is still open.\n"
    "(I am a scripted researcher: with a real model these notes would hold findings.)"
)
CRITIC_REPLY = (
    "Review: the notes are a start, but every point needs a source before anyone acts on it, and every "
    "open question needs an owner. (I am a scripted critic.)\n\nThe notes I reviewed:\n{{prompt}}"
)
SUB_AGENT_TOOLS = ["list_agents", "read_conversation"]  # they read what others did; they start nothing
QUICK_MS = 100  # a scripted step's pause: long enough to see an agent running, short enough to wait for


def _spawn(agent_id: str, prompt: str) -> dict:
    """A step that runs ``agent_id`` as a foreground sub-agent: its answer is the call's result."""
    return {"name": "agent", "arguments": {"agent_id": agent_id, "description": agent_id, "prompt": prompt}}


STARTER_SPEC = {
    "agent_id": STARTER_AGENT_ID,
    "provider": "scripted",
    "system_prompt": (
        "You coordinate a small team in this project. For a question worth looking into, start a sub-agent "
        f"with the agent tool (agent_id \"{RESEARCHER_AGENT_ID}\") to gather notes, then one with agent_id "
        f"\"{CRITIC_AGENT_ID}\" to review those notes, and answer with a short summary of both. Answer simple "
        "questions yourself. (While this spec has no model connection it plays its script instead; "
        "to give it a real model, a maintainer picks a model connection for it on the project's Agent specs "
        "page: docs/models.md.)"
    ),
    "script": {
        "user": [
            {"sleep_ms": QUICK_MS, "tool_calls": [_spawn(RESEARCHER_AGENT_ID, "{{prompt}}")]},
            {"tool_calls": [_spawn(CRITIC_AGENT_ID, "{{last.text}}")]},  # the researcher's notes
            {"text": STARTER_SUMMARY},
        ],
        # a task, a message or a result from another agent: the plain answer, no sub-agents
        **{kind: [{"sleep_ms": QUICK_MS}, {"text": STARTER_REPLY}] for kind in ("task", "message", "followup", "spawn")},
    },
}
RESEARCHER_SPEC = {
    "agent_id": RESEARCHER_AGENT_ID,
    "provider": "scripted",
    "system_prompt": ("You are a researcher. Gather what is known about the question you are given: the facts, "
                      "where they come from and what is still open. Answer with short notes."),
    "tools": SUB_AGENT_TOOLS,
    "script": [{"sleep_ms": QUICK_MS}, {"text": RESEARCHER_REPLY}],
}
CRITIC_SPEC = {
    "agent_id": CRITIC_AGENT_ID,
    "provider": "scripted",
    "system_prompt": ("You are a critic. Review the notes you are given: what is unsupported, missing or wrong, "
                      "and what to check next. Be brief and specific."),
    "tools": SUB_AGENT_TOOLS,
    "script": [{"sleep_ms": QUICK_MS}, {"text": CRITIC_REPLY}],
}
STARTER_SPECS = (STARTER_SPEC, RESEARCHER_SPEC, CRITIC_SPEC)


def do_add_starter_agents(actor, project) -> list:
    """The starter agents (``STARTER_SPECS``) the project does not have yet, each saved and audited
    like any new spec; a spec of the same ``agent_id`` is left as it is."""
    taken = set(specs_of(project).values_list("agent_id", flat=True))
    return [do_add_agent_spec(actor, project, **spec) for spec in STARTER_SPECS if spec["agent_id"] not in taken]


def slug_from_name(name: str) -> str:
    """The slug a name gives when none is chosen ("My Team's Bot" → "my-teams-bot"); "" when
    it gives none (a name without ASCII letters or digits)."""
    return slugify(name).replace("_", "-").strip("-")[:SLUG_CHARS].rstrip("-")


def do_create_project(actor, *, slug: str = "", name: str = ""):
    """A new project owned by ``actor``, with its starter agents: the one way to create one
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
            do_add_starter_agents(actor, project)
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


EVERY_TOOL = "*"


def approvable_tools() -> list[str]:
    """Every tool name a project's ``approvals`` may name: the tools of every toolset, sorted."""
    return sorted(set().union(*(tool_names(toolset) for toolset in Toolset.values)))


def check_project_approvals(approvals) -> list[str]:
    """A project's ``approvals`` as stored: a list of known tool names of any toolset, or
    ``"*"`` (every tool), each once, in the order given — else ``Invalid``
    (``invalid_approvals``) naming what is wrong (docs/contract.md#people-in-the-loop)."""
    if not isinstance(approvals, list) or not all(isinstance(a, str) for a in approvals):
        raise Invalid("approvals must be a list of tool names", code="invalid_approvals", field="approvals")
    unknown = sorted(set(approvals) - set(approvable_tools()) - {EVERY_TOOL})
    if unknown:
        shown = ", ".join(repr(clean_text(name)[:64]) for name in unknown[:10])
        raise Invalid(f"approvals names tools no toolset has: {shown}", code="invalid_approvals", field="approvals")
    return list(dict.fromkeys(approvals))


def do_update_project(actor, project, *, name=None, watch_policy=None, approvals=None):
    """Rename the project, set its watch policy and the tools whose every call waits for a
    person's approval (``approvals``); ``None`` leaves a setting as it is. Owners only (the
    caller checked ``project.settings``); each change is audited (``project.updated``)."""
    changes = {}
    if name is not None:
        if not name.strip():
            raise Invalid("name must not be empty", code="invalid_name")
        changes["name"] = name.strip()
    if watch_policy is not None:
        if watch_policy not in WatchPolicy.values:
            raise Invalid(f"watch_policy must be one of {', '.join(WatchPolicy.values)}", code="invalid_watch_policy")
        changes["watch_policy"] = watch_policy
    if approvals is not None:
        changes["approvals"] = check_project_approvals(approvals)
    changes = {field: value for field, value in changes.items() if getattr(project, field) != value}
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
