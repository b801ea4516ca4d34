"""The ``collab`` toolset (docs/contract.md#the-collab-toolset).

Almost everything goes through the public tool gateway
``POST /api/branches/{address}/tools/{tool}`` and the branch API. State is built
through the API and services; turns that no test needs a real worker for are
run in this process exactly as a worker runs them (``run_job``), so most tests
use the fast ``db`` fixture. Tests that need background work (stage-2 naming,
a blocking ``job_output`` on a real background run, nested foreground spawns
inside a worker) use the real ``worker`` process.
"""

import itertools
import json
import re
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collab.models import Branch, Job, Message, Session, Todo
from tests.conftest import poll, wait_at_rest

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
MAX_WALK_QUERIES = 100  # one tool call whose ownership walk stops: the request's own reads (~15) + at most 64 levels
_spec_ids = itertools.count()


# --- helpers ---------------------------------------------------------------------------------


def call(api, address, tool, **arguments) -> dict:
    """Run a collab tool as the branch at ``address`` through the gateway; the tool result."""
    r = api.post(f"/api/branches/{address}/tools/{tool}", {"arguments": arguments})
    assert r.status_code == 200, r.content
    body = r.json()
    assert set(body) >= {"text", "details", "is_error"}, body
    return body


def error_code(result: dict) -> str | None:
    return result["details"].get("code") if result["is_error"] else None


def run_inline(job_id: str) -> Job:
    """Run a queued job in this process, exactly as a worker runs it (no worker needed)."""
    from collab.runtime.loop import run_job

    if run_job(job_id) is None:
        # Only a test on committed rows (``transaction=True``) enqueues the job for real, and then
        # this run's worker processes, if a module before started them, may have taken it first.
        assert not connection.in_atomic_block, f"job {job_id} could not be claimed"
        poll(lambda: Job.objects.get(pk=job_id).status in TERMINAL, what=f"job {job_id}, taken by a worker")
    return Job.objects.get(pk=job_id)


def branch(branch_id: str) -> Branch:
    return Branch.objects.select_related("tip").get(pk=branch_id)


def spawn(agent, prompt, description="", **extra) -> Branch:
    """A foreground ``agent`` call through the gateway (a worker runs the child: ``run_queued`` here); the new branch."""
    result = call(agent.api, agent.address, "agent", prompt=prompt, description=description, **extra)
    assert not result["is_error"], result
    job = Job.objects.get(pk=result["details"]["execution_id"])
    return branch(job.branch_id)


@pytest.fixture
def open_session(team, api_as, run_queued):
    """``make(user, script=[], project="alpha", title=…, prompt=…)``: through the API, a session
    with a scripted agent and one finished user turn on its main branch (run in-process).
    Returns a namespace: ``api`` (as ``user``), ``sid``, ``branch`` (main), ``address`` (its tip)."""
    specs = {}

    def make(user=None, script=(), project="alpha", title="test", prompt="hello there"):
        user = user or team.member
        key = (project, json.dumps(script))
        if key not in specs:
            admin = api_as(team.owner if project == "alpha" else team.outsider)
            agent_id = f"bot{next(_spec_ids)}"
            r = admin.post(f"/api/projects/{project}/agent-specs",
                           {"agent_id": agent_id, "provider": "scripted", "script": list(script)})
            assert r.status_code == 201, r.content
            specs[key] = agent_id
        api = api_as(user)
        r = api.post(f"/api/projects/{project}/sessions", {"title": title, "agent_id": specs[key]})
        assert r.status_code == 201, r.content
        sid = r.json()["id"]
        r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
        assert r.status_code == 202, r.content
        assert run_inline(r.json()["execution_id"]).status == "succeeded"
        main = Branch.objects.select_related("tip").get(session_id=sid, name="main")
        return SimpleNamespace(api=api, sid=sid, branch=main, address=main.address, user=user)

    return make


def make_job(session_id, branch_obj, *, caller_session=None, parent_job=None, status="succeeded",
             result="done", kind="task") -> Job:
    """A Job row for ownership/listing tests (selectors only: nothing runs it)."""
    now = timezone.now()
    s = Session.objects.get(pk=session_id)
    return Job.objects.create(
        project_id=s.project_id, session=s, branch=branch_obj, kind=kind, status=status,
        caller_session_id=caller_session, parent_job=parent_job, result_text=result,
        started_at=None if status == "queued" else now,
        finished_at=now if status in TERMINAL else None,
    )


def parse_dt(value: str):
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# === 1. the address resolver (docs/contract.md#addresses) ===================================


def test_stale_sid_head_finds_the_branch_and_delivers_at_its_current_tip(team, open_session):
    """A stale ``SID:HEAD`` (an older message written on the branch) still finds its
    branch, and the delivery is made at the branch's *current* tip, not at the stale node."""
    a = open_session()
    helper = spawn(a, "first task", description="helper")
    stale = f"{a.sid}:{helper.tip.predecessor_id}"  # the spawn prompt node: no longer the tip
    assert Message.objects.get(pk=helper.tip.predecessor_id).branch_id == helper.pk
    assert stale != helper.address

    got = call(a.api, a.address, "send_message", message="ping", to=stale)
    assert not got["is_error"], got
    assert got["details"]["to"] == helper.address  # the current tip, ready to use
    job = Job.objects.get(pk=got["details"]["delivery_id"])
    assert job.branch_id == helper.pk and job.kind == "message"
    assert job.parent_msg_id == helper.tip_id  # admitted at the current tip
    assert job.prompt_msg.predecessor_id == helper.tip_id

    # agent(to=…) and read_conversation use the same resolver
    helper2 = spawn(a, "other task", description="helper2")
    stale2 = f"{a.sid}:{helper2.tip.predecessor_id}"
    task = call(a.api, a.address, "agent", prompt="do more", to=stale2)
    assert not task["is_error"], task
    assert Job.objects.get(pk=task["details"]["execution_id"]).branch_id == helper2.pk
    read = call(a.api, a.address, "read_conversation", session_id=stale2)
    assert read["details"]["branch"] == helper2.pk


def test_a_name_resolves_in_the_callers_session_first_then_across_visible_sessions(team, open_session):
    """A name resolves within the caller's session first, then across sessions the
    caller may see (never in another project's sessions)."""
    s1 = open_session(title="one")
    s2 = open_session(title="two")
    h1 = spawn(s1, "work in one", description="helper")
    h2 = spawn(s2, "work in two", description="helper")
    scout = spawn(s2, "scouting", description="scout")
    outsider = open_session(team.outsider, project="beta")
    spawn(outsider, "theirs", description="lonely")

    got = call(s1.api, s1.address, "send_message", message="hi", to="helper")
    assert got["details"]["to"] == h1.address, got
    got = call(s2.api, s2.address, "send_message", message="hi", to="helper")
    assert got["details"]["to"] == h2.address, got
    # not in the caller's session: found in another visible session
    got = call(s1.api, s1.address, "agent", prompt="go", to="scout")
    assert not got["is_error"], got
    assert Job.objects.get(pk=got["details"]["execution_id"]).branch_id == scout.pk
    # another project's branch of that name is never found
    got = call(s1.api, s1.address, "send_message", message="hi", to="lonely")
    assert error_code(got) == "not_found", got


def test_an_ambiguous_name_is_an_error_listing_candidates_never_a_guess(team, open_session):
    """An ambiguous name returns the candidates (each with its ``SID:HEAD``) as an error
    with code ``ambiguous_target``; nothing is delivered."""
    s1, s2, s3 = open_session(title="one"), open_session(title="two"), open_session(title="three")
    h1 = spawn(s1, "work in one", description="helper")
    h2 = spawn(s2, "work in two", description="helper")
    outsider = open_session(team.outsider, project="beta")
    spawn(outsider, "theirs", description="helper")  # invisible: never a candidate
    jobs_before = Job.objects.count()

    for tool, args in (("send_message", {"message": "hi"}), ("agent", {"prompt": "go"}),
                       ("archive_agent", {}), ("read_conversation", {})):
        key = "session_id" if tool == "read_conversation" else "to"
        got = call(s3.api, s3.address, tool, **args, **{key: "helper"})
        assert got["is_error"] and error_code(got) == "ambiguous_target", (tool, got)
        assert sorted(got["details"]["candidates"]) == sorted([h1.address, h2.address]), got
        assert h1.address in got["text"] and h2.address in got["text"]
        assert "SID:HEAD" in got["text"]
    assert Job.objects.count() == jobs_before
    assert not Branch.objects.filter(archived=True).exists()


def test_missing_and_invisible_targets_answer_identically(team, open_session):
    """A target that does not exist and one in another project (the
    outsider's) give the same "not found" result, for names and for ``SID:HEAD`` alike, on every
    resolving tool; nothing is created."""
    a = open_session()
    tools = [("send_message", "to", {"message": "hi"}), ("agent", "to", {"prompt": "go"}),
             ("archive_agent", "to", {}), ("read_conversation", "session_id", {})]

    def probe(ref):
        return [call(a.api, a.address, tool, **args, **{key: ref}) for tool, key, args in tools]

    missing_name = probe("ghost")
    outsider = open_session(team.outsider, project="beta")
    ghost = spawn(outsider, "secret work", description="ghost")
    invisible_name = probe("ghost")
    assert invisible_name == missing_name
    assert all(error_code(r) == "not_found" for r in missing_name), missing_name

    invisible_addr = probe(ghost.address)
    invisible_sid = probe(outsider.sid)
    alpha_counts = (Branch.objects.filter(session__project=team.alpha).count(),
                    Job.objects.filter(project=team.alpha).count())
    Session.objects.filter(pk=outsider.sid).delete()
    assert probe(ghost.address) == invisible_addr
    assert probe(outsider.sid) == invisible_sid
    assert all(error_code(r) == "not_found" for r in invisible_addr + invisible_sid)
    for r in invisible_addr + invisible_sid:
        assert "secret" not in r["text"]
    assert not Branch.objects.filter(name="ghost", session__project=team.alpha).exists()
    assert alpha_counts == (Branch.objects.filter(session__project=team.alpha).count(),
                            Job.objects.filter(project=team.alpha).count())  # nothing created or started
    assert Job.objects.filter(project=team.alpha).count() == 1  # a's own user turn only


def test_delivery_to_the_callers_own_branch_is_rejected(team, open_session):
    """The resolver rejects delivery to the caller's own current branch (code
    ``self_delivery``), by address, stale address or name."""
    a = open_session()
    stale_own = f"{a.sid}:{a.branch.tip.predecessor_id}"
    jobs = Job.objects.count()
    for to in (a.address, stale_own, "main"):
        got = call(a.api, a.address, "send_message", message="me", to=to)
        assert error_code(got) == "self_delivery", (to, got)
        got = call(a.api, a.address, "agent", prompt="me", to=to)
        assert error_code(got) == "self_delivery", (to, got)
    assert Job.objects.count() == jobs


def test_send_message_to_new_is_invalid_and_nothing_is_created(team, open_session):
    """``to="new"`` is not a way to create an agent."""
    a = open_session()
    counts = (Branch.objects.count(), Job.objects.count())
    for to in ("new", "NEW", " new "):
        got = call(a.api, a.address, "send_message", message="hello", to=to)
        assert got["is_error"] and error_code(got) == "invalid_target", got
        assert "agent(" in got["text"]
    assert (Branch.objects.count(), Job.objects.count()) == counts


def test_send_message_agent_id_is_the_recipients_own_or_refused(team, open_session):
    """``send_message(message, to, agent_id="main")``: a message runs
    with the recipient's own saved configuration (``agent_id`` never addresses a branch or
    changes who answers). The default, or the recipient's own ``agent_id``, delivers;
    another one is refused (``agent_id_mismatch``) and nothing is delivered."""
    a = open_session()
    helper = spawn(a, "some work", description="helper")
    own = Session.objects.select_related("agent_spec").get(pk=a.sid).agent_spec.agent_id
    jobs = Job.objects.count()
    for other in ("someone-else", "bot-not-saved"):
        got = call(a.api, a.address, "send_message", message="hi", to="helper", agent_id=other)
        assert error_code(got) == "agent_id_mismatch", got
        assert repr(own) in got["text"] and repr(other) in got["text"], got["text"]
    assert Job.objects.count() == jobs
    for agent_id in ("main", own):
        got = call(a.api, a.address, "send_message", message=f"hi as {agent_id}", to=helper.address, agent_id=agent_id)
        assert not got["is_error"], got
    assert not call(a.api, a.address, "send_message", message="hi by default", to="helper")["is_error"]


def test_archived_targets_are_refused_by_the_resolver(team, open_session):
    """Deliveries to an archived branch are refused (code ``archived``)."""
    a = open_session()
    helper = spawn(a, "some work", description="helper")
    call(a.api, a.address, "archive_agent", to=helper.address)
    jobs = Job.objects.count()
    for tool, args in (("send_message", {"message": "hi"}), ("agent", {"prompt": "go"})):
        for to in (helper.address, "helper"):
            got = call(a.api, a.address, tool, to=to, **args)
            assert error_code(got) == "archived", (tool, to, got)
            assert "archived" in got["text"]
    assert Job.objects.count() == jobs


def test_an_archived_branch_answers_to_its_name_only_when_no_live_branch_does(team, open_session):
    """By name, an archived branch stays readable and re-archivable
    (idempotent) and deliveries to it hear "archived"; a live branch of the same name wins."""
    a = open_session()
    old = spawn(a, "old work", description="helper")
    call(a.api, a.address, "archive_agent", to="helper", reason="first")
    read = call(a.api, a.address, "read_conversation", session_id="helper")
    assert not read["is_error"] and read["details"]["branch"] == old.pk and read["details"]["archived"] is True
    again = call(a.api, a.address, "archive_agent", to="helper", reason="second")
    assert not again["is_error"] and again["details"]["reason"] == "first", again
    assert error_code(call(a.api, a.address, "send_message", to="helper", message="hi")) == "archived"
    new = spawn(a, "new work", description="helper")
    got = call(a.api, a.address, "send_message", to="helper", message="hi")
    assert not got["is_error"] and got["details"]["to"] == new.address, got
    assert call(a.api, a.address, "read_conversation", session_id="helper")["details"]["branch"] == new.pk


def test_schemas_reject_unknown_fields_and_unknown_tools(team, open_session):
    """Schemas reject unknown fields (``invalid_arguments``); an unknown tool answers
    ``unknown_tool``; no tool named job_stop/task_stop exists. Errors are results."""
    a = open_session()
    got = call(a.api, a.address, "send_message", message="hi", to="main", bogus=1)
    assert got["is_error"] and error_code(got) == "invalid_arguments", got
    assert "bogus" in got["text"]
    got = call(a.api, a.address, "list_agents", scope="everything")
    assert error_code(got) == "invalid_arguments", got
    got = call(a.api, a.address, "agent")  # prompt missing
    assert error_code(got) == "invalid_arguments", got
    for name in ("nope", "job_stop", "task_stop", "spawn_agent"):
        got = call(a.api, a.address, name)
        assert got["is_error"] and error_code(got) == "unknown_tool", (name, got)
    r = a.api.post(f"/api/branches/{a.address}/tools/list_agents", {"arguments": {}, "extra": 1})
    assert r.status_code in (400, 422), r.content


def test_agent_with_to_refuses_creation_only_arguments(team, open_session):
    """With ``to``, a real ``start_from`` and ``archive_when_done=True`` are errors."""
    a = open_session()
    helper = spawn(a, "x", description="helper")
    jobs = Job.objects.count()
    got = call(a.api, a.address, "agent", prompt="go", to=helper.address, start_from="inherit")
    assert error_code(got) == "invalid_arguments", got
    got = call(a.api, a.address, "agent", prompt="go", to=helper.address, archive_when_done=True)
    assert error_code(got) == "invalid_arguments", got
    assert Job.objects.count() == jobs


# === 2. list_agents (docs/contract.md#list_agents) ==============================================

ROW = re.compile(r'^  - (?P<name>.+?)  to="(?P<to>[0-9a-f]+:[0-9a-f]+)"  \u2014 (?P<turns>\d+) turns, (?P<size><1k chars|~\d+k chars)')


def rows_of(text):
    return [m.groupdict() for line in text.splitlines() if (m := ROW.match(line))]


def test_list_agents_session_scope_rows_addresses_sizes_and_previews(team, open_session):
    """``scope="session"`` lists this session's branches, each with a ready-to-use
    ``to="SID:HEAD"`` (the tip), ``— N turns, ~Nk chars`` (``<1k chars`` under 1000) and a tail preview."""
    a = open_session(title="Lister")
    small = spawn(a, "tiny job", description="small")
    big = spawn(a, "elaborate " * 300, description="big")  # ~3000 chars of prompt
    assert small.chars < 1000 <= big.chars
    archived = spawn(a, "old", description="old-one")
    call(a.api, a.address, "archive_agent", to=archived.address)

    got = call(a.api, a.address, "list_agents")
    assert not got["is_error"], got
    lines = got["text"].splitlines()
    assert lines[0].startswith(f"session {a.sid} \u00b7 Lister \u00b7 agent bot") and lines[0].endswith("idle"), lines[0]
    rows = {r["name"]: r for r in rows_of(got["text"])}
    assert set(rows) == {"main", "small", "big"}, got["text"]  # archived ones are hidden
    assert rows["small"]["to"] == small.address and rows["big"]["to"] == big.address
    assert rows["main"]["to"] == branch(a.branch.pk).address
    assert rows["small"]["size"] == "<1k chars" and rows["small"]["turns"] == "1"
    assert rows["big"]["size"] == f"~{round(big.chars / 1000)}k chars" and big.chars >= 1000
    # previews: the tail of the tip
    small_line = next(line for line in lines if line.startswith("  - small "))
    assert "\u2026" in small_line and "ok: tiny job" in small_line, small_line
    details = got["details"]
    assert details["scope"] == "session" and [s["session_id"] for s in details["sessions"]] == [a.sid]
    by_name = {b["name"]: b for b in details["sessions"][0]["branches"]}
    assert by_name["big"] == {**by_name["big"], "address": big.address, "turns": 1, "chars": big.chars,
                              "busy": False, "archived": False}


def test_list_agents_archived_scope_shows_only_archived_branches(team, open_session):
    """``scope="archived"`` lists this session's archived branches, which the
    other views hide for every caller."""
    a = open_session()
    keep = spawn(a, "keep", description="keep")
    gone = spawn(a, "gone", description="gone")
    call(a.api, a.address, "archive_agent", to=gone.address, reason="finished")
    got = call(a.api, a.address, "list_agents", scope="archived")
    assert [r["name"] for r in rows_of(got["text"])] == ["gone"], got["text"]
    assert got["details"]["sessions"][0]["branches"][0]["archive_reason"] == "finished"
    # hidden from everyone's normal views, not just the archiver's
    other = open_session(team.owner)
    for scope in ("session", "all"):
        names = [r["name"] for r in rows_of(call(a.api, a.address, "list_agents", scope=scope)["text"])]
        assert "gone" not in names and "keep" in names
    names = [r["name"] for r in rows_of(call(other.api, other.address, "list_agents", scope="all")["text"])]
    assert "gone" not in names and keep.name in names


def test_list_agents_all_scope_groups_visible_sessions_recent_first_without_previews(team, open_session):
    """``scope="all"`` covers every session the caller may see, grouped by session, most
    recently active first, with no previews; other projects' sessions never appear."""
    old = open_session(title="Older")
    spawn(old, "older work", description="o-helper")
    new = open_session(title="Newer")
    spawn(new, "newer work", description="n-helper")
    mine = open_session(title="Mine")
    outsider = open_session(team.outsider, project="beta", title="Theirs")
    spawn(outsider, "their work", description="t-helper")

    got = call(mine.api, mine.address, "list_agents", scope="all")
    text = got["text"]
    session_lines = [line for line in text.splitlines() if line.startswith("session ")]
    sids = [line.split()[1] for line in session_lines]
    assert sids == [mine.sid, new.sid, old.sid], text  # most recently active first
    assert outsider.sid not in text and "Theirs" not in text and "t-helper" not in text
    assert "\u2026" not in text and "ok: " not in text  # no previews
    # grouping: each branch row follows its own session line
    current, owner_of = None, {}
    for line in text.splitlines():
        if line.startswith("session "):
            current = line.split()[1]
        elif (m := ROW.match(line)):
            owner_of[m["name"], m["to"].split(":")[0]] = current
    assert all(sid == current_sid for (_, current_sid), sid in owner_of.items()), owner_of
    assert ("n-helper", new.sid) in owner_of and ("o-helper", old.sid) in owner_of
    assert [s["session_id"] for s in got["details"]["sessions"]] == [mine.sid, new.sid, old.sid]


def test_list_agents_marks_busy_and_idle(team, open_session):
    """Session rows carry busy/idle; a branch with a running turn is marked busy."""
    a = open_session(title="Busy one")
    worker_branch = spawn(a, "long job", description="runner")
    idle = open_session(title="Idle one")
    make_job(a.sid, worker_branch, status="running")

    got = call(a.api, a.address, "list_agents", scope="all")
    lines = got["text"].splitlines()
    header = {line.split()[1]: line for line in lines if line.startswith("session ")}
    assert header[a.sid].endswith("busy") and header[idle.sid].endswith("idle"), got["text"]
    runner_line = next(line for line in lines if line.startswith("  - runner "))
    assert "[busy]" in runner_line
    main_line = next(line for line in lines if line.startswith("  - main ") and a.sid in line)
    assert "[busy]" not in main_line
    s = next(s for s in got["details"]["sessions"] if s["session_id"] == a.sid)
    assert s["busy"] is True
    assert {b["name"]: b["busy"] for b in s["branches"]} == {"runner": True, "main": False}


def _add_branches(sid, n):
    """``n`` extra branches, each with one message as its tip (ORM, in bulk)."""
    branches = [Branch(session_id=sid, name=f"b{i}", name_stage=3, turns=1, chars=20) for i in range(n)]
    Branch.objects.bulk_create(branches)
    messages = [Message(session_id=sid, branch=b, role="user", text=f"message on b{i}", depth=0, turn=1)
                for i, b in enumerate(branches)]
    Message.objects.bulk_create(messages)
    for b, m in zip(branches, messages):
        b.tip = m
    Branch.objects.bulk_update(branches, ["tip"])
    make_job(sid, branches[0], status="running")  # one busy branch


@pytest.mark.parametrize("scope", ["session", "all", "archived"])
def test_list_agents_costs_a_constant_number_of_queries(team, open_session, django_assert_max_num_queries, scope):
    """``list_agents`` takes a constant number of queries regardless of the number of
    branches (here 5 vs 200), through the gateway; the selector itself stays within 5 queries."""
    from collab.selectors.agents import list_agents, render_agents

    counts = []
    for n in (5, 200):
        a = open_session()
        _add_branches(a.sid, n)
        if scope == "archived":
            Branch.objects.filter(session_id=a.sid, name__startswith="b").update(archived=True, archived_at=timezone.now())
        call(a.api, a.address, "list_agents", scope=scope, limit=200)  # warm up (token last-used stamp)
        with django_assert_max_num_queries(20) as ctx:
            got = call(a.api, a.address, "list_agents", scope=scope, limit=200)
        counts.append(len(ctx))
        print(f"list_agents scope={scope} branches={n}: {len(ctx)} queries through the gateway")
        assert len(rows_of(got["text"])) >= n, got["text"][:500]
        session = Session.objects.get(pk=a.sid)
        with django_assert_max_num_queries(5):
            render_agents(list_agents(a.user, session, scope=scope, limit=200))
    assert counts[0] == counts[1], counts


# === 3. read_conversation (docs/contract.md#read_conversation) ===================================

TOOLY = [{"tool_calls": [{"name": "todo_list", "arguments": {}}]}, {"text": "answer to {{prompt}}"}]


@pytest.fixture
def four_turns(team, open_session):
    """Main branch with 4 turns, each: prompt, tool call, tool result, final answer."""
    a = open_session(script=TOOLY, prompt="question 0")
    for i in range(1, 4):
        r = a.api.post(f"/api/sessions/{a.sid}/turns", {"prompt": f"question {i}"})
        assert run_inline(r.json()["execution_id"]).status == "succeeded"
    a.branch = branch(a.branch.pk)
    a.address = a.branch.address
    assert a.branch.tip.turn == 4
    return a


def turn_indices(result):
    return [t["index"] for t in result["details"]["turns"]]


def test_read_conversation_turn_windows_count_from_the_end_when_negative(four_turns):
    """Turns count from 0; negative ``start_turn``/``end_turn`` count from the end."""
    a = four_turns
    whole = call(a.api, a.address, "read_conversation", session_id=a.address)
    assert turn_indices(whole) == [0, 1, 2, 3]
    assert whole["details"]["total_turns"] == 4
    for i in range(4):
        assert f"## turn {i}" in whole["text"] and f"answer to question {i}" in whole["text"]
    last = call(a.api, a.address, "read_conversation", session_id=a.address, start_turn=-1)
    assert turn_indices(last) == [3] and "question 3" in last["text"] and "question 2" not in last["text"]
    head = call(a.api, a.address, "read_conversation", session_id=a.address, end_turn=2)
    assert turn_indices(head) == [0, 1] and "question 2" not in head["text"]
    middle = call(a.api, a.address, "read_conversation", session_id=a.address, start_turn=-3, end_turn=-1)
    assert turn_indices(middle) == [1, 2]
    empty = call(a.api, a.address, "read_conversation", session_id=a.address, start_turn=10)
    assert not empty["is_error"] and turn_indices(empty) == [] and "4 turns" in empty["text"]


def test_read_conversation_can_hide_function_calls(four_turns):
    """``include_function_calls=False`` hides tool calls and tool results."""
    a = four_turns
    shown = call(a.api, a.address, "read_conversation", session_id=a.address)
    assert "[tool result: todo_list]" in shown["text"] and "todo_list(" in shown["text"]
    hidden = call(a.api, a.address, "read_conversation", session_id=a.address, include_function_calls=False)
    assert "[tool result" not in hidden["text"] and "todo_list" not in hidden["text"], hidden["text"]
    assert "answer to question 2" in hidden["text"] and "question 3" in hidden["text"]


def test_read_conversation_max_chars_drops_later_turns_and_says_how_to_read_on(four_turns):
    """Turns beyond ``max_chars`` are dropped (later ones first) with a note on where to continue."""
    a = four_turns
    whole = call(a.api, a.address, "read_conversation", session_id=a.address)
    first_block = whole["text"].split("\n\n## turn 1")[0]
    budget = len(first_block) + 50
    got = call(a.api, a.address, "read_conversation", session_id=a.address, max_chars=budget)
    assert turn_indices(got) == [0], got["text"]
    assert got["details"]["omitted_turns"] == 3
    assert "3 later turns omitted" in got["text"] and "start_turn=1" in got["text"]
    rest = call(a.api, a.address, "read_conversation", session_id=a.address, start_turn=1, max_chars=budget)
    assert turn_indices(rest)[0] == 1


def test_archived_branches_stay_readable_and_reading_never_runs_anything(four_turns, open_session):
    """Archived branches are readable; ``read_conversation`` never triggers a run."""
    a = four_turns
    other = open_session()
    call(a.api, a.address, "archive_agent", to=a.address)
    jobs, messages = Job.objects.count(), Message.objects.count()
    got = call(other.api, other.address, "read_conversation", session_id=a.address)
    assert not got["is_error"], got
    assert got["details"]["archived"] is True and turn_indices(got) == [0, 1, 2, 3]
    assert (Job.objects.count(), Message.objects.count()) == (jobs, messages)


def test_read_conversation_of_a_session_id_reads_its_selected_branch(team, open_session):
    """A session id (no colon) reads that session's selected branch."""
    a = open_session(prompt="the main question")
    spawn(a, "a side quest", description="side")
    got = call(a.api, a.address, "read_conversation", session_id=a.sid)
    assert not got["is_error"], got
    assert got["details"]["branch"] == a.branch.pk and "the main question" in got["text"]
    assert "side quest" not in got["text"]
    other = open_session()
    got = call(other.api, other.address, "read_conversation", session_id=a.sid)
    assert got["details"]["branch"] == a.branch.pk
    # the person selects the side branch: reading the session now reads that one
    side = Branch.objects.get(session_id=a.sid, name="side")
    Session.objects.filter(pk=a.sid).update(head=side.tip)
    got = call(other.api, other.address, "read_conversation", session_id=a.sid)
    assert got["details"]["branch"] == side.pk and "side quest" in got["text"]


def test_read_conversation_of_an_invisible_target_is_not_found(team, open_session, api_as):
    """Reading another project's branch or session answers "not found" like a missing one,
    with no title or preview; the transcript API answers 404 identically."""
    a = open_session()
    theirs = open_session(team.outsider, project="beta", title="Secret title", prompt="classified text")
    for ref in (theirs.address, theirs.sid, "nosuchsession", f"{theirs.sid}:000000000000"):
        got = call(a.api, a.address, "read_conversation", session_id=ref)
        assert error_code(got) == "not_found", (ref, got)
        assert "Secret" not in got["text"] and "classified" not in got["text"]
    hidden = a.api.get(f"/api/branches/{theirs.address}/transcript")
    missing = a.api.get(f"/api/branches/{theirs.sid}:000000000000/transcript")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["code"] == missing.json()["code"] == "not_found"
    assert hidden.json()["detail"].replace(theirs.address, "X") == \
        missing.json()["detail"].replace(f"{theirs.sid}:000000000000", "X")
    assert "Secret" not in hidden.content.decode() and "classified" not in hidden.content.decode()


def test_transcript_api_returns_the_read_conversation_rendering(four_turns, team, api_as):
    """``GET /api/branches/{address}/transcript`` returns the ``read_conversation``
    rendering (same text and turns, same parameters), to any member including a viewer."""
    a = four_turns
    viewer = api_as(team.viewer)
    for params in ({}, {"start_turn": -2}, {"end_turn": 1}, {"include_function_calls": False},
                   {"max_chars": 300}):
        tool = call(a.api, a.address, "read_conversation", session_id=a.address, **params)
        r = viewer.get(f"/api/branches/{a.address}/transcript", **{k: json.dumps(v) if isinstance(v, bool) else v
                                                                    for k, v in params.items()})
        assert r.status_code == 200, r.content
        body = r.json()
        assert body["text"] == tool["text"], params
        assert body["turns"] == tool["details"]["turns"]
        assert body["total_turns"] == 4 and body["address"] == a.address


# === 4. archive_agent (docs/contract.md#archive_agent) ============================================


def test_archive_agent_is_idempotent_and_keeps_the_first_time_and_manual_reason(team, open_session):
    """Repeated archiving is a no-op that keeps the first ``archived_at``; the first
    manual reason is kept (a later call only fills a reason that was never given)."""
    a = open_session()
    helper = spawn(a, "w", description="helper")
    first = call(a.api, a.address, "archive_agent", to=helper.address)
    assert not first["is_error"], first
    at = first["details"]["archived_at"]
    assert first["details"]["reason"] == ""
    second = call(a.api, a.address, "archive_agent", to=helper.address, reason="done with it")
    assert second["details"]["archived_at"] == at and second["details"]["reason"] == "done with it"
    third = call(a.api, a.address, "archive_agent", to=helper.address, reason="another reason")
    assert third["details"]["archived_at"] == at and third["details"]["reason"] == "done with it"
    b = branch(helper.pk)
    assert b.archived and b.archive_reason == "done with it" and b.archived_by_id == team.member.pk
    assert b.archived_at.isoformat() == at

    other = spawn(a, "w2", description="other")
    call(a.api, a.address, "archive_agent", to=other.address, reason="first reason")
    again = call(a.api, a.address, "archive_agent", to=other.address, reason="second reason")
    assert again["details"]["reason"] == "first reason"
    assert not branch(a.branch.pk).archived  # archiving one branch touches nothing else


def test_archive_permissions_member_own_only_maintainer_any_viewer_none(team, open_session, api_as):
    """A member archives only branches they started (``forbidden`` otherwise);
    a maintainer archives any; a viewer cannot archive (nor act through the gateway); an outsider
    gets "not found"."""
    m = open_session(team.maintainer)
    theirs = spawn(m, "maintainer's work", description="theirs")
    me = open_session(team.member)
    mine = spawn(me, "member's work", description="mine")

    got = call(me.api, me.address, "archive_agent", to=theirs.address)
    assert got["is_error"] and error_code(got) == "forbidden", got
    assert not branch(theirs.pk).archived
    got = call(me.api, me.address, "archive_agent", to=mine.address)
    assert not got["is_error"], got
    mine2 = spawn(me, "more member work", description="mine2")
    got = call(m.api, m.address, "archive_agent", to=mine2.address, reason="cleanup")
    assert not got["is_error"], got
    assert branch(mine2.pk).archived_by_id == team.maintainer.pk

    viewer = api_as(team.viewer)
    r = viewer.post(f"/api/branches/{me.address}/tools/archive_agent", {"arguments": {"to": theirs.address}})
    assert r.status_code == 403, r.content
    r = viewer.post(f"/api/branches/{theirs.address}/archive", {"reason": "nope"})
    assert r.status_code == 403 and r.json()["code"] == "forbidden", r.content
    assert not branch(theirs.pk).archived

    outsider = api_as(team.outsider)
    hidden = outsider.post(f"/api/branches/{theirs.address}/archive", {"reason": "x"})
    missing = outsider.post(f"/api/branches/{m.sid}:000000000000/archive", {"reason": "x"})
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["detail"].replace(theirs.address, "X") == missing.json()["detail"].replace(f"{m.sid}:000000000000", "X")
    assert hidden.json()["code"] == missing.json()["code"] == "not_found"
    assert not branch(theirs.pk).archived


def test_archive_api_is_idempotent_and_enforces_the_same_rules(team, open_session, api_as):
    """``POST /api/branches/{address}/archive`` archives idempotently (200, first
    values kept) under the same permission rules as ``archive_agent``."""
    m = open_session(team.maintainer)
    theirs = spawn(m, "maintainer's work", description="theirs")
    me = open_session(team.member)
    mine = spawn(me, "member's work", description="mine")
    member = me.api

    r = member.post(f"/api/branches/{theirs.address}/archive", {"reason": "not mine"})
    assert r.status_code == 403 and r.json()["code"] == "forbidden", r.content
    r1 = member.post(f"/api/branches/{mine.address}/archive", {"reason": "first"})
    assert r1.status_code == 200, r1.content
    body = r1.json()
    assert body["archived"] is True and body["archive_reason"] == "first" and body["address"] == mine.address
    r2 = member.post(f"/api/branches/{mine.address}/archive", {"reason": "second"})
    assert r2.status_code == 200
    assert r2.json()["archived_at"] == body["archived_at"] and r2.json()["archive_reason"] == "first"
    # a stale address of the branch works too
    stale = f"{me.sid}:{mine.tip.predecessor_id}"
    r3 = member.post(f"/api/branches/{stale}/archive", {"reason": "third"})
    assert r3.status_code == 200 and r3.json()["archived_at"] == body["archived_at"]

    r = m.api.post(f"/api/branches/{me.address}/archive", {"reason": "maintainer may"})
    assert r.status_code == 200 and r.json()["archive_reason"] == "maintainer may"
    r = m.api.post(f"/api/branches/{theirs.address}/archive", {"reason": "bad", "force": True})
    assert r.status_code in (400, 422), r.content
    assert not branch(theirs.pk).archived
    # both entries set the one global state, which the tools see
    got = call(m.api, m.address, "read_conversation", session_id=mine.address)
    assert got["details"]["archived"] is True
    got = call(m.api, m.address, "archive_agent", to=mine.address, reason="late")
    # the API renders milliseconds (DjangoJSONEncoder), the tool full precision
    assert abs(parse_dt(got["details"]["archived_at"]) - parse_dt(body["archived_at"])).total_seconds() < 0.001
    assert got["details"]["reason"] == "first"


# === 5. todos (docs/contract.md#plans-and-jobs) ====================================================


def test_todos_record_plans_with_blockers_and_never_start_anything(team, open_session):
    """``todo_create``/``todo_update``/``todo_list`` keep plan items with ``blocked_by``;
    unknown blockers and bad statuses are errors; nothing ever starts running."""
    a, b = open_session(), open_session()
    jobs, branches = Job.objects.count(), Branch.objects.count()
    t1 = call(a.api, a.address, "todo_create", subject="design the schema")
    assert not t1["is_error"], t1
    id1 = t1["details"]["todo_id"]
    t2 = call(a.api, a.address, "todo_create", subject="write the migration", description="after design", blocked_by=[id1])
    id2 = t2["details"]["todo_id"]
    assert t2["details"]["blocked_by"] == [id1] and t2["details"]["status"] == "pending"

    bad = call(a.api, a.address, "todo_create", subject="ghost", blocked_by=[id1, 999999])
    assert bad["is_error"] and error_code(bad) == "unknown_todo" and "999999" in bad["text"], bad
    assert not Todo.objects.filter(subject="ghost").exists()
    # another session's todo is not a valid blocker
    theirs = call(b.api, b.address, "todo_create", subject="theirs")["details"]["todo_id"]
    assert error_code(call(a.api, a.address, "todo_create", subject="x", blocked_by=[theirs])) == "unknown_todo"
    assert error_code(call(a.api, a.address, "todo_update", todo_id=theirs, status="completed")) == "unknown_todo"
    assert Todo.objects.get(pk=theirs).status == "pending"

    assert error_code(call(a.api, a.address, "todo_update", todo_id=id1, status="done")) == "invalid_arguments"
    assert error_code(call(a.api, a.address, "todo_update", todo_id=id2, blocked_by=[id2])) == "invalid_blocked_by"
    assert error_code(call(a.api, a.address, "todo_update", todo_id=id2, blocked_by=[424242])) == "unknown_todo"
    assert error_code(call(a.api, a.address, "todo_create", subject="")) == "invalid_arguments"
    assert error_code(call(a.api, a.address, "todo_create", subject="x", priority=1)) == "invalid_arguments"

    for status in ("in_progress", "completed", "pending", "completed"):
        up = call(a.api, a.address, "todo_update", todo_id=id1, status=status)
        assert not up["is_error"] and up["details"]["status"] == status, up
    up = call(a.api, a.address, "todo_update", todo_id=id2, status="in_progress", subject="write migrations")
    assert up["details"]["subject"] == "write migrations"

    listed = call(a.api, a.address, "todo_list")
    assert [t["todo_id"] for t in listed["details"]["todos"]] == [id1, id2]
    assert listed["details"]["todos"][1] == {"todo_id": id2, "subject": "write migrations", "status": "in_progress",
                                             "blocked_by": [id1]}
    assert f"[completed] {id1}. design the schema" in listed["text"]
    assert f"(blocked by {id1})" in listed["text"]
    assert (Job.objects.count(), Branch.objects.count()) == (jobs, branches)
    assert not Job.objects.filter(status__in=["queued", "running"]).exists()


# === 6. list_jobs / job_output (docs/contract.md#plans-and-jobs) =================================


@pytest.fixture
def three_sessions(team, open_session):
    """Sessions A, B, C, D of one project, and a chain: A dispatched a job on B, whose turn
    dispatched a job on C, whose turn dispatched a job on D."""
    A, B, C, D = (open_session(title=t) for t in "ABCD")
    ja = make_job(B.sid, B.branch, caller_session=A.sid, result="result of B's job")
    jb = make_job(C.sid, C.branch, caller_session=B.sid, parent_job=ja, result="result of C's job")
    jc = make_job(D.sid, D.branch, caller_session=C.sid, parent_job=jb, result="result of D's job")
    return SimpleNamespace(A=A, B=B, C=C, D=D, ja=ja, jb=jb, jc=jc)


def test_job_output_ownership_caller_executor_and_ancestors(three_sessions, open_session):
    """``job_output`` is allowed for the executing session, the caller session and an
    ancestor caller (A may read the job B's job dispatched to D); any other session of the same
    project gets "not found", exactly like a missing job id. ``details.job_id`` carries the id."""
    w = three_sessions
    ok = [(w.A, w.ja), (w.A, w.jb), (w.A, w.jc), (w.B, w.ja), (w.B, w.jc), (w.C, w.jc), (w.D, w.jc), (w.C, w.jb)]
    for who, job in ok:
        got = call(who.api, who.address, "job_output", job_id=job.pk)
        assert not got["is_error"], (who.sid, got)
        assert got["details"]["job_id"] == job.pk and got["details"]["done"] is True
        assert got["text"] == job.result
    stranger = open_session(title="stranger")
    denied = [(stranger, w.ja), (stranger, w.jc), (w.D, w.ja), (w.C, w.ja), (w.D, w.jb)]
    missing = call(stranger.api, stranger.address, "job_output", job_id="000000000000")
    assert error_code(missing) == "not_found"
    for who, job in denied:
        got = call(who.api, who.address, "job_output", job_id=job.pk)
        assert error_code(got) == "not_found", (who.sid, job.pk, got)
        assert got["text"] == missing["text"] and "result of" not in got["text"]


def test_job_output_is_not_found_for_another_project_member(three_sessions, team, open_session):
    """Knowing an execution id grants nothing across projects."""
    w = three_sessions
    theirs = open_session(team.outsider, project="beta")
    got = call(theirs.api, theirs.address, "job_output", job_id=w.jc.pk)
    assert error_code(got) == "not_found"
    assert got == call(theirs.api, theirs.address, "job_output", job_id="000000000000")


def test_job_output_ownership_walk_is_cycle_safe_and_bounded(team, open_session):
    """The ancestor walk stops on a ``parent_job`` cycle (no hang) and at 64 levels."""
    A, B = open_session(title="A"), open_session(title="B")
    j1 = make_job(B.sid, B.branch, caller_session=B.sid)
    j2 = make_job(B.sid, B.branch, caller_session=B.sid, parent_job=j1)
    Job.objects.filter(pk=j1.pk).update(parent_job=j2)  # j1 → j2 → j1 …
    with CaptureQueriesContext(connection) as queries:
        got = call(A.api, A.address, "job_output", job_id=j1.pk)
    # the walk ended on the cycle: a bounded number of queries (a looping walk reads without end)
    assert error_code(got) == "not_found" and len(queries) < MAX_WALK_QUERIES, len(queries)
    assert not call(B.api, B.address, "job_output", job_id=j1.pk)["is_error"]

    # a chain far deeper than 64 levels: the walk gives up instead of climbing forever
    top = make_job(B.sid, B.branch, caller_session=A.sid)
    job = top
    chain = [top]
    for _ in range(80):
        job = make_job(B.sid, B.branch, caller_session=B.sid, parent_job=job)
        chain.append(job)
    assert not call(A.api, A.address, "job_output", job_id=chain[10].pk)["is_error"]
    assert error_code(call(A.api, A.address, "job_output", job_id=chain[-1].pk)) == "not_found"
    # list_jobs survives the cycle too
    listed = call(B.api, B.address, "list_jobs", limit=200)
    assert not listed["is_error"] and j1.pk in listed["text"]


def test_job_output_block_false_and_timeout_bounds(team, open_session, monkeypatch):
    """``block=False`` on a running job answers at once that it is still running (it
    never waits); ``block=True`` waits at most ``timeout`` ms (one wait of exactly that long,
    which ends by timing out while the job runs); ``timeout`` above 600000 is rejected."""
    from collab.realtime.changes import wait_for_change
    from collab.tools import collab_tools

    waits = []

    def recorded_wait(check, timeout_seconds, **kwargs):
        value = wait_for_change(check, timeout_seconds, **kwargs)
        waits.append((timeout_seconds, bool(value)))
        return value

    monkeypatch.setattr(collab_tools, "wait_for_change", recorded_wait)
    a = open_session()
    helper = spawn(a, "w", description="helper")
    running = make_job(a.sid, helper, caller_session=a.sid, status="running", result="")
    got = call(a.api, a.address, "job_output", job_id=running.pk, block=False)
    assert waits == []  # answered at once: no wait at all
    assert not got["is_error"] and "still running" in got["text"], got
    assert got["details"] == {**got["details"], "job_id": running.pk, "status": "running", "done": False}
    got = call(a.api, a.address, "job_output", job_id=running.pk, timeout=300)
    assert waits == [(0.3, False)]  # one wait of the asked 300 ms, ended by its timeout (the job still runs)
    assert "still running" in got["text"] and got["details"]["done"] is False, got
    too_long = call(a.api, a.address, "job_output", job_id=running.pk, timeout=600_001)
    assert error_code(too_long) == "invalid_arguments" and "timeout" in too_long["text"]
    assert error_code(call(a.api, a.address, "job_output", job_id=running.pk, timeout=-1)) == "invalid_arguments"
    ok = call(a.api, a.address, "job_output", job_id=running.pk, block=False, timeout=600_000)
    assert not ok["is_error"]


def test_job_output_reports_failures_with_is_error(team, open_session):
    """A failed job's output says how it ended."""
    a = open_session()
    failed = make_job(a.sid, a.branch, caller_session=a.sid, status="failed", result="boom")
    Job.objects.filter(pk=failed.pk).update(is_error=True, error_code="provider_error", error_reason="model exploded")
    got = call(a.api, a.address, "job_output", job_id=failed.pk)
    assert got["details"]["is_error"] is True and got["details"]["error_code"] == "provider_error"
    assert "failed" in got["text"] and "model exploded" in got["text"]


def test_list_jobs_lists_dispatched_jobs_and_their_descendants_only(three_sessions, open_session):
    """``list_jobs`` lists the jobs this session dispatched and their descendants, with
    status, filterable by status; other sessions' jobs are not listed."""
    w = three_sessions
    queued = make_job(w.B.sid, w.B.branch, caller_session=w.A.sid, status="queued", result="")
    unrelated = make_job(w.C.sid, w.C.branch, caller_session=w.D.sid)
    got = call(w.A.api, w.A.address, "list_jobs")
    ids = [j["job_id"] for j in got["details"]["jobs"]]
    assert set(ids) == {w.ja.pk, w.jb.pk, w.jc.pk, queued.pk}, got["text"]
    assert unrelated.pk not in got["text"]
    assert {j["job_id"]: j["status"] for j in got["details"]["jobs"]}[queued.pk] == "queued"
    only_queued = call(w.A.api, w.A.address, "list_jobs", status="queued")
    assert [j["job_id"] for j in only_queued["details"]["jobs"]] == [queued.pk]
    assert error_code(call(w.A.api, w.A.address, "list_jobs", status="bogus")) == "invalid_arguments"
    c = call(w.C.api, w.C.address, "list_jobs")
    assert {j["job_id"] for j in c["details"]["jobs"]} == {w.jc.pk}
    stranger = open_session()
    assert call(stranger.api, stranger.address, "list_jobs")["details"]["jobs"] == []


@pytest.mark.slow
def test_job_output_waits_for_a_real_background_run(team, scripted_session, worker):
    """A turn starts a background agent, then ``job_output(block=True)`` waits
    for its real run on the worker and returns its result; ``details.job_id`` carries the id, and
    ``list_jobs`` shows it succeeded."""
    api, sid = scripted_session(team.member, {
        "user": [
            {"tool_calls": [{"name": "agent", "arguments": {"prompt": "compute it", "description": "bg",
                                                           "run_in_background": True}}]},
            {"tool_calls": [{"name": "job_output", "arguments": {"job_id": "{{last.details.execution_id}}",
                                                                 "timeout": 30000}}]},
            {"text": "{{last.details.job_id}}|{{last.details.status}}|{{last.text}}"},
        ],
        "spawn": [{"sleep_ms": 300}, {"text": "the answer is 42"}],
    })
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"})
    done = api.wait(r.json()["execution_id"])
    assert done["status"] == "succeeded", done
    child_id, status, text = done["result"].split("|", 2)
    assert status == "succeeded" and text == "the answer is 42", done["result"]
    child = api.get(f"/api/executions/{child_id}").json()
    assert child["kind"] == "spawn" and child["status"] == "succeeded" and child["result"] == "the answer is 42"
    main = next(b for b in api.get(f"/api/sessions/{sid}/branches").json() if b["name"] == "main")
    listed = api.post(f"/api/branches/{main['address']}/tools/list_jobs", {"arguments": {}}).json()
    assert any(j["job_id"] == child_id and j["status"] == "succeeded" for j in listed["details"]["jobs"]), listed


# === 7. branch naming (docs/contract.md#names) ======================================================


def test_a_spawn_is_named_by_its_description_else_a_short_label(team, open_session):
    """Naming, stage 1: a spawn with ``description`` is named exactly that (name_stage 3,
    explicit); without it the branch gets a label of at most 24 characters from the prompt
    (name_stage 1), at once, before any model call."""
    from collab.models import NameStage

    a = open_session()
    named = spawn(a, "Investigate the flaky login test", description="login-investigator")
    assert named.name == "login-investigator" and named.name_stage == NameStage.MANUAL == 3
    names = {}
    for prompt in ("Investigate the flaky login test on staging please",
                   "Supercalifragilisticexpialidocious words everywhere",
                   "short one",
                   "\n\n   first   line  \nsecond line"):
        b = spawn(a, prompt)
        assert b.name_stage == NameStage.LABEL == 1, prompt
        assert 0 < len(b.name) <= 24, (prompt, b.name, len(b.name))
        assert b.name.rstrip("\u2026") and prompt.split()[0][:10] in b.name
        names[prompt.split()[0]] = b.name
    assert names["short"] == "short one" and names["first"] == "first line"
    background = call(a.api, a.address, "agent", prompt="Background chores for the team", run_in_background=True)
    b = branch(Job.objects.get(pk=background["details"]["execution_id"]).branch_id)
    assert b.name_stage == 1 and b.name == background["details"]["name"] and len(b.name) <= 24


def test_auto_naming_never_touches_explicit_names(team, open_session):
    """The stage-2 renamer replaces only prompt labels; explicit names stay."""
    from collab.runtime.naming import auto_name_branch

    a = open_session()
    named = spawn(a, "Investigate the flaky login test on staging", description="keeper")
    labelled = spawn(a, "Investigate the flaky login test on staging")
    auto_name_branch(named.pk)
    auto_name_branch(a.branch.pk)
    assert branch(named.pk).name == "keeper" and branch(named.pk).name_stage == 3
    assert branch(a.branch.pk).name == "main"
    auto_name_branch(labelled.pk)
    renamed = branch(labelled.pk)
    assert renamed.name == "Investigate the flaky login test on" and renamed.name_stage == 2


@pytest.mark.slow
def test_auto_naming_renames_label_named_branches_after_the_first_turn(team, scripted_session, worker):
    """Naming, stage 2: after a branch's first turn completes, a background task retitles a
    label-named branch with the model's title (the scripted provider: the first words of its
    first prompt); a description-named branch keeps its name (and stays addressable by it)."""
    prompt = "Investigate the flaky login test on staging please"
    api, sid = scripted_session(team.member, {
        "user": [
            {"tool_calls": [
                {"name": "agent", "arguments": {"prompt": prompt, "run_in_background": True}},
                {"name": "agent", "arguments": {"prompt": "Audit the billing code for rounding bugs",
                                                "description": "billing-auditor", "run_in_background": True}},
            ]},
            {"text": "started"},
        ],
        "spawn": [{"text": "on it"}],
        "followup": [{"text": "noted"}],
    })
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "start two helpers"})
    assert api.wait(r.json()["execution_id"])["status"] == "succeeded"

    def by_name():
        return {b["name"]: b for b in api.get(f"/api/sessions/{sid}/branches").json()}

    # let everything settle: both children, and their results delivered back to main
    def settled():
        jobs = Job.objects.filter(session_id=sid)
        return (jobs.filter(kind="spawn", status="succeeded").count() == 2
                and not jobs.exclude(status__in=TERMINAL).exists()
                and not jobs.filter(followup_state="owed").exists())

    poll(settled, timeout=30.0, interval=0.1, what="the children and their follow-ups to finish")
    title = "Investigate the flaky login test on"
    rows = poll(lambda: (rows := by_name()) and title in rows and rows, timeout=30.0, interval=0.1, what=f"rename to {title!r}")
    assert rows[title]["name_stage"] == 2 and rows[title]["turns"] == 1
    assert rows["billing-auditor"]["name_stage"] == 3 and rows["billing-auditor"]["turns"] == 1
    assert "main" in rows and rows["main"]["name_stage"] == 3
    assert wait_at_rest()  # every naming task a finished turn scheduled has run
    assert by_name()["billing-auditor"]["name_stage"] == 3
    # the event log shows stage 1 (the label given at creation) and the one stage-2 rename
    events = api.get(f"/api/sessions/{sid}/events").json()["events"]
    created = {e["payload"]["branch"]: e["payload"] for e in events if e["type"] == "branch.created"}
    renamed = [e["payload"] for e in events if e["type"] == "branch.renamed"]
    label_branch = rows[title]["id"]
    label = created[label_branch]["name"]
    assert created[label_branch]["name_stage"] == 1 and 0 < len(label) <= 24 and label.startswith("Investigate")
    assert created[rows["billing-auditor"]["id"]]["name_stage"] == 3
    assert [(r["branch"], r["old"], r["name"]) for r in renamed] == [(label_branch, label, title)], renamed
    # the renamed and the explicit branch are both addressable by name
    got = api.post(f"/api/branches/{rows['main']['address']}/tools/read_conversation",
                   {"arguments": {"session_id": "billing-auditor"}}).json()
    assert not got["is_error"] and "Audit the billing code" in got["text"], got
    got = api.post(f"/api/branches/{rows['main']['address']}/tools/read_conversation",
                   {"arguments": {"session_id": title}}).json()
    assert not got["is_error"] and prompt in got["text"], got


# === 8. foreground agent runs inline (docs/contract.md#agent) =====================================


def test_foreground_agent_returns_the_final_text_and_is_an_admitted_job(team, open_session):
    """A foreground ``agent`` call waits and returns the child's final text (no
    background receipt), and the child ran as an admitted Job (kind spawn). Made through the
    gateway, outside any turn, the child is a worker's job that answers the call: no follow-up
    carries its result again (docs/capacity.md)."""
    a = open_session(script=[{"text": "child reply: {{prompt}}"}])
    got = call(a.api, a.address, "agent", prompt="do the thing", description="fg-child")
    assert not got["is_error"], got
    assert got["text"] == "child reply: do the thing"
    job = Job.objects.get(pk=got["details"]["execution_id"])
    assert (job.kind, job.run_in_background, job.answers_call, job.status) == ("spawn", True, True, "succeeded")
    assert job.followup_state == "none"
    assert job.caller_session_id == a.sid and job.caller_branch_id == a.branch.pk
    assert got["details"]["address"] == branch(job.branch_id).address


@pytest.mark.slow
def test_nested_foreground_agents_run_inline_without_deadlock(team, api_as, scripted_session, run_queued):
    """A foreground ``agent`` runs its child inline in the calling worker,
    still admitted as a Job. A chain user turn → child → grandchild → great-grandchild, all
    foreground, completes on the default 2-worker pool (it would deadlock if every level needed
    its own worker), each child a ``spawn`` Job with ``run_in_background=False``, run by the same
    worker process as its parent. (Spawn depth is a project budget: lifted here.)"""
    owner = api_as(team.owner)
    r = owner.patch("/api/projects/alpha/limits", {"max_spawn_depth": 0})
    assert r.status_code == 200 and r.json()["max_spawn_depth"] == 0, r.content
    for level, script in (
        ("lvl1", [{"tool_calls": [{"name": "agent", "arguments": {"prompt": "level two", "agent_id": "lvl2"}}]},
                  {"text": "L1<{{last.text}}>"}]),
        ("lvl2", [{"tool_calls": [{"name": "agent", "arguments": {"prompt": "level three", "agent_id": "lvl3"}}]},
                  {"text": "L2<{{last.text}}>"}]),
        ("lvl3", [{"text": "L3 deepest"}]),
    ):
        r = owner.post("/api/projects/alpha/agent-specs", {"agent_id": level, "provider": "scripted", "script": script})
        assert r.status_code == 201, r.content
    api, sid = scripted_session(team.member, {"user": [
        {"tool_calls": [{"name": "agent", "arguments": {"prompt": "level one", "agent_id": "lvl1"}}]},
        {"text": "root<{{last.text}}>"},
    ]})
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go deep"})
    done = api.wait(r.json()["execution_id"], timeout=60)  # a deadlock never gets here: it fails the wait
    assert done["status"] == "succeeded", done
    assert done["result"] == "root<L1<L2<L3 deepest>>>", done["result"]

    root = Job.objects.get(pk=done["id"])
    chain = [root]
    while (child := Job.objects.filter(parent_job=chain[-1]).first()) is not None:
        chain.append(child)
    assert len(chain) == 4, [j.pk for j in chain]
    for parent, child in zip(chain, chain[1:]):
        assert (child.kind, child.run_in_background, child.status) == ("spawn", False, "succeeded")
        assert child.caller_job_id == parent.pk and child.caller_session_id == parent.session_id
        assert child.worker == root.worker  # inline: the very same worker process
        assert child.started_at >= parent.started_at and child.finished_at <= parent.finished_at
    assert [j.agent_spec.agent_id for j in chain[1:]] == ["lvl1", "lvl2", "lvl3"]


def test_a_manual_reason_fills_in_after_an_automatic_archive_but_never_replaces_a_manual_one(team):
    """Automatic archiving only fills unset fields; the first manual reason is kept,
    and the first archived_at never changes."""
    from collab.models import Branch
    from collab.services.archive import do_archive_branch
    from collab.services.sessions import do_create_session

    session = do_create_session(team.owner, team.alpha, title="t")
    branch = Branch.objects.get(session=session)
    do_archive_branch(branch, user=team.owner, reason="archive_when_done", automatic=True)
    first_at = Branch.objects.get(pk=branch.pk).archived_at
    do_archive_branch(branch, user=team.owner, reason="done with it")
    do_archive_branch(branch, user=team.owner, reason="a later reason")
    do_archive_branch(branch, user=team.owner, reason="archive_when_done", automatic=True)
    branch.refresh_from_db()
    assert branch.archive_reason == "done with it" and branch.archived_at == first_at


def test_a_small_context_window_lowers_the_result_bound(team, api_as):
    """Results are bounded at 30,000 characters, lower when the reading model's context
    is small (AgentSpec.limits.context_window): job_output through the gateway is cut to it."""
    from collab.models import Job
    from collab.runtime.loop import run_job

    owner = api_as(team.owner)
    long_answer = "x" * 12_000 + "THE-END"
    for agent_id, window in (("small", 4_000), ("large", None)):
        limits = {"context_window": window} if window else {}
        assert owner.post("/api/projects/alpha/agent-specs", {
            "agent_id": agent_id, "script": {"spawn": [{"text": long_answer}]}, "limits": limits}).status_code == 201
        sid = owner.post("/api/projects/alpha/sessions", {"title": agent_id, "agent_id": agent_id}).json()["id"]
        main = owner.get(f"/api/sessions/{sid}/branches").json()
        address = main[0]["address"] if main and main[0]["address"] else None
        if address is None:
            first = owner.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).json()["execution_id"]
            run_job(first)
            address = owner.get(f"/api/sessions/{sid}/branches").json()[0]["address"]
        spawned = owner.post(f"/api/branches/{address}/tools/agent",
                             {"arguments": {"prompt": "answer long", "run_in_background": True}}).json()
        job_id = spawned["details"]["execution_id"]
        run_job(job_id)
        out = owner.post(f"/api/branches/{address}/tools/job_output", {"arguments": {"job_id": job_id}}).json()
        assert out["details"]["job_id"] == job_id and Job.objects.get(pk=job_id).status == "succeeded"
        if window:
            assert len(out["text"]) <= 4_000 and out["details"]["truncated"] and out["text"].endswith("THE-END")
        else:
            assert len(out["text"]) == len(long_answer) and not out["details"]["truncated"]
