"""Row-level visibility where control and history are concerned (docs/contract.md#visibility).

* Cancelling an execution is decided by the effective role in its session (``collab.access.
  require_can_cancel``), not the project role: a member whose share was narrowed to viewer
  cannot cancel even what they started; one who may not see the session gets the 404 of a
  missing id.
* The audit view and its export leave out events of sessions the reader may not see. Who may
  read the audit (``project.audit``) sees every session by design (``session.see_all``, both
  maintainer), so the route is shown with ``session.see_all`` raised to owner (a maintainer who
  reads the audit but does not see a private session), and the selector with a member.
* A real worker turn loses access mid-turn: its next tool call is "not found".
"""

import json

import pytest
from django.urls import reverse

from accounts.models import Membership, Role
from accounts.policy import CAPABILITIES
from collab.errors import NotFound
from collab.models import Event, ExecutionCommand, Job, Message, Session
from collab.models.ids import new_id
from collab.selectors.audit import project_events
from collab.services.cancel import do_execution_command
from tests.collab.test_authorization import logged_in


def join(project, user, role="member"):
    Membership.objects.create(user=user, project=project, role=role)
    return user


def cancel(api, job_id: str, version: int, command_id: str):
    return api.post(f"/api/executions/{job_id}/commands", {
        "command_id": command_id, "action": "execution.cancel", "expected_version": version, "payload": {}})


# --- cancel -------------------------------------------------------------------------------


def test_cancel_follows_the_effective_role_in_the_session(team, api_as, make_user, scripted_session):
    """Cancel by session role: ``friend`` (a project member) starts a turn in a session
    shared with them as member. Narrowed to viewer, they cannot cancel it (403) although they
    started it; a member nobody listed gets the 404 of a missing id (and the service refuses
    them the same way, without the route's lookup); with the session private, the friend too
    gets that 404; shared back as member, the friend cancels it (202)."""
    friend = join(team.alpha, make_user("friend"))
    colleague = join(team.alpha, make_user("colleague"))
    creator, sid = scripted_session(team.member, [{"text": "x"}])
    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "shared"}).status_code == 200
    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "member"}).status_code == 201
    friend_api = api_as(friend)
    eid = friend_api.post(f"/api/sessions/{sid}/turns", {"prompt": "mine"}).json()["execution_id"]
    version = friend_api.get(f"/api/executions/{eid}").json()["version"]

    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "viewer"}).status_code == 201
    assert friend_api.get(f"/api/executions/{eid}").status_code == 200  # still reads it
    refused = cancel(friend_api, eid, version, "as-viewer")
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden", refused.content
    assert "viewer" in refused.json()["detail"]

    colleague_api = api_as(colleague)
    missing = new_id()
    seen, gone = cancel(colleague_api, eid, version, "c1"), cancel(colleague_api, missing, version, "c1")
    assert seen.status_code == gone.status_code == 404 and seen.json() == gone.json()
    with pytest.raises(NotFound):
        do_execution_command(colleague, Job.objects.get(pk=eid), command_id="c2", action="execution.cancel",
                             expected_version=version, payload={})

    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "private"}).status_code == 200
    seen, gone = cancel(friend_api, eid, version, "f1"), cancel(friend_api, missing, version, "f1")
    assert seen.status_code == gone.status_code == 404 and seen.json() == gone.json()
    assert Job.objects.get(pk=eid).status == "queued" and not ExecutionCommand.objects.filter(job_id=eid).exists()

    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "shared"}).status_code == 200
    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "member"}).status_code == 201
    ok = cancel(friend_api, eid, version, "as-member")
    assert ok.status_code == 202, ok.content
    assert Job.objects.get(pk=eid).status == "cancelled"


# --- audit --------------------------------------------------------------------------------


@pytest.fixture
def private_and_open(team, api_as, make_user, scripted_session):
    """The member's private session and a project-wide one, each with a turn's events, and a
    project-level event (an invitation)."""
    make_user("invitee")
    assert api_as(team.owner).post("/api/projects/alpha/members", {"username": "invitee"}).status_code == 201
    creator, open_sid = scripted_session(team.member, [{"text": "x"}])
    private_sid = creator.post("/api/projects/alpha/sessions", {"title": "Private audit", "agent_id": "bot"}).json()["id"]
    for sid in (open_sid, private_sid):
        assert creator.post(f"/api/sessions/{sid}/turns", {"prompt": "p"}).status_code == 202
    assert creator.patch(f"/api/sessions/{private_sid}", {"visibility": "private"}).status_code == 200
    assert Event.objects.filter(project=team.alpha, session=None).exists()  # member.invited
    return open_sid, private_sid


def sessions_in(events) -> set:
    return {e.session_id for e in events}


def test_the_audit_selector_leaves_out_events_of_sessions_the_reader_cannot_see(team, make_user,
                                                                                       private_and_open):
    """The audit filtered in the query, at the selector: for a member who may not see the
    private session, ``project_events`` has the project-wide session's events and the
    project-level ones, none of the private session's — also when asked for it by id; its
    creator and a maintainer get all of them."""
    open_sid, private_sid = private_and_open
    colleague = join(team.alpha, make_user("colleague"))
    theirs = list(project_events(team.alpha, viewer=colleague))
    assert sessions_in(theirs) == {open_sid, None}
    assert list(project_events(team.alpha, viewer=colleague, session=private_sid)) == []
    for user in (team.member, team.maintainer):
        assert sessions_in(project_events(team.alpha, viewer=user)) == {open_sid, private_sid, None}


def test_the_audit_view_and_export_leave_out_sessions_the_reader_cannot_see(team, monkeypatch,
                                                                                   private_and_open):
    """The audit view and export: with ``session.see_all`` raised to owner, the maintainer
    still reads ``/p/alpha/audit`` but no longer sees the private session (its page is 404):
    neither the audit page nor its JSON-lines export (nor the export filtered by its id)
    lists an event of it, while the owner's export has them."""
    open_sid, private_sid = private_and_open
    monkeypatch.setitem(CAPABILITIES, "session.see_all", Role.OWNER)
    maintainer = logged_in(team.maintainer)
    assert maintainer.get(reverse("collab:session", args=[private_sid])).status_code == 404
    url = reverse("collab:audit", args=["alpha"])

    def export(client, **filters) -> list[dict]:
        r = client.get(url, {"format": "jsonl", **filters})
        assert r.status_code == 200
        return [json.loads(line) for line in b"".join(r.streaming_content).decode().splitlines()]

    lines = export(maintainer)
    assert {e["session"] for e in lines} == {open_sid, None}
    assert export(maintainer, session=private_sid) == []
    page = maintainer.get(url)
    assert page.status_code == 200
    assert open_sid in page.content.decode() and private_sid not in page.content.decode()
    assert {e["session"] for e in export(logged_in(team.owner))} == {open_sid, private_sid, None}


# --- a running turn loses access ------------------------------------------------------------


def tool_results(job_id: str) -> list[Message]:
    return list(Message.objects.filter(job_id=job_id, role="tool").order_by("depth"))


def outcome(m: Message) -> str:
    return m.metadata["details"].get("code") or "error" if m.metadata["is_error"] else "ok"


@pytest.mark.slow
@pytest.mark.parametrize("made_private", ["read", "acting"])
def test_a_running_turn_that_loses_access_is_refused_at_its_next_tool_call(
        team, api_as, make_user, scripted_session, worker, made_private):
    """Running turns refused at their next read, with a real worker: member
    M's turn in the creator's project-wide session S reads the creator's session T, then waits
    on a background agent it started (``job_output``, blocked until the test cancels that
    agent). Meanwhile the creator makes T private (``read``) — or S itself (``acting``). Once
    released, the turn's next calls get "not found": ``read_conversation`` of T (``read``:
    and ``list_agents(scope="all")`` no longer lists T), or every call (``acting``:
    ``Actor.require_standing`` re-reads S's row). Every wait polls a state; nothing sleeps."""
    from tests.conftest import poll

    colleague = join(team.alpha, make_user("m"))
    creator, target = scripted_session(team.member, [{"text": "target answer"}], agent_id="target-bot")
    first = creator.post(f"/api/sessions/{target}/turns", {"prompt": "target secret prompt"}).json()
    assert creator.wait(first["execution_id"], timeout=60)["status"] == "succeeded"
    steps = {
        "user": [
            {"tool_calls": [{"name": "agent", "arguments": {"prompt": "hold on", "description": "gate",
                                                            "run_in_background": True}},
                            {"name": "read_conversation", "arguments": {"session_id": target}}]},
            {"tool_calls": [{"name": "job_output", "arguments": {"job_id": "{{last.details.execution_id}}",
                                                                 "block": True, "timeout": 600_000}}]},
            {"tool_calls": [{"name": "read_conversation", "arguments": {"session_id": target}},
                            {"name": "list_agents", "arguments": {"scope": "all"}}]},
            {"text": "done"},
        ],
        "spawn": [{"sleep_ms": 600_000}],
    }
    _, acting = scripted_session(team.member, steps, agent_id="mid-bot")
    m_api = api_as(colleague)
    turn = m_api.post(f"/api/sessions/{acting}/turns", {"prompt": "look"})
    assert turn.status_code == 202, turn.content
    eid = turn.json()["execution_id"]

    def parked():
        """The gate agent runs and the turn has called job_output on it (its step 1 is done)."""
        gate = Job.objects.filter(parent_job_id=eid, kind="spawn").first()
        waiting = Message.objects.filter(job_id=eid, role="assistant", tool_calls__0__name="job_output").exists()
        return gate if gate is not None and gate.status == "running" and waiting and len(tool_results(eid)) == 2 else None

    gate = poll(parked, timeout=90, what="the turn waiting on its gate agent")
    assert [outcome(m) for m in tool_results(eid)] == ["ok", "ok"]
    assert "target secret prompt" in tool_results(eid)[1].text
    changed = target if made_private == "read" else acting
    assert creator.patch(f"/api/sessions/{changed}", {"visibility": "private"}).status_code == 200
    maintainer = api_as(team.maintainer)
    released = cancel(maintainer, gate.pk, maintainer.get(f"/api/executions/{gate.pk}").json()["version"], "release")
    assert released.status_code == 202, released.content
    assert maintainer.wait(eid, timeout=90)["status"] in ("succeeded", "failed")

    results = tool_results(eid)
    assert [m.metadata["tool"] for m in results] == ["agent", "read_conversation", "job_output",
                                                    "read_conversation", "list_agents"]
    after = [outcome(m) for m in results[3:]]
    if made_private == "read":
        assert outcome(results[2]) == "ok"  # S is unchanged: waiting on its own agent is fine
        assert after == ["not_found", "ok"], after
        assert target not in results[4].text and "target secret prompt" not in results[3].text
    else:
        # job_output was called before the change, or (a race of milliseconds) just after it
        assert outcome(results[2]) in ("ok", "not_found")
        assert after == ["not_found", "not_found"], after
    assert Session.objects.get(pk=target).jobs.count() == 1  # the turn wrote nothing into T
