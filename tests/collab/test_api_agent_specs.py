"""``GET /api/projects/{slug}/agent-specs`` (docs/api.md#api-at-a-glance): a project's agent specs,
each in the shape ``POST`` answers with, as a plain list like the API's other lists; every member
sees them (a session is started with one), a project the caller is not a member of is a 404."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from collab.models import ModelConnection

SPEC = {
    "agent_id": "planner",
    "provider": "openai",
    "model": "gpt-imaginary",
    "connection": "planner-llm",
    "system_prompt": "You plan.",
    "toolset": "collab",
    "role": "general",
    "tools": ["list_agents", "read_conversation"],
    "script": [],
    "followup_mode": "mailbox",
    "limits": {"max_tokens": 1000},
}


def connect_alpha(team):
    """An operator's model connection that project alpha may use."""
    conn = ModelConnection.objects.create(name="planner-llm", provider="openai", base_url="https://llm.example.invalid/v1",
                                          key_env="TRELLIS_TEST_PLANNER_KEY")
    conn.projects.add(team.alpha)


def test_every_member_lists_the_projects_specs_as_post_answers_them(team, api_as):
    connect_alpha(team)
    owner = api_as(team.owner)
    posted = [owner.post("/api/projects/alpha/agent-specs", body) for body in
              (SPEC, {"agent_id": "bot", "script": [{"text": "hi {{prompt}}"}]})]
    assert [r.status_code for r in posted] == [201, 201], [r.content for r in posted]
    by_id = sorted((r.json() for r in posted), key=lambda spec: spec["agent_id"])
    assert by_id[1]["connection"] == "planner-llm" and by_id[1]["base_url"] == "https://llm.example.invalid/v1"
    for user in (team.owner, team.maintainer, team.member, team.viewer):
        r = api_as(user).get("/api/projects/alpha/agent-specs")
        assert r.status_code == 200, (user.username, r.content)
        assert r.json() == by_id, user.username  # the same fields and values as each POST's answer


def test_a_project_the_caller_is_not_a_member_of_is_a_404_like_a_missing_one(team, api_as):
    assert api_as(team.owner).post("/api/projects/alpha/agent-specs", {"agent_id": "secret-bot"}).status_code == 201
    outsider = api_as(team.outsider)
    hidden, missing = outsider.get("/api/projects/alpha/agent-specs"), outsider.get("/api/projects/nowhere/agent-specs")
    assert (hidden.status_code, missing.status_code) == (404, 404)
    assert hidden.json() == missing.json() and hidden.json()["code"] == "not_found"
    assert "secret-bot" not in hidden.content.decode()
    assert outsider.get("/api/projects/beta/agent-specs").json() == []  # their own project: no spec yet


def test_listing_specs_costs_the_same_queries_however_many_there_are(team, api_as):
    connect_alpha(team)
    owner = api_as(team.owner)
    assert owner.post("/api/projects/alpha/agent-specs", SPEC).status_code == 201

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert owner.get("/api/projects/alpha/agent-specs").status_code == 200
        return len(captured)

    one = queries()
    for n in range(4):
        assert owner.post("/api/projects/alpha/agent-specs", {**SPEC, "agent_id": f"planner{n}"}).status_code == 201
    assert queries() == one


def test_the_published_schema_declares_the_list_and_its_refusals(api_as, team):
    operation = api_as(team.member).get("/api/openapi.json").json()["paths"]["/api/projects/{slug}/agent-specs"]["get"]
    assert {"200", "401", "403", "404"} <= set(operation["responses"])
    listed = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert listed["type"] == "array" and listed["items"]["$ref"].endswith("/AgentSpecOut")
