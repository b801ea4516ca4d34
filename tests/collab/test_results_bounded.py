"""Results bounded everywhere (docs/contract.md#results).

Every tool result — not only ``job_output`` — passes the one bounded summary
(``collab.services.results.bound_text``, applied once in the tool registry): at most
30,000 characters (less for a model with a small context window), head and tail around a
marker; the details say it was cut. Through the tool gateway and a real worker turn, on
PostgreSQL and SQLite.
"""

import pytest

from collab.models import Message
from collab.services.results import RESULT_LIMIT

MARKER = "characters omitted"
LONG = 150_000


@pytest.fixture
def long_branch(team, api_as):
    """A member's session whose branch holds a 150k-character prompt (queued turn, no worker)."""
    owner, api = api_as(team.owner), api_as(team.member)
    assert owner.post("/api/projects/alpha/agent-specs", {"agent_id": "bot"}).status_code == 201
    assert owner.post("/api/projects/alpha/agent-specs", {
        "agent_id": "small", "limits": {"context_window": 4000}}).status_code == 201
    sid = api.post("/api/projects/alpha/sessions", {"title": "long", "agent_id": "bot"}).json()["id"]
    prompt = "head-of-it " + "x" * (LONG - 30) + " tail-of-it"
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).status_code == 202
    head = api.get(f"/api/sessions/{sid}").json()["head"]
    return api, sid, f"{sid}:{head}"


def test_a_150k_read_conversation_is_bounded_with_its_marker(long_branch):
    """read_conversation(max_chars=200000) over a 150k-character branch answers
    at most 30,000 characters, head and tail kept around the marker, ``details.truncated``;
    the large ``turns`` detail is left out (named in ``details_omitted``)."""
    api, sid, address = long_branch
    body = api.post(f"/api/branches/{address}/tools/read_conversation",
                    {"arguments": {"session_id": address, "max_chars": 200_000}}).json()
    assert not body["is_error"], body["text"][:300]
    assert len(body["text"]) <= RESULT_LIMIT
    assert MARKER in body["text"] and "head-of-it" in body["text"] and "tail-of-it" in body["text"]
    assert body["details"]["truncated"] is True and body["details"]["full_length"] > LONG
    assert "turns" in body["details"]["details_omitted"]
    assert body["details"]["session_id"] == sid  # small details stay


def test_the_bound_follows_the_reading_model_s_context_window(long_branch, team, api_as):
    """The bound is lower when the model's context is small: a branch whose spec declares a
    4,000-token window reads at most 4,000 characters of any tool result."""
    api, sid, address = long_branch
    other = api.post("/api/projects/alpha/sessions", {"title": "small", "agent_id": "small"}).json()["id"]
    assert api.post(f"/api/sessions/{other}/turns", {"prompt": "hi"}).status_code == 202
    me = f"{other}:{api.get(f'/api/sessions/{other}').json()['head']}"
    body = api.post(f"/api/branches/{me}/tools/read_conversation",
                    {"arguments": {"session_id": address, "max_chars": 200_000}}).json()
    assert len(body["text"]) <= 4000 and MARKER in body["text"] and body["details"]["truncated"]


def test_a_long_listing_is_bounded_too(long_branch):
    """list_jobs, todo_list, list_agents: listings of any length stay within the bound."""
    api, sid, address = long_branch
    for i in range(120):
        r = api.post(f"/api/branches/{address}/tools/todo_create", {"arguments": {"subject": f"{i:03d} " + "s" * 290}})
        assert not r.json()["is_error"]
    body = api.post(f"/api/branches/{address}/tools/todo_list", {"arguments": {}}).json()
    assert len(body["text"]) <= RESULT_LIMIT and MARKER in body["text"] and body["details"]["truncated"]
    assert "000 sss" in body["text"] and "119 sss" in body["text"]  # head and tail kept


@pytest.mark.slow
def test_a_turn_stores_its_tool_results_bounded(team, api_as, run_queued):
    """In a real worker turn, the tool-result node of a 150k read_conversation is the
    bounded summary (what the model reads is what is stored)."""
    owner, api = api_as(team.owner), api_as(team.member)
    assert owner.post("/api/projects/alpha/agent-specs", {"agent_id": "long", "script": [{"text": "ok"}]}).status_code == 201
    assert owner.post("/api/projects/alpha/agent-specs", {"agent_id": "reader", "script": [
        {"tool_calls": [{"name": "read_conversation",
                         "arguments": {"session_id": "{{prompt}}", "max_chars": 200_000}}]},
        {"text": "read it"}]}).status_code == 201
    sid = api.post("/api/projects/alpha/sessions", {"title": "long", "agent_id": "long"}).json()["id"]
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "y" * LONG})
    first = api.wait(r.json()["execution_id"], timeout=60)
    assert first["status"] == "succeeded", first
    address = f"{sid}:{first['prompt_msg']}"
    reader = api.post("/api/projects/alpha/sessions", {"title": "reader", "agent_id": "reader"}).json()["id"]
    done = api.wait(api.post(f"/api/sessions/{reader}/turns", {"prompt": address}).json()["execution_id"], timeout=60)
    assert done["status"] == "succeeded", done
    result = Message.objects.get(job_id=done["id"], role="tool")
    assert len(result.text) <= RESULT_LIMIT and MARKER in result.text
    assert result.metadata["details"]["truncated"] is True
