"""The agent-facing tool surface: one registry, strict schemas, errors as results.

A tool is a thin adapter over a service. Its parameters are a pydantic model
with ``extra="forbid"`` — the same model validates gateway calls and model
calls and yields the JSON Schema offered to real models. Any ``DomainError``
becomes an error *result* (``<code>: <detail>``); the calling turn goes on.

``run_tool`` is also a boundary: arguments (model output or gateway input) are cleaned
(``collab.text``) before validation, and every result — whatever the tool — is cleaned and
held to the one bounded summary (``collab.services.results``, docs/contract.md#results).
"""

import json
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from collab.errors import DomainError, Invalid
from collab.models import effective_spec
from collab.services.acting import Actor
from collab.services.results import result_limit_for
from collab.text import bound_text, clean_data, clean_text


DETAIL_FIELD_CHARS = 2_000  # a detail field larger than this is left out of an over-long result


class ToolParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Awaits:
    """A call from outside a turn whose answer is an execution's end (the gateway's foreground
    ``agent``): ``execution_id`` in ``session_id`` runs on a worker; once it has ended,
    ``answer()`` is the call's result (bounded like any). The caller waits for it holding
    nothing (``collab.gateway``)."""
    execution_id: str
    session_id: str
    answer: Callable[[], "ToolResult"]


@dataclass
class ToolResult:
    text: str
    details: dict = field(default_factory=dict)
    is_error: bool = False
    awaits: Awaits | None = None  # the result so far; the call's answer comes when the execution ends

    @classmethod
    def error(cls, code: str, detail: str, **details) -> "ToolResult":
        return cls(text=f"{code}: {detail}", details={"code": code, **details}, is_error=True)

    def as_dict(self) -> dict:
        return {"text": self.text, "details": self.details, "is_error": self.is_error}


# Who runs a tool and where: the principal, the acting branch, the running job (if any).
ToolContext = Actor


@dataclass(frozen=True)
class Tool:
    name: str
    toolset: str
    description: str
    params: type[ToolParams]
    handler: Callable[[ToolContext, ToolParams], ToolResult]
    needs: str = ""  # "workspace" | "sandbox": offered only where the project's workspace (and bwrap) is there
    example: dict = field(default_factory=dict, hash=False, compare=False)  # arguments of one call, for people

    def json_schema(self) -> dict:
        return self.params.model_json_schema()


# Keyed by (toolset, name): both toolsets have a ``list_agents``, with different contracts.
REGISTRY: dict[tuple[str, str], Tool] = {}


def register(name: str, *, toolsets: tuple[str, ...], description: str, params: type[ToolParams], needs: str = "",
             example: dict | None = None):
    """Register a tool. ``example`` is one valid call's arguments (checked against ``params`` here,
    so the example people are shown is always one the tool accepts)."""
    example = example or {}
    try:
        params.model_validate(example)
    except ValidationError as exc:
        raise RuntimeError(f"the example call of tool {name!r} is not valid: {exc}") from None

    def decorator(fn):
        for toolset in toolsets:
            if (toolset, name) in REGISTRY:
                raise RuntimeError(f"tool {name!r} registered twice in toolset {toolset!r}")
            REGISTRY[(toolset, name)] = Tool(name, toolset, description.strip(), params, fn, needs, example)
        return fn

    return decorator


def tools_for(toolset: str, allow: list[str] | None = None) -> list[Tool]:
    """Every tool of a toolset, narrowed by a spec's allow-list (no per-branch conditions)."""
    _load_builtin_tools()
    tools = [t for (ts, _), t in REGISTRY.items() if ts == toolset]
    if allow:
        tools = [t for t in tools if t.name in allow]
    return sorted(tools, key=lambda t: t.name)


def toolset_names(toolset: str) -> set[str]:
    """The names of every tool of ``toolset`` (a spec's ``approvals`` may name them)."""
    return {t.name for t in tools_for(toolset)}


def check_arguments(toolset: str, name: str, arguments: dict) -> dict:
    """``arguments`` as tool ``name`` of ``toolset`` accepts them (an edited call a person
    approves), or ``Invalid`` naming what is wrong."""
    _load_builtin_tools()
    tool = REGISTRY.get((toolset, name))
    if tool is None:
        raise Invalid(f"no tool named {name!r} in the {toolset} toolset", code="invalid_arguments")
    try:
        tool.params.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
        raise Invalid(f"the edited arguments do not fit {name}: {problems}", code="invalid_arguments") from None
    return arguments


def run_tool(ctx: ToolContext, name: str, arguments: Any, *, tools: list[Tool]) -> ToolResult:
    """Run ``name`` if it is among ``tools`` (the caller's surface: what is not offered is not
    dispatched either); arguments are cleaned and validated against the tool's strict schema;
    the result is cleaned and bounded for the model that reads it."""
    if isinstance(arguments, dict):
        arguments = clean_data(arguments)
    return bounded_result(ctx, _run_tool(ctx, name, arguments, tools=tools))


def bounded_result(ctx: ToolContext, result: ToolResult) -> ToolResult:
    """``result`` with storable text and details, its text within the reader's result bound
    (``details.truncated`` says when it was cut; a tool may have set it already)."""
    limit = result_limit_for(reading_spec(ctx))
    text, truncated = bound_text(clean_text(result.text), limit)
    details = _bounded_details(clean_data(result.details), limit)
    if truncated:
        details = {**details, "truncated": True, "full_length": len(result.text)}
    awaits = result.awaits
    if awaits is not None:  # the answer is bounded for the same reader
        awaits = Awaits(awaits.execution_id, awaits.session_id, lambda: bounded_result(ctx, result.awaits.answer()))
    return ToolResult(text=text, details=details, is_error=result.is_error, awaits=awaits)


def _bounded_details(details: dict, limit: int) -> dict:
    """Details within the same bound: when they are larger, their large fields (a transcript's
    ``turns``, a long listing) are left out and named in ``details_omitted``; the text carries
    the bounded rendering of the same content."""
    if len(json.dumps(details, default=str)) <= limit:
        return details
    kept, omitted = {}, []
    for key, value in details.items():
        if len(json.dumps(value, default=str)) <= DETAIL_FIELD_CHARS:
            kept[key] = value
        else:
            omitted.append(key)
    return {**kept, "details_omitted": omitted}


def reading_spec(ctx: ToolContext):
    """The spec of the model that reads a tool's result (bounds it to its context window)."""
    branch = getattr(ctx, "branch", None)
    session = getattr(ctx, "session", None)
    if branch is None:
        return getattr(session, "agent_spec", None)
    return effective_spec(branch, session)


def _run_tool(ctx: ToolContext, name: str, arguments: Any, *, tools: list[Tool]) -> ToolResult:
    available = {t.name: t for t in tools}
    tool = available.get(name)
    if tool is None:
        return ToolResult.error("unknown_tool", f"no tool named {name!r} is available here", tool=name)
    if not isinstance(arguments, dict):
        # a model's unparseable arguments arrive as text that says why (runtime/providers/mapping.py)
        problem = getattr(arguments, "problem", None) or "arguments must be a JSON object"
        return ToolResult.error("invalid_arguments", problem, tool=name)
    try:
        params = tool.params.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
        return ToolResult.error("invalid_arguments", problems, tool=name)
    try:
        ctx.require_standing()  # every call re-checks that the principal still sees the session
        return tool.handler(ctx, params)
    except DomainError as exc:
        return ToolResult.error(exc.code, exc.detail, tool=name, **exc.extra)
    finally:
        ctx.standing = None  # read afresh by the next call: a share may change between two calls


def _load_builtin_tools() -> None:
    # cycle: both modules import this one (register, ToolParams); importing them registers their tools
    from collab.tools import collab_tools, openwork_tools, people  # noqa: F401
