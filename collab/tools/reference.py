"""The tools of a spec, described for people (the spec page): each tool's arguments are read from
the JSON Schema its model is given (``Tool.json_schema``), its example call from its registration.
Nothing here restates a schema, so the page cannot drift from what a model receives."""

import json
from dataclasses import dataclass

from collab.models import AgentRole
from collab.tools.registry import tools_for
from collab.tools.surface import EXPLORER_TOOLS, spec_tools, withheld_tools


@dataclass(frozen=True)
class Argument:
    name: str
    type: str
    required: bool
    default: str  # as JSON; "" when required or computed (an empty list made afresh)
    description: str


@dataclass(frozen=True)
class ToolReference:
    name: str
    description: str
    arguments: list[Argument]
    example: str  # the call as the model would write it: {"name", "arguments"}
    offered: bool
    why_not: str  # why an agent of the spec is not offered it ("" when it is)


def tool_reference(toolset: str, allow: list[str], *, role: str, project) -> list[ToolReference]:
    """Every tool of ``toolset`` (collab or openwork; anything else: none) with its arguments and
    an example call, and whether an agent of a spec with this allow-list (``AgentSpec.tools``) in
    ``role`` is offered it in ``project`` (``collab.tools.surface.spec_tools`` decides, as in a turn)."""
    offered = {t.name for t in spec_tools(toolset, allow, role=role, project=project)}
    withheld = withheld_tools(project) if toolset == "openwork" else {}
    return [ToolReference(
        name=tool.name, description=tool.description, arguments=arguments_of(tool.json_schema()),
        example=json.dumps({"name": tool.name, "arguments": tool.example}, indent=2, ensure_ascii=False),
        offered=tool.name in offered,
        why_not="" if tool.name in offered else _why_not(tool.name, allow=set(allow), role=role, withheld=withheld),
    ) for tool in tools_for(toolset)]


def _why_not(name: str, *, allow: set, role: str, withheld: dict) -> str:
    if allow and name not in allow:
        return "not in this spec's tools list"
    if name in withheld:
        return withheld[name]
    if role == AgentRole.EXPLORER and name not in EXPLORER_TOOLS:
        return "an explorer has only the workspace tools"
    return "not offered"


def arguments_of(schema: dict) -> list[Argument]:
    """A tool's arguments from its JSON Schema (an object's ``properties``, in order)."""
    required = set(schema.get("required") or [])
    return [Argument(
        name=name, type=type_of(prop, schema), required=name in required,
        default="" if name in required or "default" not in prop else json.dumps(prop["default"], ensure_ascii=False),
        description=prop.get("description", ""),
    ) for name, prop in (schema.get("properties") or {}).items()]


def type_of(prop: dict, root: dict) -> str:
    """A property's type in words: ``integer (1–200)``, ``"a" | "b"``, ``array of integer``,
    ``string | null``."""
    ref = prop.get("$ref", "")
    if ref.startswith("#/$defs/"):
        prop = (root.get("$defs") or {}).get(ref.removeprefix("#/$defs/"), {})
    if "anyOf" in prop:
        return " | ".join(type_of(option, root) for option in prop["anyOf"])
    if "enum" in prop:
        return " | ".join(json.dumps(value, ensure_ascii=False) for value in prop["enum"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"array of {type_of(prop.get('items') or {}, root)}"
    bounds = _bounds(prop)
    return f"{kind} ({bounds})" if bounds else kind


def _bounds(prop: dict) -> str:
    low, high = prop.get("minimum"), prop.get("maximum")
    if low is not None and high is not None:
        return f"{low}–{high}"
    if low is not None:
        return f"at least {low}"
    if high is not None:
        return f"at most {high}"
    words = []
    if prop.get("minLength"):
        words.append("not empty" if prop["minLength"] == 1 else f"at least {prop['minLength']} characters")
    if prop.get("maxLength"):
        words.append(f"at most {prop['maxLength']} characters")
    if prop.get("pattern"):
        words.append(f"matching {prop['pattern']}")
    return ", ".join(words)
