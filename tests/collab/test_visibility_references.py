"""A visible session that *names* a session the viewer may not see (docs/contract.md#visibility).

The creator (``member``) keeps a private session P and works in a project-wide session B that
``colleague`` (a member of the same project, not listed on P) may read. Agents cross between
them both ways: B's agent spawns a branch in P, sends P a message and hands P a task; P's agent
spawns a branch in B and sends B a message. B's event log then holds ``agent.spawned``,
``delivery.*``, ``inbox.*``, ``branch.created`` and ``message.created`` events, prompts whose
header reads ``[task from P:…]`` and executions whose caller is P. The colleague's view of B —
the events API, the socket (catch-up and live), the page (activity, transcript, holds), the
transcript route, ``read_conversation`` and the executions list — names nothing of P (no id,
branch, job, message, title or branch name) and loses no event (same ``seq``s); the creator's
view of the very same rows still names P.
"""

import json
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts.models import Membership
from collab.models import Branch, Event, HeldDelivery, Job, Message
from tests.collab.test_authorization import (
    auth_header,
    bearer_token,
    logged_in,
    run_gateway,
)
from tests.collab.test_live_events import ORIGIN, communicator, frames_through

SECRET_NAME = "plans-in-private"  # the branch B's agent spawns in P
SECRET_TITLE = "Private plans"


def join(project, user, role="member"):
    Membership.objects.create(user=user, project=project, role=role)
    return user


@pytest.fixture
def crossing(team, make_user, scripted_session):
    colleague = join(team.alpha, make_user("colleague"))
    creator, open_sid = scripted_session(team.member, [{"text": "answer"}])
    private_sid = creator.post("/api/projects/alpha/sessions", {"title": SECRET_TITLE, "agent_id": "bot"}).json()["id"]
    for sid in (open_sid, private_sid):
        assert creator.post(f"/api/sessions/{sid}/turns", {"prompt": "first"}).status_code == 202
    assert creator.patch(f"/api/sessions/{private_sid}", {"visibility": "private"}).status_code == 200
    return SimpleNamespace(colleague=colleague, creator=creator, open_sid=open_sid, private_sid=private_sid,
                           token=bearer_token(team.member))


def head(api, sid) -> str:
    return f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"


def cross(c, n: int = 0) -> None:
    """The agents of B and P reach into each other (through the gateway, as the creator); ``n``
    keeps a repeated crossing's messages apart (the same message twice is refused)."""
    b, p = head(c.creator, c.open_sid), head(c.creator, c.private_sid)

    def ok(address, tool, **arguments):
        body = run_gateway(c.token, address, tool, arguments).json()
        assert not body["is_error"], (tool, body)
        return body["details"]

    ok(b, "agent", prompt="go on in private", description=SECRET_NAME, start_from=p, run_in_background=True)
    ok(b, "send_message", to=p, message=f"a note for the private side {n}")
    ok(b, "agent", prompt=f"a task for the private side {n}", to=p)
    ok(p, "agent", prompt="from the private side", description="visible-work", start_from=b, run_in_background=True)
    ok(p, "send_message", to=b, message=f"hello from the private side {n}")


def secrets_of(c) -> set[str]:
    """Every id of P's rows, its title and the name of the branch spawned there."""
    p = c.private_sid
    return ({p, SECRET_NAME, SECRET_TITLE} | set(Branch.objects.filter(session_id=p).values_list("pk", flat=True))
            | set(Job.objects.filter(session_id=p).values_list("pk", flat=True))
            | set(Message.objects.filter(session_id=p).values_list("pk", flat=True)))


def leaked(text: str, secrets: set[str]) -> list[str]:
    return sorted(s for s in secrets if s in text)


def test_events_of_a_visible_session_name_no_session_the_viewer_cannot_see(team, api_as, crossing):
    """``GET /api/sessions/B/events`` for the colleague has every
    event of B (the same ``seq``s as the creator's) but no id, branch, job, message, title or
    branch name of P — the fields pointing there are ``null`` and the payload says
    ``"redacted": true``; the creator's log names P (the ``agent.spawned`` event into P, the
    deliveries to and from it, the prompt header ``[task from P:…]``)."""
    c = crossing
    cross(c)
    secrets = secrets_of(c)
    mine = c.creator.get(f"/api/sessions/{c.open_sid}/events").json()["events"]
    theirs = api_as(c.colleague).get(f"/api/sessions/{c.open_sid}/events").json()["events"]
    assert [e["seq"] for e in theirs] == [e["seq"] for e in mine] == list(range(1, len(mine) + 1))
    assert [e["type"] for e in theirs] == [e["type"] for e in mine]
    assert leaked(json.dumps(mine), secrets), "the creator's own log names P"
    assert leaked(json.dumps(theirs), secrets) == []
    kinds = {e["type"] for e in mine}
    assert {"agent.spawned", "delivery.sent", "delivery.received", "inbox.queued", "branch.created"} <= kinds, kinds
    spawned = [e["payload"] for e in theirs if e["type"] == "agent.spawned"]
    assert spawned and all(p["redacted"] and p["session"] is p["branch"] is p["name"] is p["start_from"] is None
                           for p in spawned), spawned
    mine_spawned = [e["payload"] for e in mine if e["type"] == "agent.spawned"]
    assert [p["session"] for p in mine_spawned] == [c.private_sid] and "redacted" not in mine_spawned[0]
    # a prompt written in B by P's agent: its header says "another session" to the colleague
    prompts = [e["payload"]["text"] for e in theirs
               if e["type"] == "message.created" and "[task from" in (e["payload"]["text"] or "")]
    assert prompts and all(t.startswith("[task from another session]") for t in prompts), prompts
    # a maintainer sees every session: nothing is blanked for them
    assert api_as(team.maintainer).get(f"/api/sessions/{c.open_sid}/events").json()["events"] == mine


def test_a_result_text_and_tool_calls_written_in_a_visible_session_name_nothing_hidden(team, api_as, crossing):
    """What a worker writes into B when P's agent reports back — a
    result headed ``[result from P:…] Agent 'plans-in-private' finished`` — and a model's tool call
    in B whose arguments name P (``agent(start_from=P:…, description=…)``): the colleague's events
    and socket name neither P nor its branch; the call keeps its name, not its arguments. The
    creator's log keeps both."""
    from django.db import transaction

    from collab.services.messages import append_message

    c = crossing
    cross(c)
    p_head = head(c.creator, c.private_sid)
    main = Branch.objects.get(session_id=c.open_sid, name="main")
    with transaction.atomic():
        append_message(main, role="user", kind="followup",
                       text=f"[result from {p_head}]\nAgent '{SECRET_NAME}' finished execution "
                            f"{Job.objects.filter(session_id=c.private_sid).values_list('pk', flat=True).first()}:\n\nall done")
        append_message(main, role="assistant", tool_calls=[
            {"id": "call-1", "name": "agent", "arguments": {"start_from": p_head, "description": SECRET_NAME}},
            {"id": "call-2", "name": "todo_list", "arguments": {}}])
    secrets = secrets_of(c)
    theirs = api_as(c.colleague).get(f"/api/sessions/{c.open_sid}/events").json()["events"]
    mine = c.creator.get(f"/api/sessions/{c.open_sid}/events").json()["events"]
    assert leaked(json.dumps(theirs), secrets) == []
    assert SECRET_NAME in json.dumps(mine) and c.private_sid in json.dumps(mine)
    result = next(e["payload"] for e in theirs if e["type"] == "message.created" and e["payload"]["kind"] == "followup")
    assert result["text"].startswith("[result from another session]") and "all done" in result["text"]
    calls = next(e["payload"]["tool_calls"] for e in theirs if e["type"] == "message.created" and e["payload"]["tool_calls"])
    assert calls[0]["name"] == "agent" and calls[0]["arguments"] == {"redacted": True}
    assert calls[1] == {"id": "call-2", "name": "todo_list", "arguments": {}}


def test_the_events_route_redacts_with_a_constant_number_of_queries(team, api_as, crossing):
    """The redaction costs the same number of queries for one crossing as for
    four (the referenced sessions are collected per page and asked about at once)."""
    c = crossing
    api = api_as(c.colleague)
    url = f"/api/sessions/{c.open_sid}/events"

    def count() -> int:
        api.get(url)  # a token records its use at most once a minute: warm it
        with CaptureQueriesContext(connection) as queries:
            assert api.get(url).status_code == 200
        return len(queries.captured_queries)

    cross(c)
    once = count()
    for n in range(1, 4):
        cross(c, n)
    assert count() == once


def test_the_session_page_and_transcripts_name_no_session_the_viewer_cannot_see(team, api_as, crossing):
    """The colleague's session page of B (activity panel, transcript of the
    branch P's agent spawned in B, with its ``spawn_remote`` badge), the transcript route,
    ``read_conversation`` by the colleague's own agent and ``GET /api/executions`` show nothing
    of P: the prompt header reads ``[task from another session]``, ``caller_session`` is
    ``null``. The creator's views of the same rows name P."""
    c = crossing
    cross(c)
    secrets = secrets_of(c)
    spawned_here = Branch.objects.get(session_id=c.open_sid, name="visible-work")
    page_url = reverse("collab:session", args=[c.open_sid]) + f"?branch={spawned_here.pk}"
    theirs = logged_in(c.colleague).get(page_url)
    assert theirs.status_code == 200
    body = theirs.content.decode()
    # the prompt is a card: who started the agent stays, unnamed and unlinked
    assert "an agent you cannot see" in body and "from the private side" in body
    assert leaked(body, secrets) == []
    mine = logged_in(team.member).get(page_url).content.decode()
    assert c.private_sid in mine and "an agent you cannot see" not in mine and SECRET_NAME in mine

    transcript = f"/api/branches/{spawned_here.address}/transcript"
    seen = api_as(c.colleague).get(transcript)
    assert seen.status_code == 200 and "[task from another session]" in seen.json()["text"]
    assert leaked(seen.content.decode(), secrets) == []
    assert c.private_sid in c.creator.get(transcript).content.decode()

    executions = api_as(c.colleague).get("/api/executions", session=c.open_sid).json()
    assert {e["caller_session"] for e in executions} <= {c.open_sid, None}
    assert leaked(json.dumps(executions), secrets) == []
    assert c.private_sid in {e["caller_session"] for e in c.creator.get("/api/executions", session=c.open_sid).json()}

    # the colleague's own agent reads B's spawned branch: the same redaction
    api = api_as(c.colleague)
    own_sid = api.post("/api/projects/alpha/sessions", {"title": "colleague's", "agent_id": "bot"}).json()["id"]
    assert api.post(f"/api/sessions/{own_sid}/turns", {"prompt": "p"}).status_code == 202
    read = run_gateway(bearer_token(c.colleague), head(api, own_sid), "read_conversation",
                       {"session_id": spawned_here.address}).json()
    assert not read["is_error"] and "[task from another session]" in read["text"], read
    assert leaked(json.dumps(read), secrets) == []


def test_a_held_delivery_to_a_hidden_session_is_shown_without_its_name(team, api_as, crossing):
    """Under the ``confirm_deliveries`` watch policy, B's agent sends a branch of
    P a message; the hold listed on B's page names the target for the creator and says "another
    session" to the colleague; ``GET /api/sessions/B/holds`` gives the colleague ``"to": null``
    and the creator the address; the ``delivery.held`` event is blanked the same way."""
    c = crossing
    b = head(c.creator, c.private_sid)
    spawned = run_gateway(c.token, b, "agent", {"prompt": "wait here", "description": "secret-target",
                                                "run_in_background": True}).json()
    assert not spawned["is_error"], spawned
    target = Branch.objects.get(session_id=c.private_sid, name="secret-target")
    assert api_as(team.owner).patch("/api/projects/alpha", {"watch_policy": "confirm_deliveries"}).status_code == 200
    sent = run_gateway(c.token, head(c.creator, c.open_sid), "send_message",
                       {"to": target.address, "message": "held for the private side"}).json()
    assert sent["details"].get("held"), sent
    assert HeldDelivery.objects.filter(sender_session_id=c.open_sid, status="pending", target_branch=target).exists()
    target_name = target.display_name
    url = reverse("collab:session", args=[c.open_sid])
    body = logged_in(c.colleague).get(url).content.decode()
    assert "to another session" in body and "held for the private side" in body
    assert leaked(body, secrets_of(c) | {target_name}) == []
    assert f"to {target_name}" in logged_in(team.member).get(url).content.decode()
    listed = api_as(c.colleague).get(f"/api/sessions/{c.open_sid}/holds").json()
    assert [h["to"] for h in listed] == [None] and leaked(json.dumps(listed), secrets_of(c)) == []
    assert [h["to"] for h in c.creator.get(f"/api/sessions/{c.open_sid}/holds").json()] == [target.address]
    held = [e for e in api_as(c.colleague).get(f"/api/sessions/{c.open_sid}/events").json()["events"]
            if e["type"] == "delivery.held"]
    assert held and held[0]["payload"]["to"] is None and held[0]["payload"]["target_branch"] is None


def test_the_socket_names_no_session_the_viewer_cannot_see(transactional_db, team, crossing):
    """The colleague's socket on B, caught up from ``after=0`` and
    then live while the agents cross, carries every ``seq`` of B without a gap and nothing of
    P; the creator's socket, over the same events, names P."""
    c = crossing
    start = Event.objects.filter(session_id=c.open_sid).count()
    colleague_token = bearer_token(c.colleague)  # not on the loop below

    async def body():
        theirs = communicator(c.open_sid, 0, [ORIGIN, auth_header(colleague_token)])
        mine = communicator(c.open_sid, 0, [ORIGIN, auth_header(c.token)])
        assert (await theirs.connect())[0] and (await mine.connect())[0]
        await frames_through(theirs, start)
        await frames_through(mine, start)
        await sync_to_async(cross)(c)
        last = await sync_to_async(lambda: Event.objects.filter(session_id=c.open_sid).count())()
        got = await frames_through(theirs, last), await frames_through(mine, last)
        await theirs.disconnect()
        await mine.disconnect()
        return got

    theirs, mine = async_to_sync(body)()
    assert [f["seq"] for f in theirs] == [f["seq"] for f in mine] == list(range(start + 1, start + len(mine) + 1))
    secrets = secrets_of(c)
    assert leaked(json.dumps(mine), secrets)
    assert leaked(json.dumps(theirs), secrets) == [], json.dumps([f for f in theirs if leaked(json.dumps(f), secrets)])
    assert any(f["type"] == "agent.spawned" and f["payload"].get("redacted") for f in theirs)


@pytest.mark.slow
def test_a_listing_written_into_a_visible_session_names_no_hidden_session(team, api_as, make_user,
                                                                                  scripted_session, worker):
    """With a real worker: the creator's agent in project-wide B lists every
    agent (``list_agents(scope="all")``), which names the creator's private session P by id and
    title in B's transcript. The colleague's session page of B and the transcript route show the
    listing with "another session" in place of P's id and title; the creator's show P. The
    ``agents.listed`` event's ``session_ids`` and ``sessions`` count leave P out for the
    colleague (without a ``redacted`` mark: a count must not tell that something is hidden)."""
    colleague = join(team.alpha, make_user("colleague"))
    creator, open_sid = scripted_session(team.member, [
        {"tool_calls": [{"name": "list_agents", "arguments": {"scope": "all"}}]}, {"text": "listed"}], agent_id="lister")
    private_sid = creator.post("/api/projects/alpha/sessions", {"title": SECRET_TITLE, "agent_id": "lister"}).json()["id"]
    assert creator.patch(f"/api/sessions/{private_sid}", {"visibility": "private"}).status_code == 200
    first = creator.post(f"/api/sessions/{private_sid}/turns", {"prompt": "private work"}).json()
    assert creator.wait(first["execution_id"], timeout=60)["status"] == "succeeded"
    turn = creator.post(f"/api/sessions/{open_sid}/turns", {"prompt": "who is there?"}).json()
    assert creator.wait(turn["execution_id"], timeout=60)["status"] == "succeeded"
    listing = Message.objects.get(job_id=turn["execution_id"], role="tool")
    assert private_sid in listing.text and SECRET_TITLE in listing.text  # the stored row is the agent's
    page_url = reverse("collab:session", args=[open_sid])
    transcript = f"/api/branches/{head(creator, open_sid)}/transcript"
    for client_get, api in ((logged_in(colleague).get, api_as(colleague)), (logged_in(team.member).get, creator)):
        body = client_get(page_url).content.decode() + api.get(transcript).content.decode()
        named = private_sid in body or SECRET_TITLE in body
        assert named is (api is creator), ("creator" if api is creator else "colleague", named)
        assert "listed" in body and open_sid in body
    # the agents.listed event: the colleague's count leaves P out, silently; the creator's has it
    listed = {who: [e["payload"] for e in api.get(f"/api/sessions/{open_sid}/events").json()["events"]
                    if e["type"] == "agents.listed"][0] for who, api in (("colleague", api_as(colleague)), ("creator", creator))}
    assert private_sid in listed["creator"]["session_ids"]
    assert listed["colleague"]["session_ids"] == [s for s in listed["creator"]["session_ids"] if s != private_sid]
    assert listed["colleague"]["sessions"] == listed["creator"]["sessions"] - 1
    assert "redacted" not in listed["colleague"]
