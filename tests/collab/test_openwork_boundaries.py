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
    """OW acc. 2: collab list_agents(scope="all") and the project page list the parent session,
    not the child; the parent's list_agents lists the child."""
    api, ow_sid, child = ow_child(scripted_session, team)
    collab_api, sid = scripted_session(team.member, [], agent_id="plain")
    assert collab_api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).status_code == 202
    me = f"{sid}:{collab_api.get(f'/api/sessions/{sid}').json()['head']}"
    listed = collab_api.post(f"/api/branches/{me}/tools/list_agents", {"arguments": {"scope": "all"}}).json()["text"]
    assert ow_sid in listed and child.session_id not in listed
    client.force_login(team.member)
    page = client.get("/p/alpha/").content.decode()
    assert f"/s/{ow_sid}/" in page and f"/s/{child.session_id}/" not in page
    parent = f"{ow_sid}:{Branch.objects.get(session_id=ow_sid, task_name__isnull=True).tip_id}"
    rows = api.post(f"/api/branches/{parent}/tools/list_agents", {"arguments": {}}).json()["details"]["agents"]
    assert [(r["task_name"], r["status"]) for r in rows] == [("scout", "running")]
