import re
from collections.abc import Callable

from django.db import IntegrityError, transaction

from collab.errors import Conflict, Invalid
from collab.events import record_project_event
from collab.models import AgentRole, AgentSpec, FollowupMode, Toolset
from collab.provider_specs import IMPLEMENTED_PROVIDERS, check_script
from collab.text import clean_data
from collab.services.connections import choose_connection, connections_for
from collab.services.turns import STRATEGIES

SPEC_FIELDS = (
    "agent_id", "provider", "model", "system_prompt",
    "toolset", "role", "tools", "script", "followup_mode", "limits", "approvals",
)
AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # the API schema's pattern (AgentSpecIn.agent_id)
MAX_MODEL_CHARS = 200  # AgentSpec.model


def _choice(value, allowed, field):
    if value not in allowed:
        raise Invalid(f"{field} must be one of {', '.join(allowed)}; got {value!r}", code=f"invalid_{field}")


def check_spec_strategy(limits) -> None:
    """``limits.multitask_strategy``, the spec's double-texting default, is one
    of the strategies of ``POST /api/sessions/{sid}/turns`` when given."""
    if isinstance(limits, dict) and limits.get("multitask_strategy") is not None:
        value = limits["multitask_strategy"]
        if value not in STRATEGIES:
            raise Invalid(f"limits.multitask_strategy must be one of {', '.join(STRATEGIES)}; got {value!r}",
                          code="invalid_multitask_strategy")


# The names of a toolset's tools, from the tool registry, which sits above the services: set at
# start-up by ``collab.apps`` (a port, so a service never imports the tools).
_toolset_names: Callable[[str], set[str]] = lambda toolset: set()  # noqa: E731


def use_toolset_names(names: Callable[[str], set[str]]) -> None:
    global _toolset_names
    _toolset_names = names


def tool_names(toolset: str) -> set[str]:
    """The names of every tool of ``toolset`` (from the registry, through the port above)."""
    return _toolset_names(toolset)


def check_approvals(approvals, toolset: str, limits) -> None:
    """``approvals`` names tools of the spec's toolset (or ``"*"``: every tool);
    ``limits.approval_expires_s``, when given, is a whole number of seconds ≥ 1
    (docs/contract.md#people-in-the-loop)."""
    if approvals is not None:
        if not isinstance(approvals, list) or not all(isinstance(a, str) for a in approvals):
            raise Invalid("approvals must be a list of tool names", code="invalid_approvals")
        known = _toolset_names(toolset) | {"*"}
        unknown = sorted(set(approvals) - known)
        if unknown:
            raise Invalid(f"approvals names tools the {toolset} toolset does not have: {', '.join(unknown)}",
                          code="invalid_approvals")
    seconds = limits.get("approval_expires_s") if isinstance(limits, dict) else None
    if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 1):
        raise Invalid("limits.approval_expires_s must be a whole number of seconds, at least 1",
                      code="invalid_limits")


def do_create_agent_spec(project, *, replace: bool = False, **data) -> AgentSpec:
    """Validate and save an AgentSpec. Only providers this server implements are accepted.
    A spec on a model API names a ``connection`` the project may use (or the older
    ``base_url``/``api_key_env`` of one; services/connections.py); without a provider the
    connection's is taken. ``replace`` (operators' commands) overwrites a spec with the
    same ``agent_id``."""
    data = clean_data(data)
    if not isinstance(data.get("agent_id"), str) or not AGENT_ID.fullmatch(data["agent_id"]):
        raise Invalid("agent_id must be 1–64 letters, digits, '-' or '_'", code="invalid_agent_id")
    if len(data.get("model") or "") > MAX_MODEL_CHARS:
        raise Invalid(f"model is longer than {MAX_MODEL_CHARS} characters", code="invalid_model")
    connection_name = (data.pop("connection", None) or "").strip()
    base_url, api_key_env = data.pop("base_url", None) or "", data.pop("api_key_env", None) or ""
    if not data.get("provider"):
        named = None
        if connection_name:
            # only a connection this project may use says anything (another tenant's reads like a missing one)
            named = connections_for(project).filter(name=connection_name).values_list("provider", flat=True).first()
        if connection_name and named is None:
            raise Invalid(f"no model connection named {connection_name!r} is available to this project",
                          code="provider_config")
        data["provider"] = named or "scripted"
    _choice(data["provider"], IMPLEMENTED_PROVIDERS, "provider")
    if data["provider"] != "scripted" and not (data.get("model") or "").strip():
        raise Invalid(f"provider {data['provider']!r} needs a model name", code="invalid_model")
    connection = choose_connection(
        project, provider=data["provider"], model=(data.get("model") or "").strip(),
        connection=connection_name, base_url=base_url, api_key_env=api_key_env,
    )
    _choice(data.get("toolset", Toolset.COLLAB), Toolset.values, "toolset")
    _choice(data.get("role", AgentRole.GENERAL), AgentRole.values, "role")
    _choice(data.get("followup_mode", FollowupMode.TURN), FollowupMode.values, "followup_mode")
    check_spec_strategy(data.get("limits"))
    check_approvals(data.get("approvals"), data.get("toolset", Toolset.COLLAB), data.get("limits"))
    try:
        check_script(data.get("script") or [])
    except ValueError as exc:
        raise Invalid(str(exc), code="invalid_script") from None
    fields = {k: v for k, v in data.items() if k in SPEC_FIELDS and v is not None}
    fields["connection"] = connection
    if replace:
        agent_id = fields.pop("agent_id")
        spec, _ = AgentSpec.objects.update_or_create(project=project, agent_id=agent_id, defaults=fields)
        return spec
    try:
        with transaction.atomic():
            return AgentSpec.objects.create(project=project, **fields)
    except IntegrityError:
        raise Conflict(f"agent_id {data.get('agent_id')!r} already exists in this project", code="agent_id_taken") from None


def do_update_agent_spec(actor, spec: AgentSpec, changes: dict) -> AgentSpec:
    """Change a saved spec (the operator's admin, the project's spec page): validated like a
    new one, audited with the fields that really changed. ``agent_id`` is the spec's identity
    and does not change here. A new ``connection`` (by name) without a ``provider`` brings the
    connection's provider (none: ``scripted``)."""
    current = {field: getattr(spec, field) for field in SPEC_FIELDS}
    current["connection"] = spec.connection.name if spec.connection_id else ""
    changes = {k: v for k, v in changes.items()
               if k in (*SPEC_FIELDS, "connection") and k != "agent_id" and current.get(k) != v}
    merged = current | changes
    if "connection" in changes and not changes.get("provider"):
        merged["provider"] = None
    with transaction.atomic():
        spec = do_create_agent_spec(spec.project, replace=True, **merged)
        if changes:
            record_project_event(spec.project_id, "agent_spec.changed",
                                 {"agent_id": spec.agent_id, "fields": sorted(changes)}, actor=actor)
    return spec


def do_add_agent_spec(actor, project, **data) -> AgentSpec:
    """A new spec saved by an operator (the admin): validated like the API's, audited."""
    with transaction.atomic():
        spec = do_create_agent_spec(project, **data)
        record_project_event(project.pk, "agent_spec.created", {"agent_id": spec.agent_id}, actor=actor)
    return spec


def do_delete_agent_spec(actor, spec: AgentSpec) -> None:
    """Remove a saved spec (sessions and branches that used it keep running without it); audited."""
    with transaction.atomic():
        record_project_event(spec.project_id, "agent_spec.deleted", {"agent_id": spec.agent_id}, actor=actor)
        spec.delete()
