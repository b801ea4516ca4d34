"""What an AgentSpec may name for its model: the providers this server implements and the
``scripted`` provider's step format (docs/contract.md#the-scripted-provider).

Spec validation (``collab.services.specs``) and the providers (``collab.runtime.providers``)
both take them from here, so validating a spec does not import the runtime.
Pure data and pydantic models, no rows.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, model_validator

IMPLEMENTED_PROVIDERS = ("scripted", "openai", "anthropic")

TURN_KINDS = ("user", "task", "message", "followup", "spawn")
MAX_SLEEP_MS = 600_000
MAX_STEP_TOKENS = 10_000_000


class ScriptToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptUsage(BaseModel):
    """The tokens a step's model call reports, as a real model's usage (quotas, the execution's
    usage, traces)."""

    model_config = ConfigDict(extra="forbid")
    input_tokens: int = Field(default=0, ge=0, le=MAX_STEP_TOKENS)
    output_tokens: int = Field(default=0, ge=0, le=MAX_STEP_TOKENS)


class ScriptStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str | None = None
    tool_calls: list[ScriptToolCall] | None = None
    sleep_ms: int | None = Field(default=None, ge=0, le=MAX_SLEEP_MS)
    usage: ScriptUsage | None = None

    @model_validator(mode="after")
    def _one_action(self):
        if self.text is not None and self.tool_calls is not None:
            raise ValueError("a step has either text or tool_calls, not both")
        if self.text is None and self.tool_calls is None and self.sleep_ms is None:
            raise ValueError("a step needs text, tool_calls or sleep_ms")
        if self.tool_calls is not None and not self.tool_calls:
            raise ValueError("tool_calls must not be empty")
        return self


class StepList(RootModel[list[ScriptStep]]):
    pass


class StepsByKind(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: list[ScriptStep] | None = None
    task: list[ScriptStep] | None = None
    message: list[ScriptStep] | None = None
    followup: list[ScriptStep] | None = None
    spawn: list[ScriptStep] | None = None


_NULL = {"type": "null"}
_STEP = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "text": {"anyOf": [{"type": "string"}, _NULL]},
        "tool_calls": {"anyOf": [{"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "object"}},
        }}, _NULL]},
        "sleep_ms": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_SLEEP_MS}, _NULL]},
        "usage": {"anyOf": [{"type": "object", "additionalProperties": False, "properties": {
            name: {"type": "integer", "minimum": 0, "maximum": MAX_STEP_TOKENS} for name in ScriptUsage.model_fields
        }}, _NULL]},
    },
    # ScriptStep._one_action: text, tool_calls or sleep_ms (null is absent), never text and tool_calls
    "anyOf": [{"required": [name], "properties": {name: {"not": _NULL}}} for name in ("text", "tool_calls", "sleep_ms")],
    "not": {"required": ["text", "tool_calls"],
            "properties": {"text": {"not": _NULL}, "tool_calls": {"not": _NULL}}},
}
_STEPS = {"type": "array", "items": _STEP}
# What ``check_script`` accepts, as JSON Schema (the API publishes it with the agent specs)
SCRIPT_SCHEMA = {"anyOf": [_STEPS, {
    "type": "object", "additionalProperties": False,
    "properties": {kind: {"anyOf": [_STEPS, _NULL]} for kind in StepsByKind.model_fields},
}]}


def check_script(script: Any) -> Any:
    """Validate a script; returns it unchanged or raises ``ValueError`` with a readable reason."""
    try:
        if isinstance(script, list):
            StepList.model_validate(script)
        elif isinstance(script, dict):
            StepsByKind.model_validate(script)
        else:
            raise ValueError("script must be a list of steps or an object keyed by turn kind")
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid script: {problems}") from None
    return script
