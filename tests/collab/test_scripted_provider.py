"""The scripted provider (docs/contract.md#the-scripted-provider), every step form, through the public API.

A step rule needs no worker process: the turn runs in this process exactly as a worker runs
it (``run_job``), in the test's transaction. The mailbox, which needs a background child
running beside the turn, runs on the real worker. Everything is observed as a client
sees it: the execution (``GET /api/executions/{id}``) and the session's event log
(``GET /api/sessions/{sid}/events``).
"""

from datetime import datetime

import pytest
from django.conf import settings

UNKNOWN_TOOL = {"name": "no_such_tool", "arguments": {}}


@pytest.fixture
def run_turn(team, scripted_session):
    """Run one user turn of ``script`` to its end in this process: returns (api, sid, execution)."""
    from collab.runtime.loop import run_job

    def run(script, prompt="hello"):
        api, sid = scripted_session(team.member, script)
        r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
        assert r.status_code == 202, r.content
        execution_id = r.json()["execution_id"]
        assert run_job(execution_id) is not None, f"job {execution_id} could not be claimed"
        return api, sid, api.get(f"/api/executions/{execution_id}").json()

    return run


@pytest.fixture
def run_turn_on_worker(team, scripted_session, worker):
    """Run one user turn of ``script`` on the real worker: returns (api, sid, execution)."""

    def run(script, prompt="hello", timeout=30.0):
        api, sid = scripted_session(team.member, script)
        r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
        assert r.status_code == 202, r.content
        return api, sid, api.wait(r.json()["execution_id"], timeout=timeout)

    return run


def messages(api, sid, job=None) -> list[dict]:
    """The ``message.created`` payloads of the session, in order (optionally of one job)."""
    events, after = [], 0
    while True:
        page = api.get(f"/api/sessions/{sid}/events", after=after).json()["events"]
        if not page:
            break
        events += page
        after = page[-1]["seq"]
    found = [e["payload"] for e in events if e["type"] == "message.created"]
    return [m for m in found if job is None or m["job"] == job]


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


# --- {"text"} ---------------------------------------------------------------------------


def test_a_text_step_ends_the_turn_with_that_answer(run_turn):
    api, sid, done = run_turn([{"text": "The answer is 42."}, {"text": "never reached"}])
    assert done["status"] == "succeeded" and done["is_error"] is False
    assert done["result"] == "The answer is 42."
    assert done["model_calls"] == 1 and done["tool_calls"] == 0
    roles = [(m["role"], m["text"]) for m in messages(api, sid, done["id"])]
    assert roles == [("user", "hello"), ("assistant", "The answer is 42.")]


# --- {"tool_calls"} -------------------------------------------------------------------------


def test_an_unknown_tool_is_an_error_result_and_the_turn_goes_on(run_turn):
    api, sid, done = run_turn([{"tool_calls": [UNKNOWN_TOOL]}, {"text": "carried on"}])
    assert done["status"] == "succeeded", done
    assert done["result"] == "carried on"
    assert done["model_calls"] == 2 and done["tool_calls"] == 1

    written = messages(api, sid, done["id"])
    assert [m["role"] for m in written] == ["user", "assistant", "tool", "assistant"]
    call, result = written[1], written[2]
    assert [c["name"] for c in call["tool_calls"]] == ["no_such_tool"]
    assert result["text"].startswith("unknown_tool:")
    assert "no_such_tool" in result["text"]


def test_tool_call_arguments_are_substituted_before_the_call(run_turn):
    api, sid, done = run_turn(
        [{"tool_calls": [{"name": "no_such_tool", "arguments": {"q": "about {{prompt}}", "nested": ["{{prompt}}"]}}]}],
        prompt="tides",
    )
    call = next(m for m in messages(api, sid, done["id"]) if m["tool_calls"])
    assert call["tool_calls"][0]["arguments"] == {"q": "about tides", "nested": ["tides"]}


# --- substitutions -------------------------------------------------------------------------


def test_prompt_is_substituted_verbatim(run_turn):
    _, _, done = run_turn([{"text": "you said: {{prompt}} / {{ prompt }}"}], prompt="hi {{address}} ünïcödé")
    assert done["result"] == "you said: hi {{address}} ünïcödé / hi {{address}} ünïcödé"


def test_address_is_this_branch_s_sid_and_head_at_that_moment(run_turn):
    api, sid, done = run_turn([{"text": "{{address}}"}])
    address_sid, _, head = done["result"].partition(":")
    assert address_sid == sid
    # at the first model call the branch ends at this turn's prompt
    assert head == done["prompt_msg"]
    assert {m["id"]: m["branch"] for m in messages(api, sid)}[head] == done["branch"]


def test_address_follows_the_branch_as_the_turn_writes_to_it(run_turn):
    api, sid, done = run_turn([{"tool_calls": [UNKNOWN_TOOL]}, {"text": "{{address}}"}])
    written = messages(api, sid, done["id"])
    tool_result = written[-2]
    assert tool_result["role"] == "tool"
    assert done["result"] == f"{sid}:{tool_result['id']}" == tool_result["address"]
    assert tool_result["branch"] == done["branch"]


def test_last_text_and_last_details_come_from_the_previous_step_s_first_tool_result(run_turn):
    script = [
        {"tool_calls": [{"name": "no_such_tool", "arguments": {}}, {"name": "other_missing_tool", "arguments": {}}]},
        {"text": "code={{last.details.code}} tool={{last.details.tool}} text={{last.text}}"},
    ]
    api, sid, done = run_turn(script)
    first_result = next(m for m in messages(api, sid, done["id"]) if m["role"] == "tool")
    assert first_result["text"].startswith("unknown_tool:")
    assert done["result"] == f"code=unknown_tool tool=no_such_tool text={first_result['text']}"
    assert done["tool_calls"] == 2


def test_last_is_the_most_recent_tool_step(run_turn):
    script = [
        {"tool_calls": [{"name": "first_missing", "arguments": {}}]},
        {"tool_calls": [{"name": "second_missing", "arguments": {"was": "{{last.details.tool}}"}}]},
        {"text": "{{last.details.tool}}"},
    ]
    api, sid, done = run_turn(script)
    assert done["result"] == "second_missing"
    calls = [m["tool_calls"][0] for m in messages(api, sid, done["id"]) if m["tool_calls"]]
    assert calls[1]["arguments"] == {"was": "first_missing"}


def test_last_is_empty_before_any_tool_ran(run_turn):
    _, _, done = run_turn([{"text": "[{{last.text}}|{{last.details.code}}]"}])
    assert done["result"] == "[|]"


def test_mailbox_is_empty_when_nothing_was_delivered(run_turn):
    _, _, done = run_turn([{"text": "mailbox=[{{mailbox}}]"}])
    assert done["result"] == "mailbox=[]"


@pytest.mark.slow
def test_mailbox_is_the_text_drained_into_this_turn_so_far(run_turn_on_worker):
    """A background child's result reaches the running caller's mailbox before its next model call."""
    wait_a_little = {"sleep_ms": 500, "tool_calls": [{"name": "todo_list", "arguments": {}}]}
    script = {
        "user": [
            {"tool_calls": [{"name": "agent", "arguments": {"prompt": "dig", "description": "digger", "run_in_background": True}}]},
            *[wait_a_little] * 6,
            {"text": "mailbox=[{{mailbox}}]"},
        ],
        "spawn": [{"text": "child found {{prompt}}"}],
    }
    api, sid, done = run_turn_on_worker(script)
    assert done["status"] == "succeeded", done
    assert done["result"].startswith("mailbox=[[result from ")
    assert "child found dig" in done["result"]
    drained = [m for m in messages(api, sid, done["id"]) if m["kind"] == "agent_message"]
    assert len(drained) == 1 and done["result"] == f"mailbox=[{drained[0]['text']}]"


# --- when the steps run out ----------------------------------------------------------------


def test_when_the_steps_run_out_it_answers_ok_and_the_first_200_characters_of_the_prompt(run_turn):
    prompt = "".join(f"{i:03d}é " for i in range(80))  # 400 characters, some of them two bytes long
    assert len(prompt) > 200
    api, sid, done = run_turn([{"tool_calls": [UNKNOWN_TOOL]}], prompt=prompt)
    assert done["status"] == "succeeded"
    assert done["result"] == "ok: " + prompt[:200]
    assert done["model_calls"] == 2
    assert messages(api, sid, done["id"])[-1]["text"] == "ok: " + prompt[:200]


def test_an_empty_script_answers_with_the_fallback_at_once(run_turn):
    _, _, done = run_turn([], prompt="short one")
    assert done["status"] == "succeeded" and done["result"] == "ok: short one"


# --- scripts keyed by turn kind ---------------------------------------------------------------


def test_a_script_keyed_by_turn_kind_uses_the_steps_of_this_turn_s_kind(run_turn):
    script = {"user": [{"text": "user turn: {{prompt}}"}], "task": [{"text": "task turn"}], "message": [{"text": "message turn"}]}
    _, _, done = run_turn(script, prompt="ping")
    assert done["kind"] == "user"
    assert done["result"] == "user turn: ping"


def test_a_turn_kind_without_steps_answers_with_the_fallback(run_turn):
    _, _, done = run_turn({"task": [{"text": "task turn"}]}, prompt="nobody scripted me")
    assert done["result"] == "ok: nobody scripted me"


def test_a_turn_kind_with_an_empty_list_answers_with_the_fallback(run_turn):
    _, _, done = run_turn({"user": []}, prompt="empty list")
    assert done["result"] == "ok: empty list"


# --- {"sleep_ms"} ------------------------------------------------------------------------------


def test_a_sleep_step_delays_the_answer_by_at_least_that_long(run_turn):
    _, _, done = run_turn([{"sleep_ms": 700}, {"text": "awake"}])
    assert done["status"] == "succeeded" and done["result"] == "awake"
    assert (when(done["finished_at"]) - when(done["started_at"])).total_seconds() >= 0.7
    assert done["model_calls"] == 1  # a pure sleep is not a model call of its own


def test_a_sleep_may_share_a_step_with_its_answer(run_turn):
    _, _, done = run_turn([{"sleep_ms": 400, "text": "slow answer"}])
    assert done["result"] == "slow answer"
    assert (when(done["finished_at"]) - when(done["started_at"])).total_seconds() >= 0.4


# --- the tool-call cap (docs/contract.md#limits-and-defaults) ---------------------------------------


def test_a_turn_may_make_exactly_the_maximum_number_of_tool_calls(run_turn):
    cap = settings.TRELLIS_MAX_TOOL_CALLS
    _, _, done = run_turn([{"tool_calls": [UNKNOWN_TOOL] * cap}, {"text": "within the cap"}])
    assert done["status"] == "succeeded", done
    assert done["tool_calls"] == cap and done["result"] == "within the cap"


def test_one_step_over_the_tool_call_cap_fails_the_turn_without_running_it(run_turn):
    cap = settings.TRELLIS_MAX_TOOL_CALLS
    api, sid, done = run_turn([{"tool_calls": [UNKNOWN_TOOL] * (cap + 1)}, {"text": "never"}])
    assert done["status"] == "failed"
    assert done["is_error"] is True
    assert done["error_code"] == "tool_call_limit"
    assert done["tool_calls"] == 0
    assert not [m for m in messages(api, sid, done["id"]) if m["role"] in ("tool", "assistant")]


def test_tool_calls_over_many_steps_count_towards_the_cap(run_turn):
    cap = settings.TRELLIS_MAX_TOOL_CALLS
    api, sid, done = run_turn([{"tool_calls": [UNKNOWN_TOOL]}] * (cap + 1) + [{"text": "never"}])
    assert done["status"] == "failed" and done["error_code"] == "tool_call_limit"
    assert done["tool_calls"] == cap
    assert len([m for m in messages(api, sid, done["id"]) if m["role"] == "tool"]) == cap
    assert "never" not in [m["text"] for m in messages(api, sid, done["id"])]
