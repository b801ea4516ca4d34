"""The watch policy (docs/contract.md#watch-policy): deliveries held for a member's confirmation."""


import pytest

from tests.conftest import poll as _poll

pytestmark = pytest.mark.slow


def _two_branches(team, scripted_session, api_as):
    api, sid = scripted_session(team.member, {"followup": [{"text": "noted: {{prompt}}"}]})
    first = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).json()["execution_id"]
    api.wait(first)
    main = api.get(f"/api/sessions/{sid}/branches").json()[0]["address"]
    r = api.post(f"/api/branches/{main}/tools/agent", {"arguments": {"prompt": "be the target", "description": "target"}})
    assert r.json()["is_error"] is False, r.json()
    target = r.json()["details"]["address"]
    owner = api_as(team.owner)
    assert owner.patch("/api/projects/alpha", {"watch_policy": "confirm_deliveries"}).status_code == 200
    return api, sid, main, target


def test_watch_policy_holds_messages_until_a_member_approves(team, scripted_session, api_as, run_queued):
    api, sid, main, target = _two_branches(team, scripted_session, api_as)
    jobs_before = len(api.get("/api/executions", session=sid).json())

    r = api.post(f"/api/branches/{main}/tools/send_message", {"arguments": {"to": "target", "message": "ping"}}).json()
    assert r["details"]["held"] is True and r["details"]["delivery_id"] is None, r
    holds = api.get(f"/api/sessions/{sid}/holds").json()
    assert [h["text"] for h in holds] == ["ping"]
    assert len(api.get("/api/executions", session=sid).json()) == jobs_before  # nothing delivered yet

    approved = api.post(f"/api/holds/{holds[0]['id']}/approve").json()
    assert approved["status"] == "approved" and approved["execution_id"]
    done = api.wait(approved["execution_id"])
    assert done["kind"] == "message" and done["status"] == "succeeded"
    again = api.post(f"/api/holds/{holds[0]['id']}/approve")
    assert again.status_code == 409 and again.json()["code"] == "already_decided"


def test_a_rejected_delegation_returns_an_explicit_result_to_the_sender(team, scripted_session, api_as, worker):
    api, sid, main, target = _two_branches(team, scripted_session, api_as)
    r = api.post(f"/api/branches/{main}/tools/agent", {"arguments": {"to": target, "prompt": "do it"}}).json()
    assert r["details"]["held"] is True
    hold = api.get(f"/api/sessions/{sid}/holds").json()[0]
    viewer = api_as(team.viewer)
    assert viewer.post(f"/api/holds/{hold['id']}/reject").status_code == 403
    rejected = api.post(f"/api/holds/{hold['id']}/reject").json()
    assert rejected["status"] == "rejected"
    failed = api.get(f"/api/executions/{rejected['execution_id']}").json()
    assert failed["status"] == "failed" and failed["error_code"] == "delivery_rejected"

    def followup_text():
        events = api.get(f"/api/sessions/{sid}/events").json()["events"]
        return [e["payload"]["text"] for e in events
                if e["type"] == "message.created" and e["payload"]["kind"] == "followup"]

    texts = _poll(followup_text)
    assert len(texts) == 1 and "rejected" in texts[0]
