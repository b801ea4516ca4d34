"""OpenWork with real model APIs (the local fake server of tests/collab/fake_llm.py, through the
official SDKs): what the models are told and shown.

- a root's system prompt ends with the delegation rules, carrying the project's limit;
- an explorer's system prompt is the explorer prompt; it is offered only the read-only
  workspace tools (as the model sees them);
- a child's result is seen by the same parent turn, after all tool results, as
  user-role input — the request never ends with an assistant message (Chat Completions and
  Anthropic Messages both);
- when a long branch is cut to fit the context window, the replayed request is
  the person's, never a delivered ``agent_message``.

The rules are in docs/contract.md#the-openwork-toolset, #results-come-back-exactly-once and
#results.
"""

import json

import pytest
from django.core.management import call_command

from collab.models import Job
from collab.runtime.compaction import Note, compacted, history_budget, last_real_user
from collab.runtime.prompts import EXPLORER_SYSTEM_PROMPT
from collab.runtime.providers.mapping import TITLE_SYSTEM
from tests.collab.test_providers import (  # noqa: F401  (fixtures)
    _last_user_text,
    dialect,
    fake,
    fake_server,
    fast,
    llm_session,
    run_inline,
    start_turn,
)

CONTROL = {"spawn_agent", "wait_agent", "list_agents", "followup_task", "interrupt_agent"}
WORKSPACE = {"read", "grep", "glob", "list", "bash"}


def test_an_openwork_root_is_told_the_delegation_rules_with_the_projects_limit(fast, fake, llm_session, dialect, team, api_as):
    """The root's system prompt is its own prompt, then the delegation rules with the
    configured max_active_turns in place of 3; it is offered the control tools."""
    assert api_as(team.owner).patch("/api/projects/alpha/limits", {"max_active_turns": 2}).status_code == 200
    fake.add(dialect.text("fine"))
    api, sid, _ = llm_session(dialect, toolset="openwork", limits={"stream": False})
    job = run_inline(start_turn(api, sid, "look around"))
    assert job.status == "succeeded", job.error_reason
    [request] = fake.requests
    system = dialect.system(request)
    assert system.startswith("You are a careful test agent.\n\n## Sub-agent delegation\n\n")
    assert "You can run up to 2 read-only explorer turns concurrently." in system
    assert system.endswith("Reuse an idle explorer with followup_task when its existing context helps.")
    offered = set(dialect.tool_names(request))
    assert CONTROL <= offered and not offered & WORKSPACE  # no workspace in this project


def test_an_explorer_is_told_its_role_and_offered_only_the_read_only_workspace_tools(
        fast, fake, llm_session, dialect, tmp_path):
    """The child's system prompt is the explorer prompt (four points); it is
    offered read/grep/glob/list/bash and nothing else: no control tools, no todo tools."""
    call_command("workspace", "alpha", str(tmp_path), stdout=open("/dev/null", "w"))
    fake.add(dialect.tools([("s1", "spawn_agent", {"task_name": "scout", "message": "where is X?"})]),
             dialect.text("spawned"), dialect.text("X is in x.py"))
    api, sid, _ = llm_session(dialect, toolset="openwork", limits={"stream": False})
    parent = run_inline(start_turn(api, sid, "find X"))
    assert parent.status == "succeeded", parent.error_reason
    child_job = Job.objects.get(caller_job=parent)
    child = run_inline(child_job.pk)
    assert child.status == "succeeded", child.error_reason
    root_request, _, child_request = fake.requests
    assert WORKSPACE | CONTROL <= set(dialect.tool_names(root_request))
    assert dialect.system(child_request) == EXPLORER_SYSTEM_PROMPT
    assert set(dialect.tool_names(child_request)) == WORKSPACE
    assert dialect.user_texts(child_request) == ["where is X?"]  # no internal ids, no headers


def openwork_responder(dialect):
    """A root that spawns an explorer, waits, and answers from the delivered envelope; and the explorer."""

    def respond(request):
        stream = bool(request.body.get("stream"))
        if dialect.system(request) == TITLE_SYSTEM:
            return dialect.text("A Title")
        if dialect.system(request) == EXPLORER_SYSTEM_PROMPT:
            return dialect.text("auth lives in auth.py:12", stream=stream)
        if "<agent_message>" in _last_user_text(dialect, request):
            return dialect.text("final: auth lives in auth.py:12", stream=stream)
        if dialect.ends_with_tool_result(request):
            return dialect.tools([("wait_1", "wait_agent", {"timeout_ms": 30000})], stream=stream)
        return dialect.tools([("spawn_1", "spawn_agent", {"task_name": "find_auth", "message": "Where is auth?"})],
                             stream=stream)

    return respond


@pytest.mark.slow
def test_the_same_turn_sees_the_envelope_after_all_tool_results_as_user_input(fake, llm_session, dialect, worker):
    """The explorer finishes while the parent waits; the parent's next request (the
    same turn) carries the <agent_message> as the last user input, after the tool results of
    spawn_agent and wait_agent; no request ends with an assistant message."""
    fake.responder = openwork_responder(dialect)
    api, sid, _ = llm_session(dialect, toolset="openwork")
    job = api.wait(start_turn(api, sid, "Where is authentication handled?"), timeout=60)
    assert job["status"] == "succeeded", job
    assert job["result"] == "final: auth lives in auth.py:12"
    assert len(api.get("/api/executions", session=sid).json()) == 1  # one parent turn, nothing more

    requests = [r for r in fake.requests if dialect.system(r) not in (TITLE_SYSTEM, EXPLORER_SYSTEM_PROMPT)]
    assert all(dialect.last_role(r) != "assistant" for r in fake.requests)  # never a prefill
    closing = [r for r in requests if "<agent_message>" in _last_user_text(dialect, r)]
    assert len(closing) == 1
    flat = dialect.flat(closing[0])
    assert flat[:5] == [("user", "Where is authentication handled?"), ("call", "spawn_agent"), ("result", "spawn_1"),
                        ("call", "wait_agent"), ("result", "wait_1")]
    envelope = flat[-1]
    assert envelope[0] == "user" and envelope[1] == (
        "<agent_message>\n<task>find_auth</task>\n<kind>final_answer</kind>\n<body>\nauth lives in auth.py:12\n"
        "</body>\n</agent_message>")
    assert json.loads(dialect.results(closing[0])["wait_1"]) == {"delivered": True, "timed_out": False}


# --- compaction: the real request survives, the envelope is context ---------------------------------


def node(role, text, kind="normal", **extra):
    return Note(text=text, role=role, kind=kind, **extra)


def test_an_agent_message_is_never_the_real_user_request():
    """last_real_user skips agent_message (and other contextual kinds); a history of
    only contextual user input has no request."""
    request = node("user", "find the flaky test")
    envelope = node("user", "<agent_message>…</agent_message>", kind="agent_message")
    history = [request, node("assistant", "", tool_calls=[{"id": "c", "name": "spawn_agent", "arguments": {}}]),
               node("tool", '{"task_name": "a"}', tool_call_id="c"), envelope]
    assert last_real_user(history) is request
    assert last_real_user([envelope, node("user", "[result from x]", kind="followup")]) is None


def test_a_compacted_history_replays_the_persons_request_not_a_delivered_result():
    """A branch too long for the context window keeps its newest messages; the
    person's request, cut away, is replayed after a note — the long agent_message after it is not
    taken for the request."""
    request = node("user", "find the flaky test")
    filler = [node("assistant", "thinking " * 200), node("user", "[result from s:m] " + "more " * 200, kind="followup")]
    envelope = node("user", "<agent_message>" + "x" * 3000 + "</agent_message>", kind="agent_message")
    history = [request, *filler, node("assistant", "ok " * 300), envelope]
    budget = history_budget(1500)  # tokens → 3,600 characters of history
    view = compacted(history, budget)
    assert view[0].kind == "notice" and "left out" in view[0].text
    assert view[1] is request and view[-1] is envelope
    assert sum(len(m.text) for m in view[2:]) <= budget
    assert compacted(history, None) == history and compacted(history, 10**9) == history


def test_a_small_context_window_cuts_what_the_model_is_sent(fast, fake, llm_session, dialect):
    """Compaction through a provider: with limits.context_window, a turn whose own output outgrew
    the window sends the note, the person's request replayed, and the newest messages."""
    api, sid, _ = llm_session(dialect, limits={"context_window": 1000, "stream": False})
    fake.add(dialect.tools([("c1", "todo_list", {})], text="a " * 1500), dialect.text("done"))
    assert run_inline(start_turn(api, sid, "the original request")).status == "succeeded"
    first, second = fake.requests
    assert dialect.user_texts(first) == ["the original request"]
    texts = dialect.user_texts(second)
    assert "left out to fit the model's context window" in texts[0]
    assert "the original request" in texts[0]  # replayed after the note (one merged user input)
    assert "a a a" not in json.dumps(dialect.messages(second))  # the long old output was cut
    assert dialect.last_role(second) == "user"
