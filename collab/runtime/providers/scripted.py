"""The ``scripted`` provider (docs/contract.md#the-scripted-provider): the embedded default and the test double.

``AgentSpec.script`` is a list of steps (for every turn) or an object keyed by
turn kind (``user``, ``task``, ``message``, ``followup``, ``spawn``). One step per
model call: ``{"text": …}`` answers, ``{"tool_calls": [{"name", "arguments"}]}``
calls tools, ``{"sleep_ms": N}`` waits (cancellably) first; a step's ``usage``
(``{"input_tokens", "output_tokens"}``) is what its model call reports. When the steps run
out the answer is ``ok: `` + the first 200 characters of the prompt.
"""

import json
import re
from typing import Any

from collab.provider_specs import (  # noqa: F401 (the step format, importable from here as before)
    MAX_SLEEP_MS,
    TURN_KINDS,
    ScriptStep,
    ScriptToolCall,
    StepList,
    StepsByKind,
    check_script,
)
from collab.runtime.providers.base import ModelResponse, ToolCall

FALLBACK_PREFIX = "ok: "


_PLACEHOLDER = re.compile(r"\{\{\s*(prompt|address|mailbox|last\.text|last\.details(?:\.[A-Za-z0-9_\-]+)+)\s*\}\}")


def _lookup(name: str, turn) -> Any:
    if name == "prompt":
        return turn.prompt
    if name == "address":
        return turn.address
    if name == "mailbox":
        return turn.mailbox_text
    last = turn.last_result
    if name == "last.text":
        return last.text if last else ""
    value: Any = last.details if last else {}
    for part in name.split(".")[2:]:
        if isinstance(value, dict):
            value = value.get(part, "")
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return ""
    return value


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def substitute(value: Any, turn) -> Any:
    """Fill placeholders in every string of ``value``. A string that is exactly one
    placeholder takes the raw value (so ``"{{last.details.id}}"`` can stay a number)."""
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value.strip())
        if whole:
            return _lookup(whole.group(1), turn)
        return _PLACEHOLDER.sub(lambda m: _as_text(_lookup(m.group(1), turn)), value)
    if isinstance(value, list):
        return [substitute(v, turn) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, turn) for k, v in value.items()}
    return value


class ScriptedProvider:
    name = "scripted"

    def __init__(self, script):
        self.script = script

    def title(self, messages) -> str:
        return _title_from(messages)

    def steps_for(self, kind: str) -> list[dict]:
        if isinstance(self.script, list):
            return self.script
        if isinstance(self.script, dict):
            return self.script.get(kind) or []
        return []

    def complete(self, turn) -> ModelResponse:
        steps = self.steps_for(turn.job.kind)
        state = turn.provider_state
        usage = {"tokens_in": 0, "tokens_out": 0}  # what the steps of this call report (``usage``)
        while state.get("cursor", 0) < len(steps):
            index = state.get("cursor", 0)
            step = steps[index]
            state["cursor"] = index + 1
            if step.get("sleep_ms"):
                turn.sleep(step["sleep_ms"] / 1000)
            reported = step.get("usage") or {}
            usage["tokens_in"] += int(reported.get("input_tokens") or 0)
            usage["tokens_out"] += int(reported.get("output_tokens") or 0)
            if step.get("text") is not None:
                return ModelResponse(text=_as_text(substitute(step["text"], turn)), **usage)
            if step.get("tool_calls"):
                calls = [
                    ToolCall(
                        id=f"call_{index}_{n}",
                        name=call["name"],
                        arguments=substitute(call.get("arguments") or {}, turn),
                    )
                    for n, call in enumerate(step["tool_calls"])
                ]
                return ModelResponse(tool_calls=calls, **usage)
            # a pure sleep step: carry on with the next one in the same model call
        return ModelResponse(text=FALLBACK_PREFIX + turn.prompt[:200], **usage)


def _title_from(messages) -> str:
    """Deterministic title: the first words of the branch's first prompt, headers skipped."""
    for message in messages:
        if message.role != "user":
            continue
        text = message.text
        header = (message.metadata or {}).get("header") or ""
        if header and text.startswith(header):
            text = text[len(header):]
        text = " ".join(text.split()[:6])
        if text:
            return text[:60]
    return ""
