"""End-to-end collaboration scenarios (docs/contract.md#the-collab-toolset and
#delivery-and-follow-ups).

Everything is driven through public entry points — the tool gateway
(``POST /api/branches/{address}/tools/{tool}``), user turns of scripted agents,
and the REST API. A scenario whose turns must run side by side (a busy branch, a cancel
landing mid-turn) runs against a real django-q2 worker process; one that only needs its
turns run, one after another, runs them in this process (``run_queued``, tests/conftest.py),
as a single worker would. Waiting is always polling with a timeout (``poll``), never a
fixed sleep used as an assertion.
"""

import re

import pytest

from tests.conftest import WAIT, branches, cancel, events, make_spec, open_session, poll, settle, tool, wait_at_rest

pytestmark = pytest.mark.slow

# --- helpers -----------------------------------------------------------------------------------


def jobs_of(api, *sids) -> dict:
    """Every execution of these sessions (``GET /api/executions?session=``):
    ``{job_id: {"kind", "status", "branch", "is_error", "error_code"}}``."""
    jobs = {}
    for sid in sids:
        r = api.get("/api/executions", session=sid, limit=500)
        assert r.status_code == 200, r.content
        rows = r.json()
        assert len(rows) < 500, "more executions than one page"
        for row in rows:
            jobs[row["id"]] = {k: row.get(k) for k in ("kind", "status", "branch", "is_error", "error_code")}
    return jobs


def settled_jobs(api, *sids) -> dict:
    """``jobs_of`` these sessions once they are at rest."""
    settle(api, *sids)
    return jobs_of(api, *sids)


def job_count() -> int:
    """Cross-check for "creates nothing": every job row in the database."""
    from collab.models import Job

    return Job.objects.count()


def branch_count() -> int:
    from collab.models import Branch

    return Branch.objects.count()


def ok(result):
    assert not result["is_error"], result
    return result


def branch_named(api, sid, name, scope="session"):
    rows = [b for b in branches(api, sid, scope) if b["name"] == name]
    assert len(rows) == 1, (name, branches(api, sid, scope))
    return rows[0]


def main_address(api, sid):
    return branch_named(api, sid, "main")["address"]


def user_turn(api, sid, prompt="hello", wait=True, **extra):
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt, **extra})
    assert r.status_code == 202, r.content
    eid = r.json()["execution_id"]
    if wait:
        done = api.wait(eid, timeout=WAIT)
        assert done["status"] == "succeeded", done
    return eid


def transcript(api, address, **params):
    r = api.get(f"/api/branches/{address}/transcript", **params)
    assert r.status_code == 200, r.content
    return r.json()


def session_head(api, sid):
    r = api.get(f"/api/sessions/{sid}")
    assert r.status_code == 200, r.content
    return r.json()["head"]


def messages_of(t):
    return [m for turn in t["turns"] for m in turn["messages"]]


def is_notice(m):
    """A result delivered to the caller: a follow-up turn's prompt node or a drained mailbox node."""
    return m["role"] == "user" and m["kind"] in ("followup", "agent_message") and m["text"].startswith("[result from ")


def assert_linear_followup_chain(t, first_followup_turn):
    """From ``first_followup_turn`` on, the caller branch is one chain of follow-up turns:
    notice (→ further notices drained into that turn's mailbox) → answer, then the next."""
    turns = t["turns"][first_followup_turn:]
    assert turns, t["text"]
    for turn in turns:
        kinds = [(m["role"], m["kind"]) for m in turn["messages"]]
        assert kinds[0] == ("user", "followup"), (turn["index"], kinds)
        assert kinds[-1][0] == "assistant", (turn["index"], kinds)
        assert all(k == ("user", "agent_message") for k in kinds[1:-1]), (turn["index"], kinds)
    return turns


# --- a batch of background tasks with a plan ------------------------------------------------------


def test_a_batch_of_five_background_tasks_planned_with_todos_comes_back_as_follow_ups(team, api_as, worker):
    """Plan five items (todo_create with blocked_by), dispatch
    five background agents, watch them with list_jobs, receive the results automatically as
    follow-ups on the caller branch, then mark the plan items completed. Plan tools start nothing."""
    owner, api = api_as(team.owner), api_as(team.member)
    make_spec(owner, "planner", {
        "user": [{"text": "ready"}],
        "spawn": [{"sleep_ms": 300}, {"text": "DONE<{{prompt}}>"}],
        "followup": [{"text": "noted"}],
    })
    sid = open_session(api, "planner", "scene 1")
    user_turn(api, sid)
    me = main_address(api, sid)
    jobs_before = job_count()

    # 01 plan: five items, blocked_by says who waits for whom
    t1 = ok(tool(api, me, "todo_create", subject="collect data"))["details"]["todo_id"]
    t2 = ok(tool(api, me, "todo_create", subject="clean data", blocked_by=[t1]))["details"]["todo_id"]
    t3 = ok(tool(api, me, "todo_create", subject="profile data", blocked_by=[t1]))["details"]["todo_id"]
    t4 = ok(tool(api, me, "todo_create", subject="write report", blocked_by=[t2, t3]))["details"]["todo_id"]
    t5 = ok(tool(api, me, "todo_create", subject="notify team", description="independent"))["details"]["todo_id"]
    todos = [t1, t2, t3, t4, t5]
    listed = ok(tool(api, me, "todo_list"))["details"]["todos"]
    assert [t["todo_id"] for t in listed] == todos
    assert {t["todo_id"]: sorted(t["blocked_by"]) for t in listed} == {t1: [], t2: [t1], t3: [t1], t4: sorted([t2, t3]), t5: []}
    assert all(t["status"] == "pending" for t in listed)
    bad = tool(api, me, "todo_create", subject="x", blocked_by=[10**9])
    assert bad["is_error"] and bad["details"]["code"] == "unknown_todo", bad
    assert job_count() == jobs_before, "todo_* must never start anything"

    # 02 dispatch: one background agent per plan item; each returns an execution id at once
    dispatched = {}
    for todo in todos:
        ok(tool(api, me, "todo_update", todo_id=todo, status="in_progress"))
        r = ok(tool(api, me, "agent", prompt=f"todo-{todo}", description=f"worker {todo}", run_in_background=True))
        assert r["details"]["execution_id"] and r["details"]["name"] == f"worker {todo}", r
        dispatched[todo] = r["details"]["execution_id"]
    assert len(set(dispatched.values())) == 5

    # 03 watch: list_jobs shows exactly these five
    listed_jobs = ok(tool(api, me, "list_jobs"))["details"]["jobs"]
    assert sorted(j["job_id"] for j in listed_jobs) == sorted(dispatched.values()), listed_jobs
    assert all(j["kind"] == "spawn" for j in listed_jobs)
    for eid in dispatched.values():
        done = api.wait(eid, timeout=WAIT)
        assert done["status"] == "succeeded" and done["result"].startswith("DONE<todo-"), done

    # 04 collect: every result comes back on its own, exactly once, as follow-ups on my branch
    def all_results_back():
        t = transcript(api, me)
        notices = [m for m in messages_of(t) if is_notice(m)]
        return t if len(notices) >= 5 else None

    poll(all_results_back, what="five results back on the caller branch")
    jobs = settled_jobs(api, sid)
    t = transcript(api, me)
    for todo, _eid in dispatched.items():
        assert t["text"].count(f"DONE<todo-{todo}>") == 1, (todo, t["text"])
    turns = assert_linear_followup_chain(t, 1)
    notices = [m for turn in turns for m in turn["messages"] if is_notice(m)]
    assert len(notices) == 5
    followups = [j for j in jobs.values() if j["kind"] == "followup"]
    assert 1 <= len(followups) <= 5 and len(followups) == len(turns)
    assert all(j["status"] == "succeeded" for j in followups), followups

    # 05 update the plan
    for todo in todos:
        assert ok(tool(api, me, "todo_update", todo_id=todo, status="completed"))["details"]["status"] == "completed"
    assert [t["status"] for t in ok(tool(api, me, "todo_list"))["details"]["todos"]] == ["completed"] * 5
    settle(api, sid)


# --- scene 2: find an existing agent, then message it or give it a task ----------------------------


def test_an_agent_found_in_another_session_is_sent_a_message_or_delegated_a_task(team, api_as, run_queued):
    """list_agents(scope="all") finds an agent in another session;
    send_message to an idle target returns a delivery_id naming the message turn's execution and
    brings nothing back; agent(to=…) returns an execution_id whose final reply comes back to the
    caller automatically as a follow-up. Recipient headers: "[message from SID:HEAD]" (reply
    optional) vs "[task from SID:HEAD]" (reply returns automatically)."""
    owner, api = api_as(team.owner), api_as(team.member)
    make_spec(owner, "expert", {
        "user": [{"text": "I know the parser well"}],
        "message": [{"text": "MSGREPLY to {{prompt}}"}],
        "task": [{"text": "TASKRESULT for {{prompt}}"}],
    }, )
    make_spec(owner, "asker", {"user": [{"text": "ok"}], "followup": [{"text": "thanks"}]})
    expert_sid = open_session(api, "expert", "parser work")
    user_turn(api, expert_sid, "explain the parser")
    sid = open_session(api, "asker", "caller")
    user_turn(api, sid)
    me = main_address(api, sid)

    # 01 find it: grouped by session, a ready-to-use to="SID:HEAD", sizes, no previews
    listing = ok(tool(api, me, "list_agents", scope="all"))
    groups = {g["session_id"]: g for g in listing["details"]["sessions"]}
    assert expert_sid in groups and sid in groups, listing
    row = next(b for b in groups[expert_sid]["branches"] if b["name"] == "main")
    target = row["address"]
    assert target == main_address(api, expert_sid) and target.startswith(expert_sid + ":")
    assert row["turns"] == 1 and re.search(rf'to="{re.escape(target)}"\s+\u2014 1 turns, <1k chars', listing["text"]), listing

    # 02a a message: the idle target runs a turn now; delivery_id is that execution
    sender_address = main_address(api, sid)
    r = ok(tool(api, me, "send_message", to=target, message="the lexer changed"))
    assert r["details"]["queued"] is False and r["details"]["delivery_id"], r
    msg_job = api.wait(r["details"]["delivery_id"], timeout=WAIT)
    assert msg_job["status"] == "succeeded" and msg_job["kind"] == "message", msg_job
    assert msg_job["session"] == expert_sid and msg_job["result"] == "MSGREPLY to the lexer changed"

    # 02b a task: execution_id; the final reply comes back to me on its own
    r = ok(tool(api, me, "agent", to=target, prompt="fix the tokenizer"))
    task_id = r["details"]["execution_id"]
    assert task_id and task_id != msg_job["id"], r
    task_job = api.wait(task_id, timeout=WAIT)
    assert task_job["status"] == "succeeded" and task_job["kind"] == "task", task_job
    poll(lambda: any(is_notice(m) and "TASKRESULT for fix the tokenizer" in m["text"]
                     for m in messages_of(transcript(api, me))), what="the task result back at the caller")
    jobs = settled_jobs(api, sid, expert_sid)

    # the recipient's headers, read with the transcript API
    tt = transcript(api, target)
    by_job_kind = {}
    for turn in tt["turns"]:
        first = turn["messages"][0]
        by_job_kind[first["kind"]] = first["text"]
    assert by_job_kind["message"].startswith(f"[message from {sender_address}]"), by_job_kind["message"]
    assert "reply is optional" in by_job_kind["message"]
    assert by_job_kind["task"].startswith(f"[task from {sender_address}]"), by_job_kind["task"]
    assert "returned to the sender automatically" in by_job_kind["task"]
    assert by_job_kind["task"].rstrip().endswith("fix the tokenizer")

    # only the task came back: one follow-up on the caller, carrying the task's result, not the message's
    mine = transcript(api, me)
    notices = [m for m in messages_of(mine) if is_notice(m)]
    assert len(notices) == 1 and "TASKRESULT" in notices[0]["text"] and task_id in notices[0]["text"], notices
    assert "MSGREPLY" not in mine["text"]
    assert [j["kind"] for j in jobs.values() if j["kind"] == "followup"] == ["followup"]
    # deliveries name a target that exists; nothing was created for them
    assert [b["name"] for b in branches(api, expert_sid)] == ["main"]


# --- scene 3: read the end of an old conversation without running anything -----------------------


def test_reading_the_last_ten_turns_never_runs_anything(team, api_as, run_queued):
    """read_conversation: with the SID:HEAD that list_agents
    gives, start_turn=-10 on a 12-turn branch returns exactly turns 2..11; include_function_calls
    and max_chars shape the text; reading never starts a run (no new job anywhere)."""
    owner, api = api_as(team.owner), api_as(team.member)
    make_spec(owner, "chatty", {"user": [{"tool_calls": [{"name": "todo_list", "arguments": {}}]}, {"text": "answer to {{prompt}}"}]})
    old = open_session(api, "chatty", "old work")
    last = None
    for n in range(12):  # queued behind each other on the branch, run in order
        last = user_turn(api, old, f"question {n}", wait=False)
    assert api.wait(last, timeout=WAIT)["status"] == "succeeded"
    settle(api, old)
    sid = open_session(api, "chatty", "reader")
    user_turn(api, sid)
    settle(api, sid)
    me = main_address(api, sid)

    listing = ok(tool(api, me, "list_agents", scope="all"))
    row = next(b for g in listing["details"]["sessions"] if g["session_id"] == old for b in g["branches"])
    assert row["turns"] == 12, row
    jobs_before, events_before = job_count(), {s: len(jobs_of(api, s)) for s in (old, sid)}

    r = ok(tool(api, me, "read_conversation", session_id=row["address"], start_turn=-10))
    assert [t["index"] for t in r["details"]["turns"]] == list(range(2, 12)), r["details"]["turns"]
    assert r["details"]["total_turns"] == 12
    texts = [m["text"] for turn in r["details"]["turns"] for m in turn["messages"]]
    assert "question 1" not in texts and texts[0] == "question 2" and texts[-1] == "answer to question 11", texts
    assert "answer to question 1\n" not in r["text"] and "answer to question 11" in r["text"]
    assert "[tool result: todo_list]" in r["text"]

    r = ok(tool(api, me, "read_conversation", session_id=row["address"], start_turn=-10, include_function_calls=False))
    assert "[tool result" not in r["text"] and "todo_list(" not in r["text"] and "answer to question 11" in r["text"]

    r = ok(tool(api, me, "read_conversation", session_id=row["address"], start_turn=-10, max_chars=300))
    kept = [t["index"] for t in r["details"]["turns"]]
    assert kept and kept[0] == 2 and len(kept) < 10 and r["details"]["omitted_turns"] == 10 - len(kept), r["details"]

    # the transcript API renders the same window; a whole session id reads its selected branch
    assert [t["index"] for t in transcript(api, row["address"], start_turn=-10)["turns"]] == list(range(2, 12))
    r = ok(tool(api, me, "read_conversation", session_id=old, start_turn=-1))
    assert [t["index"] for t in r["details"]["turns"]] == [11]

    settle(api, old, sid)  # a read that started anything would show as a job row at once
    assert job_count() == jobs_before
    assert {s: len(jobs_of(api, s)) for s in (old, sid)} == events_before


# --- eight completions form one serial chain (docs/contract.md#results-come-back-exactly-once) -----


def test_eight_children_one_serial_chain_of_followups(team, api_as, worker):
    """A turn spawns 8 background children; their results come
    back to the caller branch exactly once each (none lost or doubled), as one linear chain
    notice→answer→notice→answer at the current tip (never siblings of the spawning node), and
    every follow-up turn succeeds."""
    owner, api = api_as(team.owner), api_as(team.member)
    calls = [{"name": "agent", "arguments": {"prompt": f"part-{i}", "description": f"w{i}", "run_in_background": True}}
             for i in range(8)]
    make_spec(owner, "fanout", {
        "user": [{"tool_calls": calls}, {"text": "dispatched eight"}],
        # slow enough that most results arrive after the spawning turn has ended (a result that
        # arrives while it still runs is drained into its mailbox instead — also exactly once)
        "spawn": [{"sleep_ms": 500}, {"text": "RESULT[{{prompt}}]"}],
        "followup": [{"text": "ack"}],
    })
    sid = open_session(api, "fanout", "fan-out")
    eid = user_turn(api, sid, "split the work")
    me = main_address(api, sid)
    tool_results = [m for m in messages_of(transcript(api, me)) if m["role"] == "tool"]
    children = [re.search(r"execution (\S+);", m["text"]).group(1) for m in tool_results]
    assert len(set(children)) == 8, tool_results
    for child in children:
        assert api.wait(child, timeout=WAIT)["status"] == "succeeded"

    poll(lambda: sum(is_notice(m) for m in messages_of(transcript(api, me))) >= 8,
         what="eight results back on the caller branch")
    jobs = settled_jobs(api, sid)
    t = transcript(api, me)
    for i in range(8):
        assert t["text"].count(f"RESULT[part-{i}]") == 1, (i, t["text"])
    for child in children:
        assert sum(child in m["text"] for m in messages_of(t) if is_notice(m)) == 1, child
    turns = assert_linear_followup_chain(t, 1)
    assert t["turns"][0]["messages"][0]["text"] == "split the work"
    followups = {k: j for k, j in jobs.items() if j["kind"] == "followup"}
    assert len(followups) == len(turns), (followups, [tn["index"] for tn in turns])
    assert 1 <= len(followups) <= 8
    assert all(j["status"] == "succeeded" for j in followups.values()), followups
    # one chain: the caller's main branch holds every follow-up; no other branch appeared in it
    names = sorted(b["name"] for b in branches(api, sid))
    assert names == sorted(["main", *(f"w{i}" for i in range(8))]), names
    # the person's selected HEAD stays where their own turn ended
    user_final = t["turns"][0]["messages"][-1]
    assert user_final["role"] == "assistant" and session_head(api, sid) == user_final["id"]
    assert eid not in followups


# --- a busy target queues messages and runs them after, FIFO (docs/contract.md#the-inbox) ----------


def test_message_to_busy_branch_waits_and_runs_after_in_order(team, api_as, worker):
    """While the target runs a slow turn, send_message returns
    "queued" (no delivery_id yet); when that turn ends the messages run as message turns on the
    target, one after another, in the order they were sent, each with its sender header."""
    owner, api = api_as(team.owner), api_as(team.member)
    # the slow turn runs until this test cancels it (never a timed busy period)
    make_spec(owner, "slow", {"user": [{"sleep_ms": 600_000}, {"text": "slow done"}],
                              "message": [{"text": "read {{prompt}}"}]})
    make_spec(owner, "sender", {"user": [{"text": "ok"}]})
    sid = open_session(api, "sender", "sender")
    user_turn(api, sid)
    me = main_address(api, sid)
    target_sid = open_session(api, "slow", "busy one")
    busy = user_turn(api, target_sid, "think hard", wait=False)
    api.wait(busy, statuses={"running"}, timeout=WAIT)
    target = main_address(api, target_sid)

    receipts = [ok(tool(api, me, "send_message", to=target, message=f"note {n}")) for n in range(3)]
    assert api.get(f"/api/executions/{busy}").json()["status"] == "running"
    for r in receipts:
        assert r["details"]["queued"] is True and r["details"]["delivery_id"] is None, r
        assert "busy" in r["text"] and "queued" in r["text"]
    queued_events = [e for e in events(api, target_sid) if e["type"] == "inbox.queued"]
    assert len(queued_events) == 3

    assert cancel(api, busy).status_code == 202  # the slow turn ends (a cancel is an end like any other)
    assert api.wait(busy, timeout=WAIT)["status"] == "cancelled"

    def three_message_turns():
        jobs = jobs_of(api, target_sid)
        done = [j for j in jobs.values() if j["kind"] == "message" and j["status"] == "succeeded"]
        return len(done) == 3

    poll(three_message_turns, what="three message turns on the target")
    jobs = settled_jobs(api, target_sid, sid)
    t = transcript(api, target)
    kinds = [turn["messages"][0]["kind"] for turn in t["turns"]]
    assert kinds == ["normal", "message", "message", "message"], kinds
    assert t["turns"][0]["messages"][-1]["text"] == "think hard"  # the cancelled turn left no answer
    for n, turn in enumerate(t["turns"][1:]):
        first, last = turn["messages"][0], turn["messages"][-1]
        assert first["text"].startswith("[message from " + sid + ":"), first["text"]
        assert first["text"].endswith(f"note {n}") and last["text"] == f"read note {n}", turn
    # messages bring nothing back to the sender
    assert not [j for j in jobs.values() if j["kind"] == "followup"]
    assert not [e for e in events(api, target_sid) if e["type"] == "inbox.queued"][3:]


# --- the inbox cap and duplicate rejection ----------------------------------------------------------


def test_inbox_cap_drops_oldest_with_notice_and_rejects_duplicates(team, api_as, worker):
    """At most 50 queued deliveries per busy target. The 51st drops the oldest and
    the dropped message's *sender session* gets an ``inbox.dropped`` event; the same text from the
    same sender still queued within 60 s is rejected with code duplicate_message (and drops nothing);
    the same text from another sender is not a duplicate. Queued deliveries re-check the archive
    flag before they start: archiving the target meanwhile rejects them with a reason, never silently:
    each sender gets a failed result per refused message."""
    owner, api = api_as(team.owner), api_as(team.member)
    make_spec(owner, "slow2", {"user": [{"sleep_ms": 120000}, {"text": "slow done"}]})  # ended by a cancel below
    make_spec(owner, "sender2", {"user": [{"text": "ok"}]})
    first_sid = open_session(api, "sender2", "first sender")
    user_turn(api, first_sid)
    other_sid = open_session(api, "sender2", "other sender")
    user_turn(api, other_sid)
    first, other = main_address(api, first_sid), main_address(api, other_sid)
    target_sid = open_session(api, "slow2", "busy one")
    busy = user_turn(api, target_sid, "think very hard", wait=False)
    api.wait(busy, statuses={"running"}, timeout=WAIT)
    target = main_address(api, target_sid)
    jobs_before = job_count()

    ok(tool(api, first, "send_message", to=target, message="m0"))  # the oldest, from the first session
    for n in range(1, 50):
        r = ok(tool(api, other, "send_message", to=target, message=f"m{n}"))
        assert r["details"]["queued"] is True and "dropped" not in r["text"], r
    # 50 queued. A duplicate from the same sender is refused and drops nothing.
    dup = tool(api, other, "send_message", to=target, message="m7")
    assert dup["is_error"] and dup["details"]["code"] == "duplicate_message", dup
    assert "already waiting" in dup["text"]
    assert not [e for e in events(api, first_sid) if e["type"] == "inbox.dropped"]
    # The 51st drops the oldest (m0): the notice lands in the *first* session, not the current sender's.
    r = ok(tool(api, other, "send_message", to=target, message="m50"))
    assert r["details"]["queued"] is True and "oldest queued message was dropped" in r["text"], r
    dropped = [e for e in events(api, first_sid) if e["type"] == "inbox.dropped"]
    assert len(dropped) == 1 and dropped[0]["payload"]["text_preview"] == "m0", dropped
    assert not [e for e in events(api, other_sid) if e["type"] == "inbox.dropped"]
    # Same text, other sender: not a duplicate. It is the 51st again and drops m1 (from `other`).
    ok(tool(api, first, "send_message", to=target, message="m7"))
    dropped = [e for e in events(api, other_sid) if e["type"] == "inbox.dropped"]
    assert [e["payload"]["text_preview"] for e in dropped] == ["m1"], dropped
    assert api.get(f"/api/executions/{busy}").json()["status"] == "running", "the slow turn ended too early for this test"
    # Queued messages are not executions yet; each dropped one is recorded as a failed execution
    # (error_code inbox_overflow) whose result reaches its sender's conversation exactly once.
    from collab.models import Job

    overflow = list(Job.objects.filter(error_code="inbox_overflow").values_list("caller_session_id", flat=True))
    assert sorted(overflow) == sorted([first_sid, other_sid]), overflow
    notices = Job.objects.filter(kind="followup", followup_of__error_code="inbox_overflow")
    assert job_count() == jobs_before + 2 + notices.count() and notices.count() <= 2

    # Archive the target while its 50 deliveries wait, then end its turn (a cancel is an end like any
    # other): the queued deliveries are refused with a reason, none silently lost.
    assert api.post(f"/api/branches/{target}/archive", {"reason": "enough"}).status_code == 200
    assert cancel(api, busy).status_code == 202
    assert api.wait(busy, timeout=WAIT)["status"] == "cancelled"

    def rejected(sid):
        return [e["payload"]["text_preview"] for e in events(api, sid) if e["type"] == "delivery.rejected"]

    poll(lambda: len(rejected(first_sid)) + len(rejected(other_sid)) >= 50, what="50 rejected deliveries")
    settle(api, target_sid, first_sid, other_sid)
    assert rejected(first_sid) == ["m7"]
    assert rejected(other_sid) == [f"m{n}" for n in range(2, 51)]
    assert all(e["payload"]["code"] == "archived" for s in (first_sid, other_sid)
               for e in events(api, s) if e["type"] == "delivery.rejected")
    notices = Job.objects.filter(kind="followup", followup_of__error_code="inbox_overflow").count()
    assert notices == 2  # each dropped message's sender heard of it exactly once
    # each refused delivery is a failed execution (error_code archived) whose result reaches its
    # sender exactly once: one follow-up per message, in the sender's session
    refused = list(Job.objects.filter(error_code="archived", kind="message").values_list("caller_session_id", flat=True))
    assert sorted(refused) == sorted([first_sid] + [other_sid] * 49), refused
    def heard():
        return sorted(Job.objects.filter(kind="followup", followup_of__error_code="archived").values_list("session_id", flat=True))

    poll(lambda: heard() == sorted(refused), what="one follow-up per refused message")
    settle(api, first_sid, other_sid)
    assert job_count() == jobs_before + 2 + notices + 2 * len(refused)


# --- archived targets (docs/contract.md#archive) ----------------------------------------------------


def test_archived_agent_rejects_deliveries_but_history_stays_readable_and_forkable(team, api_as, run_queued):
    """Archive is global (archived by one person, hidden in another's
    ordinary listings); both delivery paths (agent(to=…), send_message) refuse an archived target
    with code "archived" and create nothing — also through a stale SID:HEAD; history stays readable
    (transcript API, read_conversation) and forkable (agent(start_from="SID:MSG")); list_agents
    (scope="archived") lists it; re-archiving keeps the first archived_at and reason."""
    owner, member, maintainer = api_as(team.owner), api_as(team.member), api_as(team.maintainer)
    make_spec(owner, "arch", {"user": [{"text": "main here"}], "spawn": [{"text": "helper finished: {{prompt}}"}]})
    home = open_session(member, "arch", "home")
    user_turn(member, home)
    r = ok(tool(member, main_address(member, home), "agent", prompt="investigate the leak", description="helper"))
    assert r["text"] == "helper finished: investigate the leak" and r["details"]["status"] == "succeeded", r
    helper = r["details"]["address"]
    helper_row = branch_named(member, home, "helper")
    assert helper_row["address"] == helper
    helper_msgs = messages_of(transcript(member, helper))
    stale = f"{home}:{next(m['id'] for m in helper_msgs if m['kind'] == 'agent_spawn')}"
    assert stale != helper

    # someone else's session, used by another person to look around and deliver
    elsewhere = open_session(maintainer, "arch", "elsewhere")
    user_turn(maintainer, elsewhere)
    them = main_address(maintainer, elsewhere)
    seen = ok(tool(maintainer, them, "list_agents", scope="all"))["details"]["sessions"]
    assert helper in [b["address"] for g in seen for b in g["branches"]]

    # the member archives it (their own branch)
    a = member.post(f"/api/branches/{helper}/archive", {"reason": "leak found"})
    assert a.status_code == 200 and a.json()["archived"] is True, a.content
    archived_at = a.json()["archived_at"]
    settle(member, home, elsewhere)
    branches_before, jobs_before = branch_count(), job_count()

    # hidden for everyone's ordinary listings, listed in the archived view
    seen = ok(tool(maintainer, them, "list_agents", scope="all"))["details"]["sessions"]
    assert helper not in [b["address"] for g in seen for b in g["branches"]]
    home_main = main_address(member, home)
    in_session = ok(tool(maintainer, home_main, "list_agents"))["details"]["sessions"]
    assert [b["name"] for g in in_session for b in g["branches"]] == ["main"]
    arch = ok(tool(maintainer, home_main, "list_agents", scope="archived"))
    rows = [b for g in arch["details"]["sessions"] for b in g["branches"]]
    assert [(b["address"], b["archived"]) for b in rows] == [(helper, True)], arch
    assert [b["name"] for b in branches(member, home)] == ["main"]
    assert [b["name"] for b in branches(member, home, "archived")] == ["helper"]

    # both delivery paths refuse it with code "archived" — by its tip and by a stale head
    for address in (helper, stale):
        for name, args in (("agent", {"to": address, "prompt": "one more thing"}),
                           ("send_message", {"to": address, "message": "one more thing"})):
            res = tool(maintainer, them, name, **args)
            assert res["is_error"] and res["details"]["code"] == "archived", (name, address, res)
            assert "archived" in res["text"]
    assert (branch_count(), job_count()) == (branches_before, jobs_before)

    # history stays readable
    t = transcript(maintainer, helper)
    assert "helper finished: investigate the leak" in t["text"]
    read = ok(tool(maintainer, them, "read_conversation", session_id=helper))
    assert "helper finished: investigate the leak" in read["text"] and read["details"]["archived"] is True

    # and forkable: one call makes a new branch at that node and runs it
    fork_at = helper_msgs[-1]["id"]
    forked = ok(tool(maintainer, them, "agent", start_from=f"{home}:{fork_at}", prompt="carry on", description="revived"))
    assert forked["text"] == "helper finished: carry on", forked
    revived = branch_named(member, home, "revived")
    assert revived["archived"] is False and revived["forked_from"] == f"{home}:{fork_at}"
    assert api_as(team.owner).get(f"/api/executions/{forked['details']['execution_id']}").json()["session"] == home

    # archiving again (another person, another reason) keeps the first time and reason
    again = ok(tool(maintainer, them, "archive_agent", to=helper, reason="second reason"))
    assert again["details"]["reason"] == "leak found"
    row = branch_named(member, home, "helper", scope="archived")
    assert row["archived_at"] == archived_at and row["archive_reason"] == "leak found"
    settle(member, home, elsewhere)


# --- fork and run in one call; `to` never creates (docs/contract.md#agent) -------------------------


def test_fork_and_run_in_one_call_and_missing_to_creates_nothing(team, api_as, run_queued):
    """The `agent` modes: one agent(start_from="T:M", prompt, description) call creates a
    branch at exactly node M of session T, names it, and runs the prompt there (foreground: the
    final text comes back). With `to` naming a missing target — an unknown SID:HEAD, an unknown
    name, or a branch the caller may not see — it errors and creates no branch and no job."""
    owner, api = api_as(team.owner), api_as(team.member)
    make_spec(owner, "forker", {"user": [{"text": "answer: {{prompt}}"}], "spawn": [{"text": "reviewed: {{prompt}}"}]})
    t_sid = open_session(api, "forker", "T")
    user_turn(api, t_sid, "first question")
    user_turn(api, t_sid, "second question")
    t_main = transcript(api, main_address(api, t_sid))
    m = t_main["turns"][0]["messages"][-1]
    assert m["text"] == "answer: first question"
    s_sid = open_session(api, "forker", "S")
    user_turn(api, s_sid)
    me = main_address(api, s_sid)

    r = ok(tool(api, me, "agent", start_from=f"{t_sid}:{m['id']}", prompt="review this", description="review"))
    assert r["text"] == "reviewed: review this" and r["details"]["session_id"] == t_sid, r
    review = branch_named(api, t_sid, "review")
    assert review["forked_from"] == f"{t_sid}:{m['id']}" and review["address"] == r["details"]["address"]
    rt = transcript(api, review["address"])
    ids = [x["id"] for x in messages_of(rt)]
    assert ids.index(m["id"]) == len(t_main["turns"][0]["messages"]) - 1  # history up to M, then the new turn
    new_turn = rt["turns"][1]["messages"]
    assert new_turn[0]["kind"] == "agent_spawn" and new_turn[0]["text"].startswith(f"[task from {s_sid}:")
    assert new_turn[-1]["text"] == "reviewed: review this"
    assert "second question" not in rt["text"]
    job = api.get(f"/api/executions/{r['details']['execution_id']}").json()
    assert (job["kind"], job["status"], job["session"], job["caller_session"]) == ("spawn", "succeeded", t_sid, s_sid)
    assert [b["name"] for b in branches(api, s_sid)] == ["main"]
    settle(api, t_sid, s_sid)

    # `to` naming something missing or invisible: an error, and nothing is created
    outsider = api_as(team.outsider)
    make_spec(outsider, "hidden", {"user": [{"text": "secret"}]}, project="beta")
    beta_sid = open_session(outsider, "hidden", "beta", project="beta")
    user_turn(outsider, beta_sid)
    invisible = main_address(outsider, beta_sid)
    before = (branch_count(), job_count(), len(branches(api, t_sid)), len(jobs_of(api, t_sid, s_sid)))
    answers = {}
    for to in (f"{t_sid}:no-such-message", "no-such-agent", invisible, f"no-such-session:{m['id']}"):
        for name, args in (("agent", {"to": to, "prompt": "do it"}),
                           ("agent", {"to": to, "prompt": "do it", "run_in_background": True}),
                           ("send_message", {"to": to, "message": "hi"})):
            res = tool(api, me, name, **args)
            assert res["is_error"] and res["details"]["code"] == "not_found", (to, name, res)
            answers[to] = res["text"].replace(to, "<to>")
    assert answers[invisible] == answers[f"{t_sid}:no-such-message"], answers  # no existence leak
    bad = tool(api, me, "agent", to=main_address(api, t_sid), prompt="x", start_from="inherit")
    assert bad["is_error"] and bad["details"]["code"] == "invalid_arguments", bad
    bad = tool(api, me, "send_message", to="new", message="x")
    assert bad["is_error"] and bad["details"]["code"] == "invalid_target", bad
    assert (branch_count(), job_count(), len(branches(api, t_sid)), len(jobs_of(api, t_sid, s_sid))) == before
    settle(outsider, beta_sid)


# --- the attach pointer of a cross-session spawn (data side) -----------------------------------------


def test_cross_session_spawn_stores_attach_in_caller_session_and_moves_no_head(team, api_as, worker):
    """Attach: a turn in S spawns into session T at node M. The attach
    pointer is stored in S next to the calling node (kind ``attach``, metadata.attach
    session_id=T, head_id=the target's first node); the target's first node carries
    caller=S:<calling node> and spawned_from_session=S; neither session's selected HEAD moves —
    not at spawn, not when the child finishes and its result comes back."""
    from collab.models import Message

    owner, api = api_as(team.owner), api_as(team.member)
    make_spec(owner, "target", {"user": [{"text": "target answer"}]})
    t_sid = open_session(api, "target", "T")
    user_turn(api, t_sid, "setup")
    m_id = transcript(api, main_address(api, t_sid))["turns"][0]["messages"][-1]["id"]
    t_head = session_head(api, t_sid)
    assert t_head == m_id
    make_spec(owner, "remote", {
        "user": [{"tool_calls": [{"name": "agent", "arguments": {
            "prompt": "look at it remotely", "description": "remote", "start_from": f"{t_sid}:{m_id}",
            "run_in_background": True}}]}, {"text": "spawned {{last.details.execution_id}}"}],
        "spawn": [{"sleep_ms": 100}, {"text": "remote result"}],
        "followup": [{"text": "seen"}],
    })
    s_sid = open_session(api, "remote", "S")
    eid = user_turn(api, s_sid, "go remote")
    s_head = session_head(api, s_sid)
    child_id = api.get(f"/api/executions/{eid}").json()["result"].split()[-1]
    child = api.wait(child_id, timeout=WAIT)
    assert child["status"] == "succeeded" and child["session"] == t_sid and child["caller_session"] == s_sid
    poll(lambda: any(is_notice(m) and "remote result" in m["text"]
                     for m in messages_of(transcript(api, main_address(api, s_sid)))), what="the follow-up in S")
    settle(api, s_sid, t_sid)

    # the pointer lives in S, hanging off the calling node (the assistant tool-call node)
    s_turn = transcript(api, main_address(api, s_sid))["turns"][0]["messages"]
    calling = next(m for m in s_turn if m["role"] == "assistant" and m["tool_calls"])
    pointers = list(Message.objects.filter(kind="attach", session_id=s_sid))
    assert len(pointers) == 1, pointers
    pointer = pointers[0]
    assert pointer.predecessor_id == calling["id"] and pointer.role == "system"
    first = child["prompt_msg"]
    assert pointer.metadata["attach"]["session_id"] == t_sid and pointer.metadata["attach"]["head_id"] == first
    assert pointer.metadata["attach"]["execution_id"] == child_id
    assert not Message.objects.filter(kind="attach", session_id=t_sid).exists()
    created = [e for e in events(api, s_sid) if e["type"] == "message.created" and e["payload"]["kind"] == "attach"]
    assert [e["payload"]["id"] for e in created] == [pointer.pk]
    assert [e["payload"]["attach"] for e in events(api, s_sid) if e["type"] == "agent.spawned"] == [pointer.pk]

    # the target's first node: in T, right after M, marked with the caller and the source session
    node = Message.objects.get(pk=first)
    assert node.session_id == t_sid and node.predecessor_id == m_id and node.kind == "agent_spawn"
    assert node.metadata["caller"] == f"{s_sid}:{calling['id']}"
    assert node.metadata["spawned_from_session"] == s_sid
    remote = branch_named(api, t_sid, "remote")
    assert remote["forked_from"] == f"{t_sid}:{m_id}"

    # nobody's selected HEAD moved
    assert session_head(api, t_sid) == t_head
    assert session_head(api, s_sid) == s_head == s_turn[-1]["id"]


# --- failures come back too, once, and nothing loops -----------------------------------------------


def test_failed_and_empty_results_come_back_once_without_loops(team, api_as, run_queued):
    """A background child whose turn fails (51 tool calls in one step hit the
    50-call cap: error_code tool_call_limit), a child that answers with an empty reply, and a
    delegated task that fails all come back to the caller exactly once — the failures as
    "did not finish … is_error=true" notices. Even when the caller's follow-up turns fail
    themselves, no further jobs appear once things settle (no unbounded loop)."""
    owner, api = api_as(team.owner), api_as(team.member)
    too_many = [{"name": "todo_list", "arguments": {}}] * 51
    make_spec(owner, "failer", {"spawn": [{"tool_calls": too_many}], "task": [{"tool_calls": too_many}],
                                "user": [{"text": "idle"}]})
    make_spec(owner, "quiet", {"spawn": [{"text": ""}]})
    make_spec(owner, "boss", {
        "user": [{"tool_calls": [
            {"name": "agent", "arguments": {"prompt": "fail please", "description": "failing", "agent_id": "failer",
                                            "run_in_background": True}},
            {"name": "agent", "arguments": {"prompt": "say nothing", "description": "silent", "agent_id": "quiet",
                                            "run_in_background": True}},
        ]}, {"text": "dispatched"}],
        "followup": [{"tool_calls": too_many}],  # the caller's follow-up turns fail too
    })
    other = open_session(api, "failer", "worker session")
    user_turn(api, other)
    sid = open_session(api, "boss", "boss")
    user_turn(api, sid, "go")
    me = main_address(api, sid)
    task = ok(tool(api, me, "agent", to=main_address(api, other), prompt="fail as a task"))["details"]["execution_id"]

    spawned = {j: v for j, v in jobs_of(api, sid).items() if v["kind"] == "spawn"}
    assert len(spawned) == 2
    finished = {j: api.wait(j, timeout=WAIT) for j in [*spawned, task]}
    failing = [j for j, v in finished.items() if v["status"] == "failed"]
    assert len(failing) == 2, finished
    assert all(finished[j]["error_code"] == "tool_call_limit" and finished[j]["is_error"] for j in failing)
    quiet = next(j for j, v in finished.items() if v["status"] == "succeeded")
    assert finished[quiet]["result"] == ""

    poll(lambda: sum(is_notice(m) for m in messages_of(transcript(api, me))) >= 3, what="three notices")
    jobs = settled_jobs(api, sid, other)
    t = transcript(api, me)
    notices = [m for m in messages_of(t) if is_notice(m)]
    assert len(notices) == 3, notices
    for j in failing:
        mine = [n for n in notices if f"execution {j}" in n["text"]]
        assert len(mine) == 1, (j, notices)
        assert "did not finish" in mine[0]["text"] and "is_error=true" in mine[0]["text"]
        assert "limit of 50 tool calls" in mine[0]["text"]
    empty = [n for n in notices if f"execution {quiet}" in n["text"]]
    assert len(empty) == 1 and "empty reply" in empty[0]["text"]
    followups = [j for j in jobs.values() if j["kind"] == "followup"]
    assert 1 <= len(followups) <= 3
    assert all(j["status"] == "failed" and j["error_code"] == "tool_call_limit" for j in followups), followups

    # no loop: at rest nothing is left that could start another job — no open job, no result
    # about to come back to any branch, no queued task (a loop would need one of them)
    assert wait_at_rest(WAIT)
    assert jobs_of(api, sid, other) == jobs
