from django.db import IntegrityError, transaction

from collab.errors import Conflict, Invalid
from collab.models import AgentRole, AgentSpec, FollowupMode, Toolset
from collab.text import clean_data
from collab.runtime.providers import IMPLEMENTED_PROVIDERS
from collab.runtime.providers.remote import key_env_allowed
from collab.runtime.providers.scripted import check_script

SPEC_FIELDS = (
    "agent_id", "provider", "model", "base_url", "api_key_env", "system_prompt",
    "toolset", "role", "tools", "script", "followup_mode", "limits",
)


def _choice(value, allowed, field):
    if value not in allowed:
        raise Invalid(f"{field} must be one of {', '.join(allowed)}; got {value!r}", code=f"invalid_{field}")


def do_create_agent_spec(project, *, replace: bool = False, **data) -> AgentSpec:
    """Validate and save an AgentSpec. Only providers this server implements are accepted.
    ``replace`` (operators' commands) overwrites a spec with the same ``agent_id``."""
    data = clean_data(data)
    _choice(data.get("provider", "scripted"), IMPLEMENTED_PROVIDERS, "provider")
    if data.get("provider", "scripted") != "scripted" and not (data.get("model") or "").strip():
        raise Invalid(f"provider {data['provider']!r} needs a model name", code="invalid_model")
    key_env = (data.get("api_key_env") or "").strip()
    if key_env and not key_env_allowed(key_env):
        raise Invalid(
            f"api_key_env {key_env!r} is not allowed: name a variable like OPENAI_API_KEY "
            "(the server's own settings can never be used as model keys)",
            code="invalid_api_key_env",
        )
    _choice(data.get("toolset", Toolset.COLLAB), Toolset.values, "toolset")
    _choice(data.get("role", AgentRole.GENERAL), AgentRole.values, "role")
    _choice(data.get("followup_mode", FollowupMode.TURN), FollowupMode.values, "followup_mode")
    try:
        check_script(data.get("script") or [])
    except ValueError as exc:
        raise Invalid(str(exc), code="invalid_script") from None
    fields = {k: v for k, v in data.items() if k in SPEC_FIELDS and v is not None}
    if replace:
        agent_id = fields.pop("agent_id")
        spec, _ = AgentSpec.objects.update_or_create(project=project, agent_id=agent_id, defaults=fields)
        return spec
    try:
        with transaction.atomic():
            return AgentSpec.objects.create(project=project, **fields)
    except IntegrityError:
        raise Conflict(f"agent_id {data.get('agent_id')!r} already exists in this project", code="agent_id_taken") from None
