"""The spec page shows the tools of the spec's toolset (docs/web-app.md#agent-specs-and-their-tools):
each folded in its own section with its arguments — read from the JSON Schema its model receives,
never restated — and one example call, which the tool's own schema accepts; a tool the spec's agents
are not offered says why. The page cites the project's own docs, never an outside spec."""

import json
import re

import pytest
from django.utils.html import escape

from collab.services.specs import do_add_agent_spec
from collab.tools.registry import REGISTRY, ToolParams, register, tools_for


def tool_sections(html: str) -> dict[str, str]:
    return dict(re.findall(r'<details class="tool" data-tool="([a-z_]+)"[^>]*>(.*?)</details>', html, re.S))


def test_a_specs_page_shows_each_tool_of_its_toolset_with_its_arguments_and_an_example(team, browser_of):
    do_add_agent_spec(team.owner, team.alpha, agent_id="writer", tools=["agent", "send_message"])
    html = browser_of(team.maintainer).get("/p/alpha/specs/writer").content.decode()
    assert "§" not in html and "SPEC" not in html
    sections = tool_sections(html)
    assert sorted(sections) == sorted(t.name for t in tools_for("collab"))
    for tool in tools_for("collab"):
        section = sections[tool.name]
        schema = tool.json_schema()
        for name, prop in schema.get("properties", {}).items():
            row = re.search(rf'<tr data-argument="{name}">(.*?)</tr>', section, re.S)
            assert row, (tool.name, name)
            assert ("required" in row.group(1)) == (name in schema.get("required", [])), (tool.name, name)
            assert escape(prop.get("description", "")) in row.group(1), (tool.name, name)
        example = re.search(r'<pre class="tool-example">(.*?)</pre>', section, re.S).group(1)
        call = json.loads(example.replace("&quot;", '"').replace("&#x27;", "'").replace("&amp;", "&"))
        assert call["name"] == tool.name
        tool.params.model_validate(call["arguments"])  # an example its own schema accepts
    offered = {name for name, section in sections.items() if "not offered" not in section}
    assert offered == {"agent", "send_message"}
    assert "not in this spec&#x27;s tools list" in sections["list_agents"]
    agent = sections["agent"]
    assert 'data-argument="start_from"' in agent and "integer (1–200)" in sections["list_agents"]


def test_an_openwork_spec_lists_the_workspace_tools_a_project_without_one_cannot_offer(team, browser_of):
    do_add_agent_spec(team.owner, team.alpha, agent_id="lead", toolset="openwork")
    sections = tool_sections(browser_of(team.owner).get("/p/alpha/specs/lead").content.decode())
    assert sorted(sections) == sorted(t.name for t in tools_for("openwork"))
    for name in ("read", "grep", "glob", "list", "bash"):
        assert "not offered: the project has no workspace" in sections[name], name
    assert "not offered" not in sections["spawn_agent"] and "not offered" not in sections["wait_agent"]


def test_the_new_spec_page_shows_both_toolsets_to_choose_from(team, browser_of):
    html = browser_of(team.owner).get("/p/alpha/specs").content.decode()
    assert re.findall(r'<h2 data-toolset="([a-z]+)"', html) == ["collab", "openwork"]
    assert html.count('data-tool="spawn_agent"') == 1 and html.count('data-tool="list_agents"') == 2
    assert "docs/agents.md" in html and "§" not in html


def test_a_tool_whose_example_call_its_schema_refuses_is_not_registered():
    class Params(ToolParams):
        prompt: str

    before = dict(REGISTRY)
    with pytest.raises(RuntimeError, match="example call of tool 'broken'"):
        register("broken", toolsets=("collab",), description="-", params=Params, example={"promt": "typo"})
    assert REGISTRY == before
