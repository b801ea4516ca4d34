"""Where the two toolsets meet: an OpenWork sub-agent is directed by its parent alone (SPEC §5,
OW §3) — other agents can read it, not give it work — and it is not listed at the top level
(OW acc. 2), through the collab tools as through the pages."""

from collab.models import Branch, Job


def ow_child(scripted_session, team):
    """An OpenWork session with one explorer (its first turn queued: no worker here)."""
    api, sid = scripted_session(team.member, [], agent_id="ow", toolset="openwork")
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).status_code == 202
    address = f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"
    r = api.post(f"/api/branches/{address}/tools/spawn_agent", {"arguments": {"task_name": "scout", "message": "look"}})
    assert r.status_code == 200 and not r.json()["is_error"], r.content
    child = Branch.objects.get(task_name="scout")
    return api, sid, child


def test_ow_a_collab_agent_cannot_deliver_work_to_someone_elses_sub_agent(team, scripted_session):
    """SPEC §5: send_message and agent(to=…) aimed at a sub-agent (by SID:HEAD or by its name)
    answer sub_agent_read_only and create nothing; reading its transcript stays possible."""
    api, ow_sid, child = ow_child(scripted_session, team)
    collab_api, sid = scripted_session(team.member, [], agent_id="plain")
    assert collab_api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).status_code == 202
    me = f"{sid}:{collab_api.get(f'/api/sessions/{sid}').json()['head']}"
    jobs = Job.objects.count()
    for tool, arguments in [("send_message", {"to": child.address, "message": "do this"}),
                            ("agent", {"to": child.address, "prompt": "do this"})]:
        body = collab_api.post(f"/api/branches/{me}/tools/{tool}", {"arguments": arguments}).json()
        assert body["is_error"] and body["details"]["code"] == "sub_agent_read_only", body
    assert Job.objects.count() == jobs
    body = collab_api.post(f"/api/branches/{me}/tools/read_conversation", {"arguments": {"session_id": child.address}}).json()
    assert not body["is_error"] and "look" in body["text"]


def test_ow_02_sub_agents_are_not_listed_at_the_top_level_but_by_their_parent(team, scripted_session, client):
    """OW acc. 2: collab list_agents(scope="all") lists the parent session, not the child; the
    project page lists the child under its parent only; the parent's list_agents lists it."""
    api, ow_sid, child = ow_child(scripted_session, team)
    collab_api, sid = scripted_session(team.member, [], agent_id="plain")
    assert collab_api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).status_code == 202
    me = f"{sid}:{collab_api.get(f'/api/sessions/{sid}').json()['head']}"
    listed = collab_api.post(f"/api/branches/{me}/tools/list_agents", {"arguments": {"scope": "all"}}).json()["text"]
    assert ow_sid in listed and child.session_id not in listed
    client.force_login(team.member)
    page = client.get("/p/alpha/").content.decode()
    assert f"/s/{ow_sid}/" in page  # the child only under its parent's row
    assert page.count(f"/s/{child.session_id}/") == 1 and f'data-child="{child.session_id}"' in page
    parent = f"{ow_sid}:{Branch.objects.get(session_id=ow_sid, task_name__isnull=True).tip_id}"
    rows = api.post(f"/api/branches/{parent}/tools/list_agents", {"arguments": {}}).json()["details"]["agents"]
    assert [(r["task_name"], r["status"]) for r in rows] == [("scout", "running")]


def test_ow_where_bubblewrap_cannot_start_bash_is_not_offered_and_the_page_says_why(team, scripted_session, client, tmp_path, monkeypatch):
    """Issue 7 §5: bash never runs unsandboxed — without a working bwrap it is neither offered
    nor dispatched, and the project page shows the reason; the other workspace tools stay."""
    from io import StringIO

    from django.core.management import call_command

    import collab.tools.surface as surface

    call_command("workspace", "alpha", str(tmp_path), stdout=StringIO())
    client.force_login(team.member)
    page = client.get("/p/alpha/").content.decode()
    assert str(tmp_path) in page and "not offered" not in page  # bwrap works on this machine

    monkeypatch.setattr(surface, "sandbox_status", lambda: (False, "bubblewrap is not installed"))
    page = client.get("/p/alpha/").content.decode()
    assert "<code>bash</code> not offered: sandbox unavailable: bubblewrap is not installed" in page
    api, sid, child = ow_child(scripted_session, team)
    body = api.post(f"/api/branches/{child.address}/tools/bash", {"arguments": {"command": "echo hi"}}).json()
    assert body["is_error"] and body["details"]["code"] == "unknown_tool", body
    body = api.post(f"/api/branches/{child.address}/tools/list", {"arguments": {}}).json()
    assert not body["is_error"], body
    out = StringIO()
    call_command("workspace", "alpha", stdout=out)  # the operator's command probes bwrap for real
    assert out.getvalue() == f"workspace = {tmp_path}\nbash: sandboxed with bubblewrap\n"
