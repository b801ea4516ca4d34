"""OpenWork multi-agent acceptance (docs/contract.md#the-openwork-toolset).

A root session whose AgentSpec has ``toolset="openwork"`` gets the five control
tools (``spawn_agent``, ``wait_agent``, ``list_agents``, ``followup_task``,
``interrupt_agent``); its children are read-only explorer sessions whose results
come back as ``<agent_message>`` envelopes drained into the parent's mailbox.

Everything is driven through public entry points — user turns of scripted (and,
for the wire format, OpenAI-compatible) agents, the tool gateway
(``POST /api/branches/{address}/tools/{tool}``), the executions, sessions,
transcript and limits APIs, ``manage.py`` commands, the project page — against a
real django-q2 worker process where parent and children must run side by side
(``wait_agent``, interrupts), and in this process (``run_queued``, tests/conftest.py)
where each turn may simply run after the other. Rows are read directly only to observe what the
API does not show (exactly-once dedupe keys, "nothing was written" counts,
cascades) and to simulate what cannot be caused from outside (a worker that died:
its lease running out). Waiting is always polling with a timeout.

Not covered here: fitting a long branch into the context window (test_openwork_models.py), the
agent rail page (tested with the browser, tests/browser/test_agent_rail.py), traces, the
structural rule of one run loop, and cleaning up a child session left without a turn (a spawn
is one transaction here, so a child session without a turn cannot exist).
"""

import io
import json
import os
import re
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.collab.test_governed_execution import (
    UNENDING_MS,
)
from tests.conftest import (
    TERMINAL,
    WAIT,
    address_of,
    cancel,
    execution,
    executions,
    make_git_repo,
    make_spec,
    open_session,
    poll,
    set_limits,
    settle,
    step,
    tool,
    tool_results,
    transcript_messages,
    turn,
)

pytestmark = pytest.mark.slow

LONG_MS = 30_000  # a child "model call" that is always interrupted long before it ends
CONTROL_TOOLS = ["followup_task", "interrupt_agent", "list_agents", "spawn_agent", "wait_agent"]
PLAN_TOOLS = {"todo_create", "todo_update", "todo_list"}  # a root's plan tools; never an explorer's

# The worker is a session-wide subprocess that copies os.environ when it starts (after
# collection), so a key set while this module is imported reaches it.
OW_KEY_ENV = "TRELLIS_TEST_OW_OPENAI_KEY"
os.environ.setdefault(OW_KEY_ENV, "sk-trellis-test-openwork-0a1b2c3d")

ENVELOPE = re.compile(
    r"<agent_message>\n<task>(?P<task>[a-z][a-z0-9_]*)</task>\n<kind>(?P<kind>\w+)</kind>\n"
    r"<body>\n(?P<body>.*?)\n</body>\n</agent_message>",
    re.S,
)


# --- helpers -----------------------------------------------------------------------------------


def openwork_spec(owner_api, agent_id, script, **fields) -> dict:
    """A scripted agent with the OpenWork toolset."""
    return make_spec(owner_api, agent_id, script, toolset="openwork", **fields)


def user_turn(api, sid, prompt="go", expect="succeeded"):
    """A person's turn, waited for; returns the execution."""
    done = api.wait(turn(api, sid, prompt), timeout=WAIT)
    assert done["status"] == expect, done
    return done


def ok(result):
    assert not result["is_error"], result
    return result


def refused(result, code):
    """An OpenWork domain error: a failed tool result ``<code>: <message>`` with details.code."""
    assert result["is_error"], result
    assert result["details"]["code"] == code, result
    assert result["text"].startswith(f"{code}: ") and len(result["text"]) > len(code) + 2, result
    return result


def turn_messages(api, job):
    """The messages one turn wrote on its branch, in DAG order (from the prompt node on)."""
    messages = transcript_messages(api, address_of(job))
    start = next(i for i, m in enumerate(messages) if m["id"] == job["prompt_msg"])
    out = [messages[start]]
    for m in messages[start + 1:]:
        if m["role"] == "user" and m["kind"] != "agent_message":
            break  # the next turn's prompt
        out.append(m)
    return out


def envelopes(text):
    return [(m["task"], m["kind"], m["body"]) for m in ENVELOPE.finditer(text)]


def agent_message_rows(session_id):
    from collab.models import Message

    return list(Message.objects.filter(session_id=session_id, kind="agent_message").order_by("depth"))


def spawn_call(task_name, message):
    return {"name": "spawn_agent", "arguments": {"task_name": task_name, "message": message}}


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def rows(messages=False):
    """Cross-check for "nothing was written": every session, branch and job row (and message
    row, when nothing else may be writing meanwhile)."""
    from collab.models import Branch, Job, Message, Session

    counts = (Session.objects.count(), Branch.objects.count(), Job.objects.count())
    return counts + (Message.objects.count(),) if messages else counts


def root_with_address(api, owner, agent_id, script, **spec):
    """A root session of an openwork spec and its main branch's address (after a first turn)."""
    openwork_spec(owner, agent_id, script, **spec)
    sid = open_session(api, agent_id)
    first = user_turn(api, sid, "hello")
    return sid, address_of(first), first


def gateway_spawn(api, address, task_name, message):
    """``spawn_agent`` through the gateway; returns the child's first execution."""
    r = ok(tool(api, address, "spawn_agent", task_name=task_name, message=message))
    assert json.loads(r["text"]) == {"task_name": task_name}
    return execution(api, r["details"]["execution_id"])


def assert_drained_after_tool_results(messages):
    """Envelopes never split an assistant(tool_calls) from its tool results;
    each is followed (after any further envelopes) by the next model call's assistant node."""
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "assistant" and m["tool_calls"]:
            n = len(m["tool_calls"])
            results = messages[i + 1:i + 1 + n]
            assert [(r["role"], r["tool"]) for r in results] == [("tool", c["name"]) for c in m["tool_calls"]], \
                [(r["role"], r["kind"], r["tool"]) for r in messages]
            i += 1 + n
            continue
        if m["kind"] == "agent_message":
            assert m["role"] == "user"
            following = next((x for x in messages[i + 1:] if x["kind"] != "agent_message"), None)
            assert following is not None and following["role"] == "assistant", \
                [(r["role"], r["kind"], r["tool"]) for r in messages]
        i += 1


# --- child sessions, names -------------------------------------------------------------------------


SIMPLE = {"user": [{"text": "mail=[{{mailbox}}]"}], "spawn": [{"text": "explored: {{prompt}}"}]}


def test_child_session_records_parent_task_name_and_role(team, api_as, run_queued):
    """A spawned child is a Session with parent_session and agent_role
    ``explorer`` whose one branch carries the task_name and the parent branch; the root has none
    of these. The child runs a turn whose terminal state is readable; people cannot post turns to it."""
    from collab.models import Branch, Session

    owner, api = api_as(team.owner), api_as(team.member)
    openwork_spec(owner, "ow1", {"user": [step(spawn_call("scout", "where is auth?")), {"text": "spawned"}],
                             "spawn": [{"text": "auth lives in auth.py"}]})
    sid = open_session(api, "ow1")
    root = user_turn(api, sid)
    (spawn_result,) = tool_results(root["id"])
    assert spawn_result["tool"] == "spawn_agent" and not spawn_result["is_error"], spawn_result
    assert json.loads(spawn_result["text"]) == {"task_name": "scout"}
    child_job = api.wait(spawn_result["details"]["execution_id"], timeout=WAIT)
    assert child_job["status"] == "succeeded" and child_job["result"] == "auth lives in auth.py", child_job
    assert child_job["kind"] == "spawn" and child_job["parent_job"] == root["id"]
    child_sid = child_job["session"]
    assert child_sid != sid

    # through the API
    root_api = api.get(f"/api/sessions/{sid}").json()
    child_api = api.get(f"/api/sessions/{child_sid}").json()
    assert (root_api["parent_session"], root_api["agent_role"]) == (None, None)
    assert child_api["parent_session"] == sid and child_api["project"] == "alpha"
    assert child_api["agent_role"] == "explorer"
    (child_branch_row,) = api.get(f"/api/sessions/{child_sid}/branches").json()
    assert child_branch_row["name"] == "scout"
    assert [j["id"] for j in executions(api, child_sid)] == [child_job["id"]]

    # the rows: the root's topology columns are empty, the child's all set
    root_row, child_row = Session.objects.get(pk=sid), Session.objects.get(pk=child_sid)
    assert (root_row.parent_session_id, root_row.agent_role) == (None, None)
    assert (child_row.parent_session_id, child_row.agent_role) == (sid, "explorer")
    assert all(b.task_name is None and b.parent_branch_id is None for b in Branch.objects.filter(session=sid))
    (child_branch,) = Branch.objects.filter(session=child_sid)
    assert child_branch.task_name == "scout" and child_branch.parent_branch_id == root["branch"]

    # a child session is read-only for people (its parent directs it)
    before = rows(messages=True)
    r = api.post(f"/api/sessions/{child_sid}/turns", {"prompt": "let me in"})
    assert r.status_code == 409 and r.json()["code"] == "child_session_read_only", r.content
    assert rows(messages=True) == before


def test_children_are_hidden_from_the_session_list_but_listed_by_their_parent(team, api_as, run_queued, client):
    """The project's session list shows root sessions only, each child listed under its
    parent; the parent lists its children with list_agents, sorted by task_name."""
    owner, api = api_as(team.owner), api_as(team.member)
    sid, main, _ = root_with_address(api, owner, "ow2", SIMPLE)
    kids = {name: gateway_spawn(api, main, name, f"question {name}") for name in ("zeta", "beta", "scout")}
    for job in kids.values():
        assert api.wait(job["id"], timeout=WAIT)["status"] == "succeeded"

    client.force_login(team.member)
    page = client.get("/p/alpha/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"/s/{sid}/" in html
    for job in kids.values():  # not a row of its own: only a link under its parent's row
        child = job["session"]
        assert html.count(f"/s/{child}/") == 1 and f'href="/s/{child}/" data-child="{child}"' in html, child
    sub = html[html.index('class="small sub-agents"'):]
    assert sub.index(">beta<") < sub.index(">scout<") < sub.index(">zeta<")

    listed = ok(tool(api, main, "list_agents"))
    agents = json.loads(listed["text"])
    assert [a["task_name"] for a in agents] == ["beta", "scout", "zeta"]
    assert all(a["status"] == "completed" and a["started_at"] for a in agents), agents
    assert set(agents[0]) == {"task_name", "status", "started_at"}
    assert listed["details"]["agents"] == agents


def test_duplicate_task_name_is_refused_under_one_parent_only(team, api_as, run_queued):
    """A second child named like an existing one (idle or not) under the same parent is
    refused with duplicate_task_name and writes nothing; another parent session may use the name."""
    owner, api = api_as(team.owner), api_as(team.member)
    sid_a, main_a, _ = root_with_address(api, owner, "ow3", SIMPLE)
    first = gateway_spawn(api, main_a, "dup", "first")

    before = rows()
    refused(tool(api, main_a, "spawn_agent", task_name="dup", message="second"), "duplicate_task_name")
    assert rows() == before
    assert api.wait(first["id"], timeout=WAIT)["status"] == "succeeded"
    refused(tool(api, main_a, "spawn_agent", task_name="dup", message="third, now it is idle"), "duplicate_task_name")

    sid_b = open_session(api, "ow3", "other parent")
    main_b = address_of(user_turn(api, sid_b, "hello"))
    other = gateway_spawn(api, main_b, "dup", "same name, other parent")
    assert other["session"] != first["session"]
    assert api.wait(other["id"], timeout=WAIT)["status"] == "succeeded"
    assert [a["task_name"] for a in json.loads(ok(tool(api, main_a, "list_agents"))["text"])] == ["dup"]
    assert [a["task_name"] for a in json.loads(ok(tool(api, main_b, "list_agents"))["text"])] == ["dup"]


def test_malformed_task_names_and_arguments_are_refused_before_any_row(team, api_as, run_queued):
    """``^[a-z][a-z0-9_]{0,47}$`` — a bad name is invalid_task_name and no
    session, branch, job or message is written; 48 characters is the longest accepted. The schema
    rejects unknown fields and a blank message (invalid_arguments)."""
    from collab.models import Branch

    owner, api = api_as(team.owner), api_as(team.member)
    sid, main, _ = root_with_address(api, owner, "ow4", SIMPLE)
    settle(api, sid)
    before = rows(messages=True)
    for name in ("", "A", "Scout", "scoUt", "1scout", "_scout", "scout-1", "scout 1", "scout.1", "scöut",
                 "a" * 49, "x" + "1" * 48):
        refused(tool(api, main, "spawn_agent", task_name=name, message="look"), "invalid_task_name")
    for arguments in ({"task_name": "fine", "message": "look", "model": "gpt-5"},
                      {"task_name": "fine", "message": "look", "agent_type": "worker"},
                      {"task_name": "fine", "message": "   \n\t "},
                      {"task_name": "fine", "message": ""},
                      {"task_name": "fine"},
                      {"message": "look"},
                      {"task_name": 7, "message": "look"}):
        r = api.post(f"/api/branches/{main}/tools/spawn_agent", {"arguments": arguments})
        assert r.status_code == 200, r.content
        refused(r.json(), "invalid_arguments")
    assert rows(messages=True) == before

    longest = "a" + "b" * 46 + "9"
    assert len(longest) == 48
    job = gateway_spawn(api, main, longest, "the longest name")
    assert api.wait(job["id"], timeout=WAIT)["status"] == "succeeded"
    assert Branch.objects.get(session=job["session"]).task_name == longest
    assert [a["task_name"] for a in json.loads(ok(tool(api, main, "list_agents"))["text"])] == [longest]


# --- three explorers in parallel, aggregated in the same turn --------------------------------------


def test_three_parallel_explorers_are_aggregated_in_the_same_turn(team, api_as, worker):
    """One parent turn spawns three explorers at once, waits, and sees each
    result as an <agent_message> before its next model call — after all tool results, never
    between an assistant's tool calls and their results — exactly once, and its final answer
    aggregates the three bodies. Three waits that deliver never count as a doom loop."""
    owner, api = api_as(team.owner), api_as(team.member)
    openwork_spec(owner, "ow12", {
        "user": [
            step(spawn_call("auth_flow", "question A"), spawn_call("db_layer", "question B"),
                 spawn_call("ui_shell", "question C")),
            step(call("list_agents")),
            # the explorers run side by side: the first wait usually gets all three results, and
            # the later ones then time out (a wait that delivers nothing is not an error)
            step(call("wait_agent", timeout_ms=30_000)),
            step(call("wait_agent", timeout_ms=10_000)),
            step(call("wait_agent", timeout_ms=10_000)),
            {"text": "summary:\n{{mailbox}}"},
        ],
        "spawn": [{"sleep_ms": 1_500}, {"text": "answer to {{prompt}}"}],
    })
    sid = open_session(api, "ow12")
    root = user_turn(api, sid, "research three things")
    results = tool_results(root["id"])
    assert [r["tool"] for r in results] == ["spawn_agent"] * 3 + ["list_agents"] + ["wait_agent"] * 3
    assert not any(r["is_error"] for r in results), results
    listed = json.loads(results[3]["text"])
    assert [a["task_name"] for a in listed] == ["auth_flow", "db_layer", "ui_shell"]
    assert all(a["status"] in ("running", "completed") for a in listed), listed
    waits = [json.loads(r["text"]) for r in results[4:]]
    assert waits[0] == {"delivered": True, "timed_out": False}, waits
    assert all(set(w) == {"delivered", "timed_out"} and w["delivered"] != w["timed_out"] for w in waits)

    # each child is a session of its own that ran one turn to a readable terminal state
    children = {}
    for r in results[:3]:
        child = execution(api, r["details"]["execution_id"])
        assert child["status"] == "succeeded" and child["parent_job"] == root["id"], child
        assert api.get(f"/api/sessions/{child['session']}").json()["parent_session"] == sid
        children[r["details"]["task_name"]] = child

    # the final answer of the same turn aggregates all three bodies
    final = transcript_messages(api, address_of(root))[-1]
    assert final["role"] == "assistant" and final["text"].startswith("summary:")
    got = sorted(envelopes(final["text"]))
    assert got == [("auth_flow", "final_answer", "answer to question A"),
                   ("db_layer", "final_answer", "answer to question B"),
                   ("ui_shell", "final_answer", "answer to question C")], final["text"]

    # drained after all tool results, as user-role agent_message nodes of this turn
    messages = turn_messages(api, root)
    assert messages[0]["role"] == "user" and messages[0]["kind"] == "normal"
    assert messages[-1]["role"] == "assistant" and not messages[-1]["tool_calls"]
    drained = [m for m in messages if m["kind"] == "agent_message"]
    assert len(drained) == 3 and all(m["role"] == "user" for m in drained)
    assert sorted(envelopes("\n".join(m["text"] for m in drained))) == got
    first_wait = next(i for i, m in enumerate(messages) if m["role"] == "tool" and m["tool"] == "wait_agent")
    assert all(messages.index(m) > first_wait for m in drained)  # none before the parent waited
    assert_drained_after_tool_results(messages)

    # exactly once, under the deterministic id agent-msg:{child_session}:{child_job}:{kind}
    rows_ = agent_message_rows(sid)
    assert sorted(m.dedupe_key for m in rows_) == sorted(
        f"agent-msg:{c['session']}:{c['id']}:final_answer" for c in children.values())
    assert all(m.job_id == root["id"] for m in rows_)
    # nothing else was started for the parent
    assert [j["id"] for j in settle(api, sid)] == [root["id"]]


# --- a result after the parent's final answer waits for the next user turn ------------------------


def test_result_after_the_final_answer_starts_no_turn_and_reaches_the_next_user_turn(team, api_as, worker):
    """A child that finishes after the parent's final answer creates no
    parent turn; its envelope is drained exactly once, at the start of the next user turn."""
    from collab.models import Job

    owner, api = api_as(team.owner), api_as(team.member)
    openwork_spec(owner, "ow9", {
        "user": [step(spawn_call("latecomer", "take your time")), {"text": "mail=[{{mailbox}}]"}],
        "spawn": [{"sleep_ms": 3_000}, {"text": "late result"}],
    })
    sid = open_session(api, "ow9")
    first = user_turn(api, sid, "one")
    (spawned,) = tool_results(first["id"])
    child = execution(api, spawned["details"]["execution_id"])
    assert child["status"] not in TERMINAL, child  # the scenario: the parent answered first
    assert transcript_messages(api, address_of(first))[-1]["text"] == "mail=[]"

    assert api.wait(child["id"], timeout=WAIT)["status"] == "succeeded"
    assert [j["id"] for j in settle(api, sid)] == [first["id"]]  # no parent turn was created
    assert Job.objects.get(pk=child["id"]).followup_state == "owed"  # held for the next user turn
    assert agent_message_rows(sid) == []

    second = user_turn(api, sid, "two")
    messages = turn_messages(api, second)
    assert [(m["role"], m["kind"]) for m in messages[:2]] == [("user", "normal"), ("user", "agent_message")]
    assert envelopes(messages[1]["text"]) == [("latecomer", "final_answer", "late result")]
    # the rerun script tries the name again: refused, and the turn goes on
    assert [r["code"] for r in tool_results(second["id"])] == ["duplicate_task_name"]
    assert envelopes(messages[-1]["text"]) == [("latecomer", "final_answer", "late result")]
    (row,) = agent_message_rows(sid)
    assert row.dedupe_key == f"agent-msg:{child['session']}:{child['id']}:final_answer" and row.job_id == second["id"]

    third = user_turn(api, sid, "three")
    assert transcript_messages(api, address_of(third))[-1]["text"] == "mail=[]"
    assert len(agent_message_rows(sid)) == 1
    assert sorted(j["id"] for j in settle(api, sid)) == sorted([first["id"], second["id"], third["id"]])


# --- failed and interrupted children report back too -------------------------------------------------


def test_failed_and_interrupted_children_report_back_and_the_parent_never_hangs(team, api_as, worker):
    """A child that fails (the explorer's doom loop: the same call three
    times; its model-call budget of 15) and one interrupted by interrupt_agent both produce an
    envelope — ``failed`` with ``<code>: <reason>``, ``interrupted`` — so waiting ends."""
    owner, api = api_as(team.owner), api_as(team.member)
    same = call("grep", pattern="needle")
    openwork_spec(owner, "ow10", {
        "user": [
            # a tool step runs all its calls before the next drain: the wait cannot miss the result
            step(spawn_call("looper", "loop please"), call("wait_agent", timeout_ms=60_000)),
            step(call("followup_task", task_name="looper", message="now take long")),
            step(call("interrupt_agent", task_name="looper"), call("wait_agent", timeout_ms=60_000)),
            {"text": "mail=[{{mailbox}}]"},
        ],
        "spawn": [step(same), step(same), step(same), {"text": "never reached"}],
        "task": [{"sleep_ms": LONG_MS}, {"text": "never reached"}],
    })
    sid = open_session(api, "ow10")
    root = user_turn(api, sid, "go")
    results = tool_results(root["id"])
    assert [(r["tool"], r["is_error"]) for r in results] == [
        ("spawn_agent", False), ("wait_agent", False), ("followup_task", False), ("interrupt_agent", False),
        ("wait_agent", False)], results
    assert results[2]["text"] == "Follow-up task started" and results[3]["text"] == "Interrupt requested"
    assert json.loads(results[1]["text"]) == json.loads(results[4]["text"]) == {"delivered": True, "timed_out": False}

    first = execution(api, results[0]["details"]["execution_id"])
    assert first["status"] == "failed" and first["error_code"] == "doom_loop", first
    followup = execution(api, results[2]["details"]["execution_id"])
    assert followup["status"] == "cancelled" and followup["kind"] == "task", followup
    final = transcript_messages(api, address_of(root))[-1]["text"]
    assert envelopes(final) == [
        ("looper", "failed", f"doom_loop: {first['error_reason']}"),
        ("looper", "interrupted", "Sub-agent turn was interrupted."),
    ], final
    assert "repeated 3 times" in first["error_reason"]
    assert sorted(m.dedupe_key for m in agent_message_rows(sid)) == sorted([
        f"agent-msg:{first['session']}:{first['id']}:failed",
        f"agent-msg:{followup['session']}:{followup['id']}:interrupted"])

    # the explorer's model-call budget: 15 calls (all different, so no doom loop), then failed
    openwork_spec(owner, "ow10b", {
        "user": [{"text": "mail=[{{mailbox}}]"}],
        "spawn": [step(call("grep", pattern=f"needle{n}")) for n in range(20)] + [{"text": "never reached"}],
    })
    sid2 = open_session(api, "ow10b")
    main2 = address_of(user_turn(api, sid2, "hello"))
    budget = gateway_spawn(api, main2, "budget", "search forever")
    ended = api.wait(budget["id"], timeout=WAIT)
    assert ended["status"] == "failed" and ended["error_code"] == "max_model_calls", ended
    assert ended["model_calls"] == 15 and ended["tool_calls"] == 15, ended
    nxt = user_turn(api, sid2, "anything back?")
    final = transcript_messages(api, address_of(nxt))[-1]["text"]
    assert envelopes(final) == [("budget", "failed", f"max_model_calls: {ended['error_reason']}")], final


# --- the concurrency limit -------------------------------------------------------------------------


def test_a_fourth_concurrent_spawn_is_refused_and_the_parent_turn_goes_on(team, api_as, worker):
    """With the default max_active_turns=3, a fourth spawn while three child
    turns are open is a failed tool result ``agent_limit_reached`` that writes nothing; the parent
    turn goes on, and once a child's turn ends its slot is free again."""
    from collab.models import Job, Session

    owner, api = api_as(team.owner), api_as(team.member)
    assert owner.get("/api/projects/alpha/limits").json()["max_active_turns"] == 3
    openwork_spec(owner, "ow13", {
        "user": [
            step(spawn_call("one", "slow 1"), spawn_call("two", "slow 2"), spawn_call("three", "slow 3")),
            step(spawn_call("four", "slow 4")),
            step(call("list_agents")),
            step(call("interrupt_agent", task_name="one"), call("wait_agent", timeout_ms=60_000)),
            step(spawn_call("four", "slow 4, again")),
            step(call("interrupt_agent", task_name="two"), call("interrupt_agent", task_name="three"),
                 call("interrupt_agent", task_name="four")),
            {"text": "carried on; mail=[{{mailbox}}]"},
        ],
        "spawn": [{"sleep_ms": LONG_MS}, {"text": "never reached"}],
    })
    sid = open_session(api, "ow13")
    root = user_turn(api, sid, "go wide")
    results = tool_results(root["id"])
    assert [r["tool"] for r in results] == ["spawn_agent"] * 3 + ["spawn_agent", "list_agents", "interrupt_agent",
                                                                   "wait_agent", "spawn_agent"] + ["interrupt_agent"] * 3
    assert [r["code"] for r in results] == [None] * 3 + ["agent_limit_reached"] + [None] * 7, results
    assert results[3]["text"].startswith("agent_limit_reached: ") and results[3]["is_error"]
    assert [(a["task_name"], a["status"]) for a in json.loads(results[4]["text"])] == [
        ("one", "running"), ("three", "running"), ("two", "running")]
    assert json.loads(results[6]["text"]) == {"delivered": True, "timed_out": False}
    final = transcript_messages(api, address_of(root))[-1]["text"]
    assert final.startswith("carried on;")
    assert ("one", "interrupted", "Sub-agent turn was interrupted.") in envelopes(final), final

    # the refused spawn wrote nothing: "four" exists once, from the second attempt
    assert Session.objects.filter(parent_session=sid, title="four").count() == 1
    assert Job.objects.filter(session__parent_session=sid, branch__task_name="four").count() == 1
    jobs = settle(api, sid, *Session.objects.filter(parent_session=sid).values_list("pk", flat=True))
    assert {j["status"] for j in jobs if j["session"] != sid} == {"cancelled"}, jobs
    assert [j["id"] for j in jobs if j["session"] == sid] == [root["id"]]


def test_idle_children_hold_no_slot_and_followup_task_reuses_them(team, api_as, worker):
    """An idle child holds no slot; followup_task starts a new turn
    on it (agent_turn_start_failed while it runs); spawn_agent and followup_task share the limit
    (set here to 2 through the limits API); interrupt_agent needs a running turn; unknown names
    are unknown_agent. Cancelled turns found at the next user turn read ``failed: cancelled``."""
    from collab.models import Job, Session

    owner, api = api_as(team.owner), api_as(team.member)
    assert set_limits(owner, max_active_turns=2)["max_active_turns"] == 2
    r = owner.patch("/api/projects/alpha/limits", {"max_active_turns": 0})
    assert r.status_code == 400, r.content
    sid, main, _ = root_with_address(api, owner, "ow14", {
        "user": [{"text": "mail=[{{mailbox}}]"}],
        "spawn": [{"text": "first answer to {{prompt}}"}],
        "task": [{"sleep_ms": LONG_MS}, {"text": "never reached"}],
    })
    a = gateway_spawn(api, main, "alpha", "question a")
    assert api.wait(a["id"], timeout=WAIT)["status"] == "succeeded"
    b = gateway_spawn(api, main, "bravo", "question b")  # alpha is idle: it holds no slot
    assert api.wait(b["id"], timeout=WAIT)["status"] == "succeeded"
    assert [(x["task_name"], x["status"]) for x in json.loads(ok(tool(api, main, "list_agents"))["text"])] == [
        ("alpha", "completed"), ("bravo", "completed")]

    # reuse an idle child: a new turn in its existing session and branch
    r = ok(tool(api, main, "followup_task", task_name="alpha", message="second question"))
    assert r["text"] == "Follow-up task started"
    a2 = api.wait(r["details"]["execution_id"], {"running"}, timeout=WAIT)
    assert a2["session"] == a["session"] and a2["branch"] == a["branch"] and a2["kind"] == "task"
    before = rows()
    refused(tool(api, main, "followup_task", task_name="alpha", message="third question"), "agent_turn_start_failed")
    assert rows() == before
    assert [(x["task_name"], x["status"]) for x in json.loads(ok(tool(api, main, "list_agents"))["text"])] == [
        ("alpha", "running"), ("bravo", "completed")]

    # the limit is shared by followup_task and spawn_agent
    b2 = execution(api, ok(tool(api, main, "followup_task", task_name="bravo", message="more"))["details"]["execution_id"])
    before = rows()
    refused(tool(api, main, "spawn_agent", task_name="charlie", message="no room"), "agent_limit_reached")
    assert rows() == before
    assert not Session.objects.filter(parent_session=sid, title="charlie").exists()
    assert Job.objects.filter(session__parent_session=sid, status__in=("queued", "running")).count() == 2

    for name in ("alpha", "bravo"):
        assert ok(tool(api, main, "interrupt_agent", task_name=name))["text"] == "Interrupt requested"
    for job in (a2, b2):
        assert api.wait(job["id"], timeout=WAIT)["status"] == "cancelled"
    refused(tool(api, main, "interrupt_agent", task_name="alpha"), "agent_interrupt_failed")
    for name, arguments in (("interrupt_agent", {}), ("followup_task", {"message": "x"})):
        refused(tool(api, main, name, task_name="nobody", **arguments), "unknown_agent")

    # the slots came back when the turns ended
    c = gateway_spawn(api, main, "charlie", "question c")
    assert api.wait(c["id"], timeout=WAIT)["status"] == "succeeded"

    nxt = user_turn(api, sid, "what came back?")
    final = transcript_messages(api, address_of(nxt))[-1]["text"]
    assert sorted(envelopes(final)) == sorted([
        ("alpha", "final_answer", "first answer to question a"),
        ("bravo", "final_answer", "first answer to question b"),
        ("alpha", "failed", "cancelled: Sub-agent turn was cancelled."),
        ("bravo", "failed", "cancelled: Sub-agent turn was cancelled."),
        ("charlie", "final_answer", "first answer to question c"),
    ]), final
    assert len(agent_message_rows(sid)) == 5


# --- the explorer's surface and sandbox ---------------------------------------------------------------


@pytest.fixture
def git_repo(tmp_path):
    return make_git_repo(tmp_path / "repo", "hello from the workspace\n", "first commit of the workspace")


def test_explorer_reads_and_runs_git_but_cannot_write_the_workspace(team, api_as, worker, git_repo):
    """In a real git workspace the explorer's bash runs
    ``git log`` directly (no approval), a write to the workspace is refused by the sandbox and no
    file appears, /tmp is writable. Its tool surface is read/grep/glob/list/bash only: no control
    tool, no plan tool, no collab tool; workspace tools exist only while the project has one."""
    out = io.StringIO()
    call_command("workspace", "alpha", str(git_repo), stdout=out)
    assert "sandboxed with bubblewrap" in out.getvalue(), out.getvalue()
    owner, api = api_as(team.owner), api_as(team.member)
    sid, main, _ = root_with_address(api, owner, "ow15", {
        "user": [{"text": "mail=[{{mailbox}}]"}],
        "spawn": [
            step(call("bash", command="git log --oneline")),
            step(call("bash", command="echo scratch > /tmp/scratch.txt && cat /tmp/scratch.txt")),
            step(call("bash", command="echo x > created.txt")),
            {"text": "write attempt: {{last.text}}"},
        ],
    })
    child = gateway_spawn(api, main, "inspector", "look at the history")
    child = api.wait(child["id"], timeout=WAIT)
    assert child["status"] == "succeeded", child
    assert not (git_repo / "created.txt").exists()

    results = tool_results(child["id"])
    assert [r["tool"] for r in results] == ["bash"] * 3
    git_log, scratch, write = results
    assert not git_log["is_error"] and "first commit of the workspace" in git_log["text"], git_log
    assert not scratch["is_error"] and "scratch" in scratch["text"], scratch
    assert write["is_error"] and "Read-only file system" in write["text"], write
    assert not any(r["code"] for r in results)  # executed by the sandbox, not refused by a gate

    nxt = user_turn(api, sid, "what did it find?")
    (got,) = envelopes(transcript_messages(api, address_of(nxt))[-1]["text"])
    assert got[:2] == ("inspector", "final_answer") and "Read-only file system" in got[2], got

    # the explorer's surface, through the gateway on its own branch
    kid = address_of(child)
    assert "hello from the workspace" in ok(tool(api, kid, "read", path="hello.txt"))["text"]
    assert "hello.txt" in ok(tool(api, kid, "list", path="."))["text"]
    assert "hello.txt" in ok(tool(api, kid, "grep", pattern="workspace"))["text"]
    assert "hello.txt" in ok(tool(api, kid, "glob", pattern="*.txt"))["text"]
    assert "first commit" in ok(tool(api, kid, "bash", command="git log --oneline"))["text"]
    for name in CONTROL_TOOLS + ["todo_list", "todo_create", "agent", "send_message", "write", "edit",
                                 "read_conversation", "archive_agent"]:
        refused(tool(api, kid, name), "unknown_tool")
    assert not (git_repo / "created.txt").exists()
    # the parent has the workspace tools too, and its control tools
    assert "hello from the workspace" in ok(tool(api, main, "read", path="hello.txt"))["text"]

    # no workspace, no workspace tools (for the child as for the parent)
    call_command("workspace", "alpha", "--clear", stdout=io.StringIO())
    for address in (kid, main):
        refused(tool(api, address, "read", path="hello.txt"), "unknown_tool")
        refused(tool(api, address, "bash", command="ls"), "unknown_tool")
    ok(tool(api, main, "list_agents"))


# --- wait_agent timeouts, deliveries, doom loop, cancel ----------------------------------------------


def test_wait_times_out_then_delivers_and_three_timeouts_in_a_row_are_a_doom_loop(team, api_as, worker):
    """After a timeout the model goes on and may wait again; a delivery
    resets the timeout count (T, D, T, T does not end the turn); the third timeout in a row ends
    the turn as failed ``doom_loop``. (Costs about 42 s: timeout_ms has a 10 s minimum.)"""
    owner, api = api_as(team.owner), api_as(team.member)
    openwork_spec(owner, "ow18", {
        "user": [step(spawn_call("slowpoke", "take 12 s"))] + [step(call("wait_agent", timeout_ms=10_000))] * 5
                + [{"text": "unreachable"}],
        "spawn": [{"sleep_ms": 12_000}, {"text": "slow answer"}],
    })
    sid = open_session(api, "ow18")
    root = api.wait(turn(api, sid, "wait for it"), timeout=120)
    assert root["status"] == "failed" and root["error_code"] == "doom_loop" and root["is_error"], root
    assert "3 times" in root["error_reason"], root
    results = tool_results(root["id"])
    assert [r["tool"] for r in results] == ["spawn_agent"] + ["wait_agent"] * 5
    waits = [json.loads(r["text"]) for r in results[1:]]
    timeout, delivered = {"delivered": False, "timed_out": True}, {"delivered": True, "timed_out": False}
    assert waits == [timeout, delivered, timeout, timeout, timeout], waits
    assert all(not r["is_error"] for r in results)

    messages = turn_messages(api, root)
    assert not any(m["role"] == "assistant" and m["text"] == "unreachable" for m in messages)
    (drained,) = [m for m in messages if m["kind"] == "agent_message"]
    assert envelopes(drained["text"]) == [("slowpoke", "final_answer", "slow answer")]
    second_wait = [i for i, m in enumerate(messages) if m["role"] == "tool" and m["tool"] == "wait_agent"][1]
    assert messages.index(drained) == second_wait + 1  # right after the wait that delivered it
    assert_drained_after_tool_results(messages)


def test_cancelling_the_parent_ends_wait_agent_at_once(team, api_as, worker):
    """A parent cancelled while in wait_agent(600000) stops at once (and its
    child with it: the cancel cascades). wait_agent outside 10000..600000 is a parameter error; with a
    result already owed it answers at once."""
    from collab.models import Message

    owner, api = api_as(team.owner), api_as(team.member)
    openwork_spec(owner, "ow18c", {
        "user": [step(spawn_call("sleeper", "sleep")), step(call("wait_agent", timeout_ms=600_000)),
                 {"text": "unreachable"}],
        # the child cannot end by itself within WAIT, so neither can the wait for it: a parent
        # that ends within WAIT was ended by the cancel
        "spawn": [{"sleep_ms": UNENDING_MS}, {"text": "never reached"}],
    })
    sid = open_session(api, "ow18c")
    root_id = turn(api, sid, "wait forever")
    def waiting():
        calls = [c for m in Message.objects.filter(job_id=root_id, role="assistant", tool_calls__isnull=False)
                 for c in m.tool_calls]
        return any(c["name"] == "wait_agent" for c in calls)

    poll(waiting, what="the parent to call wait_agent")
    assert cancel(api, root_id).status_code == 202
    ended = api.wait(root_id, timeout=WAIT)
    assert ended["status"] == "cancelled", ended
    (child_id,) = [r["details"]["execution_id"] for r in tool_results(root_id) if r["tool"] == "spawn_agent"]
    assert api.wait(child_id, timeout=WAIT)["status"] == "cancelled"

    main = address_of(ended)
    for bad in (9_999, 600_001, 0):
        refused(tool(api, main, "wait_agent", timeout_ms=bad), "invalid_arguments")
    # answered because a result was there, not because the 10 s ran out
    assert ok(tool(api, main, "wait_agent", timeout_ms=10_000))["details"] == {"delivered": True, "timed_out": False}


# --- reconciliation after a dead worker (docs/contract.md#crash-recovery) ---------------------------


def one_idle_one_busy(api, owner, agent_id, script, idle, busy):
    """A root whose two children finished their first turn; then ``busy`` got a follow-up turn
    that runs for LONG_MS. Returns (sid, main address, root job, idle child job, busy child job,
    the running follow-up job)."""
    sid, main, first = root_with_address(
        api, owner, agent_id, {**script, "task": [{"sleep_ms": LONG_MS}, {"text": "never reached"}]})
    jobs = [gateway_spawn(api, main, name, message) for name, message in (idle, busy)]
    for job in jobs:
        assert api.wait(job["id"], timeout=WAIT)["status"] == "succeeded"
    r = ok(tool(api, main, "followup_task", task_name=busy[0], message="a long one"))
    running = api.wait(r["details"]["execution_id"], {"running"}, timeout=WAIT)
    return sid, main, first, jobs[0], jobs[1], running


def test_reconciliation_reports_interrupted_children_once_and_starts_no_parent_turn(team, api_as, worker):
    """A child turn whose worker died (its lease ran out)
    becomes ``interrupted`` through ``manage.py reconcile``; that starts no parent turn and never
    re-runs the child. The parent's next user turn receives the completed results and the
    interruption notice exactly once."""
    from collab.models import Job, Message

    owner, api = api_as(team.owner), api_as(team.member)
    sid, main, first, finished, crashed, long_turn = one_idle_one_busy(
        api, owner, "ow19", {"user": [{"text": "mail=[{{mailbox}}]"}], "spawn": [{"text": "done: {{prompt}}"}]},
        ("finished", "question one"), ("crashed", "question two"))

    # the worker running it "dies": its lease runs out (a live worker renews it every ~0.2 s, so
    # expire and reconcile until the reconciler saw it expired)
    def reconciled():
        Job.objects.filter(pk=long_turn["id"], status="running").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1))
        call_command("reconcile", stdout=io.StringIO())
        return execution(api, long_turn["id"])["status"] != "running"

    poll(reconciled, timeout=20, interval=0.1, what="the reconciler to interrupt the child turn")
    ended = execution(api, long_turn["id"])
    assert ended["status"] == "interrupted" and ended["error_code"] == "interrupted" and ended["is_error"], ended
    assert Message.objects.filter(job_id=long_turn["id"], role="assistant").count() == 0  # not re-run

    # no parent turn, no follow-up job; reconciling again changes nothing
    assert [j["id"] for j in settle(api, sid)] == [first["id"]]
    assert not Job.objects.filter(followup_of_id=long_turn["id"]).exists()
    call_command("reconcile", stdout=io.StringIO())
    assert execution(api, long_turn["id"])["version"] == ended["version"]
    assert [j["id"] for j in executions(api, sid)] == [first["id"]]
    assert agent_message_rows(sid) == []

    # the next user turn gets each result once
    nxt = user_turn(api, sid, "after the restart")
    final = transcript_messages(api, address_of(nxt))[-1]["text"]
    assert sorted(envelopes(final)) == sorted([
        ("finished", "final_answer", "done: question one"),
        ("crashed", "final_answer", "done: question two"),
        ("crashed", "interrupted", "Sub-agent was interrupted by a process restart and is no longer available. "
                                   "Spawn a new explorer if this result is still needed."),
    ]), final
    keys = sorted(m.dedupe_key for m in agent_message_rows(sid))
    assert keys == sorted([f"agent-msg:{finished['session']}:{finished['id']}:final_answer",
                           f"agent-msg:{crashed['session']}:{crashed['id']}:final_answer",
                           f"agent-msg:{crashed['session']}:{long_turn['id']}:interrupted"])
    call_command("reconcile", stdout=io.StringIO())
    again = user_turn(api, sid, "anything else?")
    assert transcript_messages(api, address_of(again))[-1]["text"] == "mail=[]"
    assert len(agent_message_rows(sid)) == 3


# --- deleting the parent cascades ----------------------------------------------------------------------


def test_deleting_the_parent_session_deletes_its_children(team, api_as, worker):
    """Deleting a root session deletes its child sessions with their branches, jobs,
    messages and events — an idle child and one with a running turn alike — and the running child
    turn stops without writing anything back."""
    from collab.models import Branch, Event, Job, Message, Session

    owner, api = api_as(team.owner), api_as(team.member)
    sid, main, _, idle, busy, running = one_idle_one_busy(
        api, owner, "ow22", {"user": [{"text": "ok"}], "spawn": [{"text": "idle now"}]},
        ("idle_kid", "quick"), ("busy_kid", "quick too"))
    children = [idle["session"], busy["session"]]
    everything = [sid, *children]
    for model in (Branch, Job, Message, Event):
        assert model.objects.filter(session__in=children).exists(), model

    log_start = len(worker.log.read_bytes())
    Session.objects.get(pk=sid).delete()

    def gone():
        return not any(model.objects.filter(**{("pk__in" if model is Session else "session__in"): everything})
                       .exists() for model in (Session, Branch, Job, Message, Event))

    assert gone()
    for s in everything:
        assert api.get(f"/api/sessions/{s}").status_code == 404
    # the running child's task handed it to a slot of a worker (django-q2 logs every task it
    # ends: "Processed '<function>' (<task name>)"); the process's stop watch sees its row gone
    # within a beat and the turn stops, writing nothing back
    task = f"(turn-{running['id']})"
    assert f"Processed 'collab.tasks.run_turn' {task}" in worker.log.read_bytes().decode(errors="replace")
    time.sleep(3)  # several stop-watch beats: a turn that did not stop would still be running here
    written = worker.log.read_bytes()[log_start:].decode(errors="replace")
    assert gone()
    assert worker.poll() is None
    # the interrupted turn ended quietly: no traceback from finishing a job whose rows are gone
    assert "DoesNotExist" not in written and "Traceback" not in written, written[-3000:]


# --- on the wire: a real provider's requests ---------------------------------------------------------


@pytest.fixture(scope="module")
def fake_llm():
    from tests.collab.fake_llm import FakeLLM

    server = FakeLLM().start()
    yield server
    server.stop()


def test_openai_requests_carry_the_rules_the_explorer_prompt_and_end_with_the_envelope(
    team, api_as, worker, fake_llm
):
    """Over the OpenAI Chat Completions wire: the
    root's system prompt ends with the delegation rules carrying max_active_turns and it is offered
    the five control tools (plus its plan tools; no workspace, no collab tools); the explorer gets EXPLORER_SYSTEM_PROMPT and no
    tools; the request that carries a drained <agent_message> ends with that user message, right
    after the tool results."""
    from collab.models import ModelConnection
    from collab.runtime.prompts import EXPLORER_SYSTEM_PROMPT, delegation_rules
    from tests.collab.fake_llm import OpenAIDialect as D

    fake_llm.reset()

    def respond(request):
        stream = bool(request.body.get("stream"))
        messages = D.messages(request)
        if D.system(request) == EXPLORER_SYSTEM_PROMPT:
            return D.text("the answer is 42", stream=stream)
        if any(m["role"] == "user" and "<agent_message>" in (m.get("content") or "") for m in messages):
            return D.text("root saw the answer", stream=stream)
        tool_messages = sum(1 for m in messages if m["role"] == "tool")
        if not tool_messages:
            return D.tools([("call_spawn", "spawn_agent", {"task_name": "scout", "message": "find the answer"})],
                           stream=stream)
        return D.tools([(f"call_wait_{tool_messages}", "wait_agent", {"timeout_ms": 60_000})], stream=stream)

    fake_llm.responder = respond
    owner, api = api_as(team.owner), api_as(team.member)
    set_limits(owner, max_active_turns=2)
    ModelConnection.objects.update_or_create(name="ow-fake", defaults={
        "provider": "openai", "base_url": fake_llm.url + "/v1", "key_env": OW_KEY_ENV, "all_projects": True})
    r = owner.post("/api/projects/alpha/agent-specs", {
        "agent_id": "lead", "provider": "openai", "model": "fake-model", "connection": "ow-fake",
        "system_prompt": "You are the lead.", "toolset": "openwork"})
    assert r.status_code == 201, r.content
    sid = open_session(api, "lead")
    root = user_turn(api, sid, "what is the answer?")
    assert transcript_messages(api, address_of(root))[-1]["text"] == "root saw the answer"

    requests = list(fake_llm.requests)
    explorer = [q for q in requests if D.system(q) == EXPLORER_SYSTEM_PROMPT]
    lead = [q for q in requests if D.system(q) != EXPLORER_SYSTEM_PROMPT]
    assert len(explorer) == 1 and 2 <= len(lead) <= 4, [D.system(q)[:40] for q in requests]

    system = D.system(lead[0])
    assert system.startswith("You are the lead.") and system.endswith(delegation_rules(2)), system
    assert "up to 2 read-only explorer turns" in system
    offered = set(D.tool_names(lead[0]))
    # the five control tools and the plan tools; no collab delegation tools; no workspace tools
    assert offered >= set(CONTROL_TOOLS) and offered - set(CONTROL_TOOLS) <= PLAN_TOOLS, sorted(offered)

    assert D.tool_names(explorer[0]) == []
    assert any("find the answer" in text for text in D.user_texts(explorer[0]))

    carrying = [q for q in lead if any("<agent_message>" in (m.get("content") or "")
                                       for m in D.messages(q) if m["role"] == "user")]
    assert carrying and carrying[0] is lead[-1]
    messages = D.messages(carrying[0])
    assert messages[-1]["role"] == "user", messages[-2:]
    assert envelopes(messages[-1]["content"]) == [("scout", "final_answer", "the answer is 42")]
    assert messages[-2]["role"] == "tool", messages[-3:]
    for i, m in enumerate(messages):  # every assistant(tool_calls) is followed by its tool results
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            assert [x.get("tool_call_id") for x in messages[i + 1:i + 1 + len(ids)]] == ids, messages
