"""The REST API contract (docs/contract.md#http-api) as it exists now, and its refusals.

Shapes use the exact field names of the contract. Every refusal is a 4xx with
``{"detail": str, "code": str}`` — never a 500 — and writes nothing: the rows of
every collab and accounts model are counted before and after each rejected call.
Outsiders get byte-for-byte the answer a nonexistent id gets (docs/contract.md#visibility).

These tests need no worker: they run on the fast, non-transactional ``db``.
"""

import json
from contextlib import contextmanager

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import ApiToken, Membership, Project
from collab.models import (
    AgentSpec,
    Artifact,
    Branch,
    Event,
    ExecutionCommand,
    InboxEntry,
    Job,
    Message,
    ModelConnection,
    Session,
    Todo,
)
from collab.models.ids import new_id

ROW_MODELS = (
    Project, Membership, AgentSpec, Session, Branch, Message, Job, Event,
    InboxEntry, Todo, Artifact, ExecutionCommand,
)
ERROR_KEYS = {"detail", "code"}
SESSION_KEYS = {"id", "head", "project", "title", "agent_id", "parent_session", "created_at"}
EXECUTION_KEYS = {"id", "status", "version", "kind", "result", "is_error", "error_code", "parent_job", "session", "branch"}
SPEC_FIELDS = {
    "agent_id", "provider", "model", "connection", "base_url", "api_key_env", "system_prompt",
    "toolset", "role", "tools", "script", "followup_mode", "limits",
}


def row_counts() -> dict:
    return {model.__name__: model.objects.count() for model in ROW_MODELS}


@contextmanager
def nothing_written():
    """The block may be refused as often as it likes, but must leave every table as it was."""
    before = row_counts()
    yield
    assert row_counts() == before


def assert_error(response, status: int, code: str | None = None) -> dict:
    """A JSON error of the contract: the status, and exactly a readable ``detail`` and a ``code``."""
    assert response.status_code == status, (response.status_code, response.content)
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert ERROR_KEYS <= set(body), body
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["code"], str) and body["code"]
    if code is not None:
        assert body["code"] == code, body
    return body


def same_answer(a, b) -> None:
    """Byte-identical answers: nothing tells a hidden row from a missing one."""
    assert a.status_code == b.status_code
    assert a.content == b.content
    assert a["Content-Type"] == b["Content-Type"]


def post_json(client, path, data=None, raw=None, **headers):
    body = raw if raw is not None else json.dumps(data if data is not None else {})
    return client.post(path, body, content_type="application/json", **headers)


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture
def owner_api(team, api_as):
    return api_as(team.owner)


@pytest.fixture
def member_api(team, api_as):
    return api_as(team.member)


@pytest.fixture
def session_id(team, scripted_session):
    """A session in ``alpha`` that the member opened with the ``bot`` spec."""
    _, sid = scripted_session(team.member, [{"text": "hi"}])
    return sid


@pytest.fixture
def outsiders_session(team, scripted_session):
    """A session in ``beta``, where nobody from ``alpha`` is a member."""
    _, sid = scripted_session(team.outsider, [{"text": "secret"}], project="beta", agent_id="hidden")
    return sid


@pytest.fixture
def turn(member_api, session_id):
    """A member's turn on ``session_id`` (admitted; no worker runs it here)."""
    r = member_api.post(f"/api/sessions/{session_id}/turns", {"prompt": "first"})
    assert r.status_code == 202, r.content
    return r.json()


@pytest.fixture
def browser(team):
    """A browser that logged in through the login form: session cookie, CSRF enforced."""
    client = Client(enforce_csrf_checks=True)
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    r = client.post(
        "/accounts/login/",
        {"username": "member", "password": "pw-secret-123", "csrfmiddlewaretoken": client.cookies["csrftoken"].value},
    )
    assert r.status_code == 302, r.content
    return client


def csrf_header(client) -> dict:
    return {"HTTP_X_CSRFTOKEN": client.cookies["csrftoken"].value}


# --- authentication (docs/contract.md#authentication) --------------------------------------


def test_it_refuses_a_request_without_credentials_with_401(team, session_id):
    anonymous = Client(enforce_csrf_checks=True)
    assert_error(anonymous.get("/api/projects"), 401, "unauthenticated")
    assert_error(anonymous.get(f"/api/sessions/{session_id}"), 401, "unauthenticated")
    with nothing_written():
        assert_error(post_json(anonymous, "/api/projects", {"slug": "gamma"}), 401, "unauthenticated")
        assert_error(post_json(anonymous, f"/api/sessions/{session_id}/turns", {"prompt": "hi"}), 401, "unauthenticated")


@pytest.mark.parametrize(
    "authorization",
    ["Bearer trl_not-a-real-token", "Bearer ", "Token trl_abc", "trl_abc", "Bearer trl_a trl_b"],
    ids=["unknown-token", "empty-token", "wrong-scheme", "no-scheme", "two-tokens"],
)
def test_it_refuses_a_bad_authorization_header_with_401(team, authorization):
    client = Client(enforce_csrf_checks=True)
    assert_error(client.get("/api/projects", HTTP_AUTHORIZATION=authorization), 401, "unauthenticated")
    with nothing_written():
        r = post_json(client, "/api/projects", {"slug": "gamma"}, HTTP_AUTHORIZATION=authorization)
        assert_error(r, 401, "unauthenticated")


def test_a_bearer_client_needs_no_csrf_token(team):
    _, raw = ApiToken.issue(team.member, name="cli")
    client = Client(enforce_csrf_checks=True)
    r = post_json(client, "/api/projects", {"slug": "gamma", "name": "Gamma"}, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 201, r.content


def test_it_refuses_a_revoked_token_with_401_on_reads_and_writes(team, session_id):
    token, raw = ApiToken.issue(team.member, name="revoked")
    client = Client(enforce_csrf_checks=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    assert client.get(f"/api/sessions/{session_id}", **auth).status_code == 200

    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])

    assert_error(client.get("/api/projects", **auth), 401, "unauthenticated")
    assert_error(client.get(f"/api/sessions/{session_id}", **auth), 401, "unauthenticated")
    with nothing_written():
        assert_error(post_json(client, "/api/projects", {"slug": "gamma"}, **auth), 401, "unauthenticated")
        r = post_json(client, f"/api/sessions/{session_id}/turns", {"prompt": "still here?"}, **auth)
        assert_error(r, 401, "unauthenticated")


def test_it_refuses_the_token_of_a_deactivated_user_with_401(team):
    _, raw = ApiToken.issue(team.member)
    team.member.is_active = False
    team.member.save(update_fields=["is_active"])
    assert_error(Client().get("/api/projects", HTTP_AUTHORIZATION=f"Bearer {raw}"), 401, "unauthenticated")


def test_a_browser_session_reads_without_a_csrf_token(browser, session_id):
    assert [p["slug"] for p in browser.get("/api/projects").json()] == ["alpha"]
    assert browser.get(f"/api/sessions/{session_id}").json()["id"] == session_id


def test_it_refuses_a_browser_post_without_the_csrf_token_with_403_csrf_failed(browser, session_id):
    with nothing_written():
        assert_error(post_json(browser, "/api/projects/alpha/sessions", {"title": "x"}), 403, "csrf_failed")
        assert_error(post_json(browser, f"/api/sessions/{session_id}/turns", {"prompt": "hi"}), 403, "csrf_failed")
        assert_error(post_json(browser, "/api/projects", {"slug": "gamma"}), 403, "csrf_failed")


def test_it_refuses_a_browser_post_with_a_wrong_csrf_token(browser, session_id):
    wrong = {"HTTP_X_CSRFTOKEN": "x" * 64}
    with nothing_written():
        r = post_json(browser, f"/api/sessions/{session_id}/turns", {"prompt": "hi"}, **wrong)
        assert_error(r, 403, "csrf_failed")


def test_a_browser_post_with_the_csrf_token_succeeds(browser):
    r = post_json(browser, "/api/projects/alpha/sessions", {"title": "from the page"}, **csrf_header(browser))
    assert r.status_code == 201, r.content
    sid = r.json()["id"]
    r = post_json(browser, f"/api/sessions/{sid}/turns", {"prompt": "hello"}, **csrf_header(browser))
    assert r.status_code == 202, r.content
    assert Job.objects.get(pk=r.json()["execution_id"]).started_by.username == "member"


# --- projects -----------------------------------------------------------------------------


def test_get_projects_lists_only_the_projects_the_caller_belongs_to_with_their_role(team, api_as):
    assert [(p["slug"], p["name"], p["role"]) for p in api_as(team.viewer).get("/api/projects").json()] == [
        ("alpha", "Alpha", "viewer")
    ]
    assert [(p["slug"], p["role"]) for p in api_as(team.outsider).get("/api/projects").json()] == [("beta", "owner")]


def test_post_project_answers_201_and_makes_the_caller_its_owner(team, member_api):
    r = member_api.post("/api/projects", {"slug": "gamma", "name": "Gamma"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert {"slug": "gamma", "name": "Gamma", "role": "owner"}.items() <= body.items()
    assert Membership.objects.get(project__slug="gamma").user == team.member
    assert "gamma" in [p["slug"] for p in member_api.get("/api/projects").json()]


def test_it_rejects_a_project_slug_that_is_taken_with_409(member_api):
    with nothing_written():
        assert_error(member_api.post("/api/projects", {"slug": "beta", "name": "Mine now"}), 409, "slug_taken")
    assert Project.objects.get(slug="beta").name == "Beta"


# Malformed JSON is 400; well-formed bodies that break the schema are 422 (a NUL is stored replaced:
# tests/collab/test_text_boundary.py).
BAD_PROJECT_BODIES = {
    "malformed-json": ('{"slug": "gamma"', 400),
    "empty-body": ("", 422),
    "null": ("null", 422),
    "array": ("[]", 422),
    "string": ('"gamma"', 422),
    "missing-slug": ('{"name": "no slug"}', 422),
    "bad-slug": ('{"slug": "Not A Slug"}', 422),
    "empty-slug": ('{"slug": ""}', 422),
    "slug-not-a-string": ('{"slug": 42}', 422),
    "name-not-a-string": ('{"slug": "gamma", "name": ["x"]}', 422),
    "unknown-field": ('{"slug": "gamma", "owner": "someone"}', 422),
    "name-too-long": ('{"slug": "gamma", "name": "' + "n" * 201 + '"}', 422),
}


@pytest.mark.parametrize("raw,status", list(BAD_PROJECT_BODIES.values()), ids=list(BAD_PROJECT_BODIES))
def test_it_rejects_a_bad_project_body_and_creates_nothing(member_api, raw, status):
    with nothing_written():
        assert_error(member_api.post("/api/projects", raw=raw), status)


# --- agent specs ----------------------------------------------------------------------------

@pytest.fixture
def planner_connection(team):
    """An operator's connection bound to alpha (staff define these in the admin)."""
    conn = ModelConnection.objects.create(name="planner-llm", provider="openai", base_url="https://llm.example.invalid/v1",
                                          key_env="TRELLIS_TEST_PLANNER_KEY")
    conn.projects.add(team.alpha)
    return conn


FULL_SPEC = {
    "agent_id": "planner",
    "provider": "openai",
    "model": "gpt-imaginary",
    "connection": "planner-llm",
    "base_url": "https://llm.example.invalid/v1",
    "api_key_env": "TRELLIS_TEST_PLANNER_KEY",
    "system_prompt": "You plan.",
    "toolset": "collab",
    "role": "explorer",
    "tools": ["list_agents", "read_conversation"],
    "script": {"user": [{"sleep_ms": 5}, {"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"text": "{{last.text}}"}]},
    "followup_mode": "mailbox",
    "limits": {"max_tokens": 1000},
}


def test_post_agent_spec_answers_201_with_the_whole_spec(owner_api, planner_connection):
    r = owner_api.post("/api/projects/alpha/agent-specs", FULL_SPEC)
    assert r.status_code == 201, r.content
    body = r.json()
    assert SPEC_FIELDS <= set(body)
    assert {k: body[k] for k in SPEC_FIELDS} == FULL_SPEC


def test_post_agent_spec_fills_defaults_for_a_minimal_spec(owner_api):
    r = owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "tiny"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["provider"] == "scripted" and body["toolset"] == "collab" and body["followup_mode"] == "turn"
    assert body["api_key_env"] == "" and body["script"] == [] and body["tools"] == []
    assert body["connection"] is None and body["base_url"] == ""


def test_post_agent_spec_is_audited_like_the_specs_page(team, owner_api):
    """``POST /api/projects/{slug}/agent-specs`` goes through the same audited
    service as the specs page and the admin: an ``agent_spec.created`` event by its author."""
    r = owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "audited"})
    assert r.status_code == 201, r.content
    event = Event.objects.get(type="agent_spec.created", project=team.alpha)
    assert event.actor == team.owner and event.payload == {"agent_id": "audited"}
    assert owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "audited"}).status_code == 409
    assert Event.objects.filter(type="agent_spec.created").count() == 1  # a refused one writes nothing


def test_api_key_env_is_only_a_name_and_no_key_is_ever_stored_or_returned(team, owner_api, monkeypatch,
                                                                                   planner_connection):
    secret = "sk-live-DO-NOT-LEAK-0123456789"
    monkeypatch.setenv("TRELLIS_TEST_PLANNER_KEY", secret)

    r = owner_api.post("/api/projects/alpha/agent-specs", FULL_SPEC)
    assert r.status_code == 201, r.content
    assert r.json()["api_key_env"] == "TRELLIS_TEST_PLANNER_KEY"
    assert secret not in r.content.decode()

    r = owner_api.post("/api/projects/alpha/sessions", {"title": "t", "agent_id": "planner"})
    assert secret not in r.content.decode()
    assert secret not in owner_api.get(f"/api/sessions/{r.json()['id']}").content.decode()
    assert secret not in json.dumps(list(AgentSpec.objects.values()), default=str)
    assert secret not in owner_api.get("/api/openapi.json").content.decode()


def test_it_refuses_an_api_key_itself_in_a_spec(owner_api):
    with nothing_written():
        r = owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "leaky", "api_key": "sk-live-123"})
        assert_error(r, 422, "invalid_request")
        r = owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "leaky", "api_key_env": "sk-live-123"})
        assert_error(r, 422, "invalid_request")


INVALID_SCRIPTS = {
    "text-and-tool-calls": [{"text": "hi", "tool_calls": [{"name": "list_agents", "arguments": {}}]}],
    "unknown-step-key": [{"text": "hi", "temperature": 0}],
    "empty-step": [{}],
    "step-is-a-string": ["hello"],
    "text-not-a-string": [{"text": 42}],
    "empty-tool-calls": [{"tool_calls": []}],
    "tool-call-without-name": [{"tool_calls": [{"arguments": {}}]}],
    "tool-call-with-empty-name": [{"tool_calls": [{"name": ""}]}],
    "tool-call-unknown-key": [{"tool_calls": [{"name": "list_agents", "args": {}}]}],
    "arguments-not-an-object": [{"tool_calls": [{"name": "list_agents", "arguments": [1, 2]}]}],
    "negative-sleep": [{"sleep_ms": -1}],
    "endless-sleep": [{"sleep_ms": 10**12}],
    "unknown-turn-kind": {"user": [{"text": "hi"}], "weekend": [{"text": "zzz"}]},
    "kind-not-a-list": {"user": {"text": "hi"}},
    "bad-step-under-a-kind": {"task": [{"text": "a", "tool_calls": [{"name": "x"}]}]},
}


@pytest.mark.parametrize("script", list(INVALID_SCRIPTS.values()), ids=list(INVALID_SCRIPTS))
def test_it_rejects_an_invalid_script_and_saves_no_spec(owner_api, script):
    with nothing_written():
        r = owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "broken", "script": script})
        assert 400 <= r.status_code < 500
        assert_error(r, r.status_code)


@pytest.mark.parametrize("script", ["just text", 42, None, True], ids=["string", "number", "null", "bool"])
def test_it_rejects_a_script_that_is_neither_a_list_nor_an_object(owner_api, script):
    with nothing_written():
        assert_error(owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "broken", "script": script}), 422)


BAD_SPEC_FIELDS = {
    "no-agent-id": ({"provider": "scripted"}, 422, "invalid_request"),
    "bad-agent-id": ({"agent_id": "has space"}, 422, "invalid_request"),
    "long-agent-id": ({"agent_id": "a" * 65}, 422, "invalid_request"),
    "unknown-provider": ({"agent_id": "x", "provider": "no-such-provider"}, 400, "invalid_provider"),
    "unknown-toolset": ({"agent_id": "x", "toolset": "everything"}, 400, "invalid_toolset"),
    "unknown-role": ({"agent_id": "x", "role": "boss"}, 400, "invalid_role"),
    "unknown-followup-mode": ({"agent_id": "x", "followup_mode": "never"}, 400, "invalid_followup_mode"),
    "tools-not-a-list": ({"agent_id": "x", "tools": "agent"}, 422, "invalid_request"),
    "limits-not-an-object": ({"agent_id": "x", "limits": [1]}, 422, "invalid_request"),
    "unknown-field": ({"agent_id": "x", "temperature": 0.2}, 422, "invalid_request"),
    "base-url-of-no-connection": ({"agent_id": "x", "provider": "openai", "model": "m",
                                   "base_url": "https://evil.example/v1"}, 400, "provider_config"),
    "unknown-connection": ({"agent_id": "x", "provider": "openai", "model": "m", "connection": "nope"},
                           400, "provider_config"),
    "scripted-with-a-base-url": ({"agent_id": "x", "base_url": "https://evil.example/v1"}, 400, "provider_config"),
}


@pytest.mark.parametrize("body,status,code", list(BAD_SPEC_FIELDS.values()), ids=list(BAD_SPEC_FIELDS))
def test_it_rejects_a_bad_agent_spec_and_saves_nothing(owner_api, body, status, code):
    with nothing_written():
        assert_error(owner_api.post("/api/projects/alpha/agent-specs", body), status, code)


def test_it_rejects_a_second_spec_with_the_same_agent_id_with_409(owner_api):
    assert owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "twin", "system_prompt": "one"}).status_code == 201
    with nothing_written():
        r = owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "twin", "system_prompt": "two"})
        assert_error(r, 409, "agent_id_taken")
    assert AgentSpec.objects.get(agent_id="twin").system_prompt == "one"


def test_the_same_agent_id_may_exist_in_two_projects(team, api_as):
    assert api_as(team.owner).post("/api/projects/alpha/agent-specs", {"agent_id": "same"}).status_code == 201
    assert api_as(team.outsider).post("/api/projects/beta/agent-specs", {"agent_id": "same"}).status_code == 201


def test_a_viewer_cannot_save_an_agent_spec_but_a_maintainer_can(team, api_as):
    with nothing_written():
        assert_error(api_as(team.viewer).post("/api/projects/alpha/agent-specs", {"agent_id": "v"}), 403, "forbidden")
    assert api_as(team.maintainer).post("/api/projects/alpha/agent-specs", {"agent_id": "m"}).status_code == 201


def test_another_projects_spec_endpoint_answers_exactly_like_a_missing_project(team, member_api):
    with nothing_written():
        hidden = member_api.post("/api/projects/beta/agent-specs", {"agent_id": "x"})
        missing = member_api.post("/api/projects/no-such-project/agent-specs", {"agent_id": "x"})
    assert_error(hidden, 404, "not_found")
    same_answer(hidden, missing)


# --- sessions ---------------------------------------------------------------------------------


def test_post_session_answers_201_with_an_id_and_a_null_head(team, owner_api, member_api):
    assert owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "bot"}).status_code == 201
    r = member_api.post("/api/projects/alpha/sessions", {"title": "Plan the trip", "agent_id": "bot"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert SESSION_KEYS <= set(body)
    assert body["head"] is None
    assert isinstance(body["id"], str) and body["id"]
    assert body["project"] == "alpha" and body["title"] == "Plan the trip" and body["agent_id"] == "bot"
    assert body["parent_session"] is None

    fetched = member_api.get(f"/api/sessions/{body['id']}")
    assert fetched.status_code == 200
    assert {k: fetched.json()[k] for k in SESSION_KEYS} == {k: body[k] for k in SESSION_KEYS}


def test_post_session_without_an_agent_id_or_title_is_fine(member_api):
    r = member_api.post("/api/projects/alpha/sessions", {})
    assert r.status_code == 201, r.content
    assert r.json()["agent_id"] is None and r.json()["head"] is None


def test_it_rejects_a_session_with_an_unknown_agent_id_with_404(member_api):
    with nothing_written():
        r = member_api.post("/api/projects/alpha/sessions", {"title": "x", "agent_id": "nobody"})
        assert_error(r, 404, "unknown_agent_id")


def test_another_projects_agent_id_is_unknown_here(team, api_as, member_api):
    assert api_as(team.outsider).post("/api/projects/beta/agent-specs", {"agent_id": "theirs"}).status_code == 201
    with nothing_written():
        theirs = member_api.post("/api/projects/alpha/sessions", {"agent_id": "theirs"})
        nobody = member_api.post("/api/projects/alpha/sessions", {"agent_id": "theirs"[::-1]})
    assert_error(theirs, 404, "unknown_agent_id")
    assert nobody.status_code == theirs.status_code


BAD_SESSION_BODIES = {
    "malformed-json": ('{"title": ', 400),
    "array": ("[1]", 422),
    "title-not-a-string": ('{"title": 7}', 422),
    "title-too-long": ('{"title": "' + "t" * 201 + '"}', 422),
    "agent-id-null": ('{"agent_id": null}', 422),
    "agent-id-not-a-string": ('{"agent_id": ["bot"]}', 422),
    "unknown-field": ('{"title": "x", "head": "abc"}', 422),
}


@pytest.mark.parametrize("raw,status", list(BAD_SESSION_BODIES.values()), ids=list(BAD_SESSION_BODIES))
def test_it_rejects_a_bad_session_body_and_creates_nothing(member_api, raw, status):
    with nothing_written():
        assert_error(member_api.post("/api/projects/alpha/sessions", raw=raw), status)


def test_a_viewer_cannot_open_a_session(team, api_as):
    with nothing_written():
        assert_error(api_as(team.viewer).post("/api/projects/alpha/sessions", {"title": "x"}), 403, "forbidden")


def test_opening_a_session_in_someone_elses_project_answers_like_a_missing_project(member_api):
    with nothing_written():
        hidden = member_api.post("/api/projects/beta/sessions", {"title": "x"})
        missing = member_api.post("/api/projects/nope/sessions", {"title": "x"})
    assert_error(hidden, 404, "not_found")
    same_answer(hidden, missing)


def test_every_member_of_the_project_can_read_a_session(team, api_as, session_id):
    for person in (team.viewer, team.member, team.maintainer, team.owner):
        assert api_as(person).get(f"/api/sessions/{session_id}").json()["id"] == session_id


def test_someone_elses_session_answers_byte_for_byte_like_a_missing_one(team, api_as, outsiders_session):
    member = api_as(team.member)
    hidden = member.get(f"/api/sessions/{outsiders_session}")
    missing = member.get(f"/api/sessions/{new_id()}")
    assert_error(hidden, 404, "not_found")
    same_answer(hidden, missing)
    assert outsiders_session not in hidden.content.decode()
    # …and nothing about it leaks through its events either
    same_answer(member.get(f"/api/sessions/{outsiders_session}/events"), member.get(f"/api/sessions/{new_id()}/events"))


@pytest.mark.parametrize("sid", ["a%00b", "x" * 500, "..", "%27%20OR%201=1--"], ids=["nul", "long", "dots", "sql"])
def test_odd_session_ids_are_refused_cleanly(member_api, sid):
    r = member_api.get(f"/api/sessions/{sid}")
    assert_error(r, r.status_code)
    assert r.status_code in (400, 404)


# --- turns ------------------------------------------------------------------------------------


def test_post_turn_answers_202_with_execution_id_status_and_version(member_api, session_id):
    r = member_api.post(f"/api/sessions/{session_id}/turns", {"prompt": "hello"})
    assert r.status_code == 202, r.content
    body = r.json()
    assert {"execution_id", "status", "version"} <= set(body)
    assert isinstance(body["execution_id"], str) and body["execution_id"]
    assert body["status"] == "queued"
    assert body["version"] == 1

    execution = member_api.get(f"/api/executions/{body['execution_id']}").json()
    assert execution["id"] == body["execution_id"]
    assert execution["status"] == "queued" and execution["version"] == 1 and execution["kind"] == "user"
    assert execution["session"] == session_id


def test_a_person_s_turn_moves_the_session_head_to_its_prompt(member_api, session_id, turn):
    execution = member_api.get(f"/api/executions/{turn['execution_id']}").json()
    head = member_api.get(f"/api/sessions/{session_id}").json()["head"]
    assert head is not None and head == execution["prompt_msg"]
    prompt = Message.objects.get(pk=head)
    assert (prompt.role, prompt.text, prompt.branch_id) == ("user", "first", execution["branch"])


def test_a_turn_may_name_its_branch_by_address_or_by_name(member_api, session_id, turn):
    head = member_api.get(f"/api/sessions/{session_id}").json()["head"]
    by_address = member_api.post(f"/api/sessions/{session_id}/turns", {"prompt": "second", "branch": f"{session_id}:{head}"})
    by_name = member_api.post(f"/api/sessions/{session_id}/turns", {"prompt": "third", "branch": "main"})
    assert by_address.status_code == 202, by_address.content
    assert by_name.status_code == 202, by_name.content
    branches = {member_api.get(f"/api/executions/{r.json()['execution_id']}").json()["branch"] for r in (by_address, by_name)}
    assert branches == {member_api.get(f"/api/executions/{turn['execution_id']}").json()["branch"]}


def test_a_turn_may_pick_another_agent_spec_of_the_project(owner_api, member_api, session_id):
    assert owner_api.post("/api/projects/alpha/agent-specs", {"agent_id": "other"}).status_code == 201
    r = member_api.post(f"/api/sessions/{session_id}/turns", {"prompt": "hi", "agent_id": "other"})
    assert r.status_code == 202, r.content
    assert Job.objects.get(pk=r.json()["execution_id"]).agent_spec.agent_id == "other"


BAD_TURN_BODIES = {
    "malformed-json": ('{"prompt": "hi"', 400, "malformed_request"),
    "not-json-at-all": ("prompt=hi", 400, "malformed_request"),
    "empty-body": ("", 422, "invalid_request"),
    "null": ("null", 422, "invalid_request"),
    "array": ('["hi"]', 422, "invalid_request"),
    "missing-prompt": ("{}", 422, "invalid_request"),
    "empty-prompt": ('{"prompt": ""}', 400, "invalid_prompt"),
    "blank-prompt": ('{"prompt": " \\n\\t "}', 400, "invalid_prompt"),
    "prompt-null": ('{"prompt": null}', 422, "invalid_request"),
    "prompt-number": ('{"prompt": 42}', 422, "invalid_request"),
    "prompt-bool": ('{"prompt": true}', 422, "invalid_request"),
    "prompt-list": ('{"prompt": ["hi"]}', 422, "invalid_request"),
    "prompt-object": ('{"prompt": {"text": "hi"}}', 422, "invalid_request"),
    "prompt-too-long": (json.dumps({"prompt": "x" * 200_001}), 400, "prompt_too_long"),
    "unknown-field": ('{"prompt": "hi", "model": "gpt"}', 422, "invalid_request"),
    "branch-number": ('{"prompt": "hi", "branch": 3}', 422, "invalid_request"),
    "agent-id-list": ('{"prompt": "hi", "agent_id": ["bot"]}', 422, "invalid_request"),
    "unknown-agent-id": ('{"prompt": "hi", "agent_id": "nobody"}', 404, "unknown_agent_id"),
    "unknown-branch-name": ('{"prompt": "hi", "branch": "nobody"}', 404, "not_found"),
    "unknown-branch-address": ('{"prompt": "hi", "branch": "000000000000:000000000000"}', 404, "not_found"),
    "nul-in-branch": ('{"prompt": "hi", "branch": "a\\u0000:b"}', 404, "not_found"),  # stored text is cleaned, ids are not found
}


@pytest.mark.parametrize("raw,status,code", list(BAD_TURN_BODIES.values()), ids=list(BAD_TURN_BODIES))
def test_it_rejects_a_bad_turn_and_writes_nothing(member_api, session_id, turn, raw, status, code):
    session_before = member_api.get(f"/api/sessions/{session_id}").json()
    with nothing_written():
        assert_error(member_api.post(f"/api/sessions/{session_id}/turns", raw=raw), status, code)
    assert member_api.get(f"/api/sessions/{session_id}").json() == session_before


def test_it_rejects_a_turn_on_a_branch_of_another_session(member_api, session_id, turn):
    other = member_api.post("/api/projects/alpha/sessions", {"title": "other"}).json()["id"]
    head = member_api.get(f"/api/sessions/{session_id}").json()["head"]
    with nothing_written():
        r = member_api.post(f"/api/sessions/{other}/turns", {"prompt": "hi", "branch": f"{session_id}:{head}"})
        assert_error(r, 404, "not_found")


def test_a_branch_in_a_hidden_session_answers_like_a_missing_one(team, api_as, member_api, session_id):
    outsider = api_as(team.outsider)
    assert outsider.post("/api/projects/beta/agent-specs", {"agent_id": "x"}).status_code == 201
    hidden_sid = outsider.post("/api/projects/beta/sessions", {"agent_id": "x"}).json()["id"]
    hidden_turn = outsider.post(f"/api/sessions/{hidden_sid}/turns", {"prompt": "secret"}).json()
    hidden_head = outsider.get(f"/api/sessions/{hidden_sid}").json()["head"]
    assert hidden_turn["execution_id"] and hidden_head

    with nothing_written():
        hidden = member_api.post(f"/api/sessions/{session_id}/turns", {"prompt": "hi", "branch": f"{hidden_sid}:{hidden_head}"})
        missing = member_api.post(f"/api/sessions/{session_id}/turns", {"prompt": "hi", "branch": f"{new_id()}:{new_id()}"})
    assert_error(hidden, 404, "not_found")
    assert hidden.status_code == missing.status_code
    assert "secret" not in hidden.content.decode()


def test_a_viewer_cannot_post_a_turn(team, api_as, session_id):
    with nothing_written():
        assert_error(api_as(team.viewer).post(f"/api/sessions/{session_id}/turns", {"prompt": "hi"}), 403, "forbidden")


def test_a_turn_on_someone_elses_session_answers_byte_for_byte_like_a_missing_session(member_api, outsiders_session):
    with nothing_written():
        hidden = member_api.post(f"/api/sessions/{outsiders_session}/turns", {"prompt": "hi"})
        missing = member_api.post(f"/api/sessions/{new_id()}/turns", {"prompt": "hi"})
        hidden_bad = member_api.post(f"/api/sessions/{outsiders_session}/turns", {"prompt": ""})
        missing_bad = member_api.post(f"/api/sessions/{new_id()}/turns", {"prompt": ""})
    assert_error(hidden, 404, "not_found")
    same_answer(hidden, missing)
    same_answer(hidden_bad, missing_bad)


# --- executions -------------------------------------------------------------------------------


def test_get_execution_has_the_contract_fields(member_api, session_id, turn):
    body = member_api.get(f"/api/executions/{turn['execution_id']}").json()
    assert EXECUTION_KEYS <= set(body)
    assert body["id"] == turn["execution_id"]
    assert (body["status"], body["version"], body["kind"]) == ("queued", 1, "user")
    assert body["is_error"] is False and body["error_code"] == "" and body["parent_job"] is None
    assert body["session"] == session_id
    assert Branch.objects.get(pk=body["branch"]).session_id == session_id


def test_a_viewer_may_read_an_execution(team, api_as, turn):
    assert api_as(team.viewer).get(f"/api/executions/{turn['execution_id']}").status_code == 200


def test_someone_elses_execution_answers_byte_for_byte_like_a_missing_one(team, api_as, turn):
    outsider = api_as(team.outsider)
    hidden = outsider.get(f"/api/executions/{turn['execution_id']}")
    missing = outsider.get(f"/api/executions/{new_id()}")
    assert_error(hidden, 404, "not_found")
    same_answer(hidden, missing)


# --- events -----------------------------------------------------------------------------------


def test_events_come_in_ascending_seq_with_the_contract_fields(member_api, session_id, turn):
    r = member_api.get(f"/api/sessions/{session_id}/events", after=0)
    assert r.status_code == 200
    events = r.json()["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    for event in events:
        assert {"seq", "type", "payload", "created_at"} <= set(event)
        assert isinstance(event["type"], str) and isinstance(event["payload"], dict)
    assert [e["type"] for e in events] == ["session.created", "message.created", "job.queued"]
    assert events[2]["payload"]["job"] == turn["execution_id"]


def test_events_after_a_seq_are_only_the_later_ones(member_api, session_id, turn):
    everything = member_api.get(f"/api/sessions/{session_id}/events").json()["events"]
    assert member_api.get(f"/api/sessions/{session_id}/events", after=1).json()["events"] == everything[1:]
    last = everything[-1]["seq"]
    assert member_api.get(f"/api/sessions/{session_id}/events", after=last).json() == {"events": []}
    assert member_api.get(f"/api/sessions/{session_id}/events", after=10**30).json() == {"events": []}
    assert member_api.get(f"/api/sessions/{session_id}/events", after=-5).json()["events"] == everything


@pytest.mark.parametrize("after", ["abc", "1.5", "", "1e3"])
def test_it_rejects_a_non_integer_after_with_422(member_api, session_id, after):
    assert_error(member_api.get(f"/api/sessions/{session_id}/events", after=after), 422, "invalid_request")


def test_a_viewer_may_read_events_and_an_outsider_may_not(team, api_as, session_id):
    assert api_as(team.viewer).get(f"/api/sessions/{session_id}/events").status_code == 200
    outsider = api_as(team.outsider)
    hidden = outsider.get(f"/api/sessions/{session_id}/events", after=0)
    missing = outsider.get(f"/api/sessions/{new_id()}/events", after=0)
    assert_error(hidden, 404, "not_found")
    same_answer(hidden, missing)


# --- OpenAPI ----------------------------------------------------------------------------------


def test_the_openapi_document_describes_every_route_of_the_contract(team):
    r = Client().get("/api/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    paths = doc["paths"]
    expected = {
        ("/api/projects", "get"), ("/api/projects", "post"),
        ("/api/projects/{slug}/agent-specs", "post"),
        ("/api/projects/{slug}/sessions", "post"),
        ("/api/sessions/{sid}", "get"),
        ("/api/sessions/{sid}/turns", "post"),
        ("/api/sessions/{sid}/events", "get"),
    }
    for path, method in expected:
        assert method in paths.get(path, {}), (path, method)
    assert any(p.startswith("/api/executions/{") and "get" in ops for p, ops in paths.items())
    assert "202" in paths["/api/sessions/{sid}/turns"]["post"]["responses"]
    assert "201" in paths["/api/projects/{slug}/sessions"]["post"]["responses"]

    schemes = doc["components"]["securitySchemes"].values()
    assert any(s.get("type") == "http" and s.get("scheme") == "bearer" for s in schemes)


def test_the_openapi_input_schemas_forbid_unknown_fields(team):
    doc = Client().get("/api/openapi.json").json()
    schemas = doc["components"]["schemas"]

    def body_schema(path, method="post"):
        ref = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        return schemas[ref.rsplit("/", 1)[-1]]

    for path in ("/api/projects", "/api/projects/{slug}/agent-specs", "/api/projects/{slug}/sessions", "/api/sessions/{sid}/turns"):
        assert body_schema(path).get("additionalProperties") is False, path
    assert "prompt" in body_schema("/api/sessions/{sid}/turns")["required"]
    turn_out = schemas["TurnOut"]["properties"]
    assert {"execution_id", "status", "version"} <= set(turn_out)


# --- the published schema states the services' rules (R5's ST202) -------------------------------


def test_the_published_script_schema_refuses_what_check_script_refuses_and_accepts_the_rest(member_api):
    """``script`` as ``/api/openapi.json`` states it (what schemathesis generates agent specs
    from) says what ``check_script`` says, in the JSON Schema engine schemathesis validates with."""
    import jsonschema_rs

    from collab.provider_specs import check_script

    schema = member_api.get("/api/openapi.json").json()["components"]["schemas"]["AgentSpecIn"]["properties"]["script"]
    validator = jsonschema_rs.validator_for(schema)
    for name, script in INVALID_SCRIPTS.items():
        assert not validator.is_valid(script), name
    for script in ([], [{"text": "hi"}], [{"text": None, "sleep_ms": 5}], [{"tool_calls": [{"name": "x"}], "sleep_ms": 0}],
                   {"user": [{"text": "a"}], "task": None}, {}):
        check_script(script)
        assert validator.is_valid(script), script


def test_a_published_not_blank_pattern_means_what_strip_leaves_something_of():
    """``\\s`` differs between regex engines (ECMA's and Rust's leave out U+001C–U+001F and U+0085):
    the schema's not-blank rule is written so that it means ``value.strip() != ""`` in all of them."""
    import jsonschema_rs

    from collab.schemas import EMPTY_OR_NOT_BLANK, NOT_BLANK

    not_blank = jsonschema_rs.validator_for({"type": "string", "pattern": NOT_BLANK})
    empty_or_not_blank = jsonschema_rs.validator_for({"type": "string", "pattern": EMPTY_OR_NOT_BLANK})
    for c in map(chr, range(0x3001)):  # every str.isspace character is below U+3001
        assert not_blank.is_valid(c) == bool(c.strip()), hex(ord(c))
        assert empty_or_not_blank.is_valid(c * 2) == bool(c.strip()), hex(ord(c))
    assert empty_or_not_blank.is_valid("") and not not_blank.is_valid("")


def test_a_prompt_of_whitespace_the_schema_names_is_still_the_services_400(member_api, session_id):
    for prompt in ("\x1c", "\x85 \u3000"):
        r = member_api.post(f"/api/sessions/{session_id}/turns", {"prompt": prompt})
        assert r.status_code == 400 and r.json()["code"] == "invalid_prompt", r.content
