import pytest

from tests.conftest import poll

pytestmark = pytest.mark.slow


def test_background_spawn_returns_its_result_as_a_followup_turn(team, scripted_session, worker):
    api, sid = scripted_session(team.member, {
        "user": [{"tool_calls": [{"name": "agent", "arguments": {"prompt": "child work", "description": "helper", "run_in_background": True}}]},
                 {"text": "spawned {{last.details.execution_id}}"}],
        "spawn": [{"text": "child says hi"}],
        "followup": [{"text": "got: {{prompt}}"}],
    })
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"})
    done = api.wait(r.json()["execution_id"])
    assert done["status"] == "succeeded", done
    child_id = done["result"].split()[-1]
    child = api.wait(child_id)
    assert child["result"] == "child says hi"

    def followup_succeeded():
        events = api.get(f"/api/sessions/{sid}/events").json()["events"]
        return [e for e in events if e["type"] == "job.succeeded" and e["payload"]["kind"] == "followup"]

    poll(followup_succeeded, timeout=60, what="the follow-up turn to succeed")
    branches = api.get(f"/api/sessions/{sid}/branches").json()
    names = sorted(b["name"] for b in branches)
    assert "helper" in names and "main" in names, branches
    main = next(b for b in branches if b["name"] == "main")
    t = api.get(f"/api/branches/{main['address']}/transcript").json()
    assert "child says hi" in t["text"], t["text"]
    print(t["text"])
