"""MCP elicitation (docs/api.md#trellis-as-an-mcp-server, ``collab.mcp_server``): while an MCP
client's call waits (``job_output`` with ``block``), an ``ask_person`` question of its session
that its person may answer comes to it as an ``elicitation/create`` request — when it declared
``elicitation`` and its token may decide (``holds``) — and its answer decides the question once,
whichever process takes it, racing the web inbox safely. Through the official SDK's own client
against a real daphne and a worker."""

import asyncio

import httpx
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from accounts.models import TokenScope
from collab.models import Job, PersonAsk
from tests.collab.test_mcp import head_address, token
from tests.collab.test_people_in_the_loop import ASK  # "Which colour?" red/blue, then "the person said …"
from tests.conftest import poll

pytestmark = pytest.mark.slow

WAIT_MS = 60_000


def call_waiting(server, raw_token: str, address: str, eid: str, on_elicit=None, timeout_ms: int = WAIT_MS):
    """``job_output(eid, block=true)`` over the SDK's client (with ``on_elicit`` as its elicitation
    callback: it then declares the capability): the call's result."""

    async def main():
        headers = {"Authorization": f"Bearer {raw_token}", "X-Trellis-Branch": address}
        async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60, read=120)) as http:
            async with streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write, _):
                async with ClientSession(read, write, elicitation_callback=on_elicit) as session:
                    await session.initialize()
                    return await session.call_tool("job_output", {"job_id": eid, "block": True, "timeout": timeout_ms})

    return asyncio.run(main())


def answering(asked: list, answer: str):
    """An elicitation callback that notes each question put in ``asked`` and accepts ``answer``."""
    async def on_elicit(context, params):
        asked.append(params)
        return types.ElicitResult(action="accept", content={"answer": answer})
    return on_elicit


def _waiting(api, sid) -> tuple[str, str]:
    address, eid = head_address(api, sid)
    assert api.wait(eid, statuses={"waiting"})["status"] == "waiting"
    return address, eid


def test_a_question_comes_to_a_client_that_takes_elicitations_and_its_answer_decides_it(
        team, scripted_session, server, worker):
    api, sid = scripted_session(team.member, ASK)
    address, eid = _waiting(api, sid)
    asked = []
    on_elicit = answering(asked, "blue")

    output = call_waiting(server, token(team.member), address, eid, on_elicit)
    assert not output.isError and output.content[0].text == "the person said blue", output
    (params,) = asked  # put once, though the call waited on
    assert "bot asks you (test › main)" in params.message and params.message.endswith("Which colour?")
    assert params.requestedSchema["properties"]["answer"]["enum"] == ["red", "blue"]
    ask = PersonAsk.objects.get(job_id=eid)
    assert (ask.status, ask.decided_by_id, ask.decision) == ("answered", team.member.pk, {"answer": "blue"})
    events = [e["payload"] for e in api.get(f"/api/sessions/{sid}/events").json()["events"]
              if e["type"] == "question.answered"]
    assert [(e["decision"], e["by"]) for e in events] == [("answered", "member")]


def test_a_declined_elicitation_rejects_the_question(team, scripted_session, server, worker):
    api, sid = scripted_session(team.member, ASK)
    address, eid = _waiting(api, sid)

    async def on_elicit(context, params):
        return types.ElicitResult(action="decline")

    output = call_waiting(server, token(team.member), address, eid, on_elicit)
    assert output.content[0].text == "the person said rejected: declined in the MCP client", output
    assert PersonAsk.objects.get(job_id=eid).status == "rejected"


def test_when_the_inbox_decides_first_the_clients_answer_changes_nothing(team, scripted_session, server, worker):
    api, sid = scripted_session(team.member, ASK)
    address, eid = _waiting(api, sid)
    ask = PersonAsk.objects.get(job_id=eid)

    async def on_elicit(context, params):  # the person answers in the web inbox before the client does
        r = await asyncio.to_thread(api.post, f"/api/inbox/{ask.pk}", {"decision": "answer", "answer": "red"})
        assert r.status_code == 200, r.content
        return types.ElicitResult(action="accept", content={"answer": "blue"})

    output = call_waiting(server, token(team.member), address, eid, on_elicit)
    assert output.content[0].text == "the person said red", output
    ask.refresh_from_db()
    assert (ask.status, ask.decision) == ("answered", {"answer": "red"})
    assert Job.objects.get(pk=eid).model_calls == 2  # resumed once


def test_no_question_is_put_to_a_client_that_did_not_declare_it_or_whose_token_may_not_decide(
        team, scripted_session, server):
    api, sid = scripted_session(team.member, ASK)
    address, eid = _waiting(api, sid)
    asked = []
    on_elicit = answering(asked, "blue")

    undeclared = call_waiting(server, token(team.member), address, eid, timeout_ms=1_500)
    narrow = token(team.member, scopes=[s for s in TokenScope.values if s != TokenScope.HOLDS])
    no_holds = call_waiting(server, narrow, address, eid, on_elicit, timeout_ms=1_500)
    for output in (undeclared, no_holds):
        assert output.content[0].text == f"job {eid} is still waiting", output
    assert asked == [] and PersonAsk.objects.get(job_id=eid).status == "pending"

    # an answer posted by hand is refused without the scope, and for a question one may not decide
    answer = {"jsonrpc": "2.0", "id": f"trellis-ask:{PersonAsk.objects.get(job_id=eid).pk}",
              "result": {"action": "accept", "content": {"answer": "blue"}}}
    headers = {"Accept": "application/json, text/event-stream", "X-Trellis-Branch": address}
    refused = httpx.post(f"{server.url}/mcp", json=answer, timeout=30,
                         headers={**headers, "Authorization": f"Bearer {narrow}"})
    assert refused.status_code == 403 and refused.json()["code"] == "token_scope"
    unknown = httpx.post(f"{server.url}/mcp", json={**answer, "id": "trellis-ask:nosuchask"}, timeout=30,
                         headers={**headers, "Authorization": f"Bearer {token(team.member)}"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"
    assert PersonAsk.objects.get(job_id=eid).status == "pending"
    accepted = httpx.post(f"{server.url}/mcp", json=answer, timeout=30,
                          headers={**headers, "Authorization": f"Bearer {token(team.member)}"})
    assert accepted.status_code == 202 and accepted.content == b""
    assert poll(lambda: PersonAsk.objects.get(job_id=eid).status == "answered", what="the answer recorded")
