"""A user turn end to end through the public API and a real worker process."""

import pytest

pytestmark = pytest.mark.slow


def test_a_user_turn_runs_on_a_real_worker_and_is_logged_in_order(team, scripted_session, worker):
    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])

    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"})
    assert r.status_code == 202, r.content
    accepted = r.json()
    assert accepted["status"] == "queued" and accepted["version"] == 1

    done = api.wait(accepted["execution_id"])
    assert done["status"] == "succeeded"
    assert done["result"] == "echo: hello"
    assert done["is_error"] is False
    assert done["version"] == 3  # queued → running → succeeded
    assert done["session"] == sid

    session = api.get(f"/api/sessions/{sid}").json()
    assert session["head"] is not None  # the person's turn moved the selected HEAD to the answer

    events = api.get(f"/api/sessions/{sid}/events", after=0).json()["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = [e["type"] for e in events]
    assert types == ["session.created", "message.created", "job.queued", "job.running", "message.created", "job.succeeded"]
    answer = events[4]["payload"]
    assert answer["role"] == "assistant" and answer["text"] == "echo: hello"
    assert f"{sid}:{answer['id']}" == answer["address"]
    assert session["head"] == answer["id"]

    later = api.get(f"/api/sessions/{sid}/events", after=4).json()["events"]
    assert [e["seq"] for e in later] == [5, 6]


def test_turns_on_one_branch_run_one_after_another_in_order(team, scripted_session, worker):
    api, sid = scripted_session(team.member, [{"sleep_ms": 200}, {"text": "done: {{prompt}}"}])
    ids = [api.post(f"/api/sessions/{sid}/turns", {"prompt": f"p{i}"}).json()["execution_id"] for i in range(3)]
    results = [api.wait(i) for i in ids]
    assert [r["result"] for r in results] == ["done: p0", "done: p1", "done: p2"]
    assert results[0]["finished_at"] <= results[1]["started_at"] and results[1]["finished_at"] <= results[2]["started_at"]

    events = api.get(f"/api/sessions/{sid}/events").json()["events"]
    texts = [e["payload"]["text"] for e in events if e["type"] == "message.created"]
    # one linear conversation, never a fork: prompt, answer, prompt, answer, …
    assert texts == ["p0", "done: p0", "p1", "done: p1", "p2", "done: p2"]


def test_a_session_opened_without_an_agent_spec_runs_its_turn_on_the_scripted_default(team, api_as, worker):
    """``agent_id`` is optional when a session is opened; its turns run on the
    embedded default (the scripted model, whose answer is ``ok: `` and the prompt). A job with no
    spec must be claimed like any other (a claim that assumed a spec left it queued for good)."""
    api = api_as(team.member)
    r = api.post("/api/projects/alpha/sessions", {"title": "no spec"})
    assert r.status_code == 201, r.content
    sid = r.json()["id"]
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"})
    assert r.status_code == 202, r.content
    done = api.wait(r.json()["execution_id"])
    assert (done["status"], done["result"]) == ("succeeded", "ok: hello")
