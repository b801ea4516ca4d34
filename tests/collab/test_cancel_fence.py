"""Cancel is a fence (docs/contract.md#the-cancel-fence).

Once an execution is ``stopping`` or ``cancelled`` nothing new starts under it: no child is
admitted or started after the cancel is confirmed, the rest of the model step's tool calls are
answered "cancelled" instead of run, an inline (foreground) child stops with its caller, the
children the cascade cancelled come back to the cancelled branch as notices (never as new model
turns), and the execution ends ``cancelled`` — never ``succeeded``. A ``send_message`` turn
belongs to its recipient and survives the sender's cancel.

Everything runs on real django-q2 workers, through ``POST /api/sessions/{sid}/turns`` and
``POST /api/executions/{id}/commands``. Rows are read directly only for what the API does not
show (when a job was created or asked to stop, tool-call ids of the transcript).

The random-delay cancels racing a five-spawn step, many times over, are the reliability
suite's R3 (tests/reliability/test_r3_cancel_races.py).
"""

from collections import Counter

import pytest

from tests.conftest import WAIT, agent_call, cancel, executions, make_spec, open_session, poll, settle, step, turn

pytestmark = pytest.mark.slow

LONG_MS = 30_000  # a model call that is always cancelled long before it ends


def cancel_until_accepted(api, eid) -> dict:
    """The versioned cancel command, re-reading the version while it moves (202 answers)."""
    for _ in range(20):
        r = cancel(api, eid)
        if r.status_code == 202:
            return r.json()
        assert r.status_code == 409 and r.json()["code"] == "stale_version", r.content
    raise AssertionError(f"could not cancel {eid}: its version kept moving")


def assert_well_formed(session_id) -> None:
    """Every tool call of every assistant node is answered by exactly one tool node of the same
    turn (what providers require of a history), and no two nodes of one branch share a
    predecessor (one chain per branch; attach pointers are side nodes)."""
    from collab.models import Message

    nodes = list(Message.objects.filter(session_id=session_id).values(
        "id", "job_id", "role", "kind", "tool_calls", "tool_call_id", "branch_id", "predecessor_id"))
    answered = Counter((m["job_id"], m["tool_call_id"]) for m in nodes if m["role"] == "tool")
    for m in nodes:
        for call in (m["tool_calls"] or []) if m["role"] == "assistant" else []:
            assert answered[(m["job_id"], call["id"])] == 1, (m, call, answered)
    assert sum(answered.values()) == sum(len(m["tool_calls"] or []) for m in nodes if m["role"] == "assistant")
    chains = Counter((m["branch_id"], m["predecessor_id"]) for m in nodes if m["kind"] != "attach")
    assert [k for k, n in chains.items() if n > 1] == [], "a branch forked inside itself"


def test_the_rest_of_a_step_is_answered_cancelled_and_a_foreground_child_stops_with_it(team, api_as, worker):
    """Cancelling a turn while the first of three tool calls of its
    step — a foreground ``agent`` child running inline — is under way stops the child and the
    turn; the second ``agent`` call never admits a child and, like the third call, is answered
    "cancelled", so every tool call in the transcript has its result."""
    from collab.models import Job, Message

    owner = api_as(team.owner)
    make_spec(owner, "leaf", [{"sleep_ms": LONG_MS}, {"text": "leaf done"}])
    make_spec(owner, "boss", {"user": [
        step(agent_call("first", "leaf", background=False, description="fg one"),
             agent_call("second", "leaf", background=False, description="fg two"),
             {"name": "list_jobs", "arguments": {}}),
        {"text": "boss done"},
    ]})
    api = api_as(team.member)
    sid = open_session(api, "boss")
    root = turn(api, sid, "work inline")
    child = poll(lambda: next((j for j in executions(api, sid) if j["parent_job"] == root
                               and j["status"] == "running"), None), what="the inline child running")
    answer = cancel_until_accepted(api, root)
    assert answer["status"] == "stopping" and answer["cascaded"] == [child["id"]], answer
    assert api.wait(child["id"], timeout=WAIT)["status"] == "cancelled"
    assert api.wait(root, timeout=WAIT)["status"] == "cancelled"

    jobs = settle(api, sid)
    assert sorted(j["id"] for j in jobs) == sorted([root, child["id"]]), "the second foreground child was admitted"
    results = list(Message.objects.filter(job_id=root, role="tool").order_by("depth").values("text", "metadata"))
    assert [r["metadata"]["tool"] for r in results] == ["agent", "agent", "list_jobs"]
    assert child["id"] in results[0]["text"] or "cancel" in results[0]["text"], results[0]
    for skipped in results[1:]:
        assert skipped["text"].startswith("cancelled") and skipped["metadata"]["is_error"], skipped
    assert not Message.objects.filter(job_id=root, role="assistant", tool_calls__isnull=True).exclude(text="").exists()
    assert Job.objects.get(pk=root).status == "cancelled"
    assert_well_formed(sid)


def test_a_message_turn_belongs_to_its_recipient_and_survives_the_senders_cancel(team, api_as, worker):
    """A ``send_message`` turn is not a child of the
    sender's job — cancelling the sender does not cascade to it; it runs to its end."""
    owner = api_as(team.owner)
    make_spec(owner, "reader", {"user": [{"text": "ready"}], "message": [{"sleep_ms": 1500}, {"text": "read it"}]})
    api = api_as(team.member)
    target_sid = open_session(api, "reader")
    first = turn(api, target_sid, "hello")
    done = api.wait(first, timeout=WAIT)
    assert done["status"] == "succeeded"
    target = f"{target_sid}:{done['prompt_msg']}"
    make_spec(owner, "sender", {"user": [
        step({"name": "send_message", "arguments": {"to": target, "message": "please read this"}}),
        {"sleep_ms": LONG_MS}, {"text": "sent"},
    ]})
    sid = open_session(api, "sender")
    sender = turn(api, sid, "send it")
    message = poll(lambda: next((j for j in executions(api, target_sid) if j["kind"] == "message"
                                 and j["status"] == "running"), None), what="the message turn running")
    assert message["parent_job"] is None, message
    answer = cancel_until_accepted(api, sender)
    assert answer["status"] == "stopping" and answer["cascaded"] == [], answer
    assert api.wait(sender, timeout=WAIT)["status"] == "cancelled"
    assert api.wait(message["id"], timeout=WAIT)["status"] == "succeeded"
    settle(api, target_sid)
    assert_well_formed(sid)
    assert_well_formed(target_sid)
