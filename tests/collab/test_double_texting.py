"""Double-texting: a person's turn posted while the branch is busy follows
``multitask_strategy`` — ``enqueue`` (the default), ``reject`` (409 ``branch_busy``),
``interrupt`` (the running turn is cancelled through the cancel command, every tool call
it left gets a result, the new input runs on the same branch) or ``rollback`` (a fork from
just before the running turn's prompt runs the new input; the old branch is archived
"rolled back") — chosen per request or by the agent spec's default.

The strategies run on a real worker (fixture ``worker``); ``interrupt`` also with an
OpenAI-compatible model (tests/collab/fake_llm.py) that had asked for tool calls, and the
request that model received after the interrupt is checked to be well-formed.
"""

import random
import threading
import time

import pytest
from django.utils.dateparse import parse_datetime
from django.db import connection, transaction

from collab.models import Branch, ExecutionCommand, Job, Message, Session
from collab.runtime.providers.mapping import MISSING_RESULT, TITLE_SYSTEM, openai_messages
from tests.collab.fake_llm import OpenAIDialect
from tests.collab.test_providers import dialect, fake, fake_server, operator_connection  # noqa: F401 (fixtures)
from tests.conftest import TERMINAL, poll, settle_session

SLOW = [{"sleep_ms": 30_000}, {"text": "slow done: {{prompt}}"}]  # cancelled long before it answers


def post_turn(api, sid, prompt, strategy=None, **more):
    body = {"prompt": prompt, **more}
    if strategy is not None:
        body["multitask_strategy"] = strategy
    return api.post(f"/api/sessions/{sid}/turns", body)


def started(api, sid, prompt, strategy=None) -> str:
    r = post_turn(api, sid, prompt, strategy)
    assert r.status_code == 202, r.content
    return r.json()["execution_id"]


def wait_running(api, execution_id):
    return api.wait(execution_id, statuses={"running"}, timeout=20)


def unending_turn(api_as, team, api, sid, prompt) -> str:
    """A running turn (agent ``unending``) whose model call cannot end by itself during a test
    (the scripted provider's longest sleep): it is still running whenever the test acts next,
    and it ends only by the test's own interrupt or cancel — never a timed busy period."""
    r = api_as(team.owner).post("/api/projects/alpha/agent-specs", {
        "agent_id": "unending", "provider": "scripted", "script": [{"sleep_ms": 600_000}, {"text": "never"}]})
    assert r.status_code == 201, r.content
    r = post_turn(api, sid, prompt, agent_id="unending")
    assert r.status_code == 202, r.content
    running = r.json()["execution_id"]
    wait_running(api, running)
    return running


def job_events(api, sid) -> dict[str, list[str]]:
    events, after = [], 0
    while page := api.get(f"/api/sessions/{sid}/events", after=after).json()["events"]:
        events += page
        after = page[-1]["seq"]
    out: dict[str, list[str]] = {}
    for e in events:
        if e["type"].startswith("job.") and "job" in e["payload"]:
            out.setdefault(e["payload"]["job"], []).append(e["type"].removeprefix("job."))
    return out


ORDER = {"queued": 0, "running": 1, "stopping": 2, "succeeded": 3, "failed": 3, "cancelled": 3, "interrupted": 3}


def assert_legal_transitions(api, sid) -> None:
    """Every job's state changes, as logged, go queued → running → (stopping →) one end, or
    queued → cancelled: never backwards, never twice, never two ends."""
    for job, states in job_events(api, sid).items():
        assert states[0] == "queued", (job, states)
        assert states[-1] in TERMINAL, (job, states)
        ranks = [ORDER[s] for s in states]
        assert ranks == sorted(set(ranks)), (job, states)


def assert_every_call_answered(messages: list[dict]) -> None:
    """An OpenAI Chat Completions ``messages`` list is well-formed for tools: each assistant
    message's tool calls are followed, before anything else, by one tool message per call id."""
    for n, m in enumerate(messages):
        calls = [c["id"] for c in (m.get("tool_calls") or [])] if m["role"] == "assistant" else []
        if not calls:
            continue
        following = []
        for later in messages[n + 1:]:
            if later["role"] != "tool":
                break
            following.append(later["tool_call_id"])
        assert sorted(following) == sorted(calls), (calls, following, messages)
    ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert len(ids) == len(set(ids)), ids


def prompts_of(sid) -> list[str]:
    """The prompt of each of the session's jobs (``Job.prompt_text``: its node's, or its row's if it never started)."""
    return [j.prompt_text for j in Job.objects.filter(session_id=sid).select_related("prompt_msg")]


def branch_history(branch_id):
    from collab.selectors.transcript import lineage

    return lineage(Branch.objects.get(pk=branch_id).tip)


# --- input checks (no worker needed) -------------------------------------------------------------------------


def test_a_bad_strategy_is_a_400_with_the_choices(team, scripted_session):
    api, sid = scripted_session(team.member, [{"text": "hi"}])
    for bad in ("queue", "INTERRUPT", 3, ["reject"]):
        r = post_turn(api, sid, "hello", bad)
        assert r.status_code in (400, 422), (bad, r.content)
        body = r.json()
        assert body["detail"], body
        if isinstance(bad, str):
            assert r.status_code == 400 and body["code"] == "invalid_multitask_strategy"
            assert "enqueue, reject, interrupt, rollback" in body["detail"]
    assert Job.objects.filter(session_id=sid).count() == 0


def test_a_spec_default_strategy_is_checked_when_the_spec_is_saved(team, api_as):
    r = api_as(team.owner).post("/api/projects/alpha/agent-specs", {
        "agent_id": "odd", "provider": "scripted", "limits": {"multitask_strategy": "sometimes"}})
    assert r.status_code == 400 and r.json()["code"] == "invalid_multitask_strategy", r.content
    r = api_as(team.owner).post("/api/projects/alpha/agent-specs", {
        "agent_id": "fine", "provider": "scripted", "limits": {"multitask_strategy": "reject"}})
    assert r.status_code == 201, r.content


def test_on_an_idle_branch_every_strategy_just_admits_the_turn(team, scripted_session):
    api, sid = scripted_session(team.member, [{"text": "hi"}])
    for strategy in ("enqueue", "reject", "interrupt", "rollback"):
        r = post_turn(api, sid, f"hello {strategy}", strategy)
        assert r.status_code == 202, r.content
    jobs = Job.objects.filter(session_id=sid)
    assert jobs.count() == 4 and {j.branch_id for j in jobs} == {Session.objects.get(pk=sid).branches.get().pk}
    assert not ExecutionCommand.objects.exists() and not Branch.objects.filter(archived=True).exists()


def test_a_turn_that_ends_with_tool_calls_unanswered_answers_them_at_completion(team, scripted_session):
    """Whatever ended the turn (here a worker lost mid-step: ``interrupted``), its completion
    gives each tool call without a result a synthetic one, once, at the branch's tip; the next
    request to a provider then needs no patching."""
    from collab.models import JobStatus, MessageRole
    from collab.services.execution import DANGLING_RESULT, claim_job, close_dangling_calls, finish_job
    from collab.services.messages import append_message

    api, sid = scripted_session(team.member, [{"text": "hi"}])
    job_id = started(api, sid, "use three tools")
    job = claim_job(job_id)
    assert job is not None and job.status == "running"
    calls = [{"id": f"call_{n}", "name": "todo_list", "arguments": {}} for n in range(3)]
    with transaction.atomic():
        append_message(job.branch, role=MessageRole.ASSISTANT, tool_calls=calls, job=job)
        append_message(job.branch, role=MessageRole.TOOL, text="no todos", tool_call_id="call_0", job=job,
                       metadata={"tool": "todo_list"})
    finish_job(job, status=JobStatus.INTERRUPTED, final_text=None, result_text="lost", is_error=True,
               error_code="interrupted", error_reason="the worker stopped")
    results = list(Message.objects.filter(job_id=job_id, role="tool").order_by("depth"))
    assert [(m.tool_call_id, m.text) for m in results] == [
        ("call_0", "no todos"),
        ("call_1", DANGLING_RESULT[JobStatus.INTERRUPTED]),
        ("call_2", DANGLING_RESULT[JobStatus.INTERRUPTED]),
    ]
    assert results[1].metadata["synthetic"] is True and results[1].metadata["is_error"] is True
    branch = Branch.objects.get(pk=job.branch_id)
    assert branch.tip_id == results[-1].pk
    with transaction.atomic():
        assert close_dangling_calls(job, branch, JobStatus.CANCELLED) == []  # idempotent
    wire = openai_messages(branch_history(branch.pk), "sys")
    assert_every_call_answered(wire)
    assert MISSING_RESULT not in str(wire)


def test_the_page_accepts_the_strategy_field(team, scripted_session, client):
    """The session page's composer posts ``multitask_strategy`` like the API (a bad value is a
    400 with the reason, never a 500)."""
    _, sid = scripted_session(team.member, [{"text": "hi"}])
    client.force_login(team.member)
    r = client.post(f"/s/{sid}/turns", {"prompt": "hello", "multitask_strategy": "sideways"})
    assert r.status_code == 400 and b"must be one of enqueue, reject, interrupt, rollback" in r.content
    r = client.post(f"/s/{sid}/turns", {"prompt": "hello", "multitask_strategy": "reject"})
    assert r.status_code in (200, 302), r.content
    assert Job.objects.filter(session_id=sid).count() == 1


# --- the strategies on a real worker --------------------------------------------------------------------------


@pytest.mark.slow
def test_reject_refuses_with_branch_busy_while_a_turn_runs(team, scripted_session, worker):
    api, sid = scripted_session(team.member, SLOW)
    running = started(api, sid, "take your time")
    wait_running(api, running)

    r = post_turn(api, sid, "are you done?", "reject")
    assert r.status_code == 409, r.content
    assert r.json()["code"] == "branch_busy" and running in r.json()["detail"]
    assert Job.objects.filter(session_id=sid).count() == 1  # nothing admitted
    assert api.get(f"/api/executions/{running}").json()["status"] == "running"  # nothing cancelled


@pytest.mark.slow
def test_the_spec_default_applies_and_the_request_overrides_it(team, scripted_session, worker):
    api, sid = scripted_session(team.member, SLOW, limits={"multitask_strategy": "reject"})
    running = started(api, sid, "take your time")
    wait_running(api, running)
    r = post_turn(api, sid, "again")  # no strategy: the spec's (reject)
    assert r.status_code == 409 and r.json()["code"] == "branch_busy", r.content
    queued = started(api, sid, "then this", "enqueue")  # the request's choice wins
    assert api.get(f"/api/executions/{queued}").json()["status"] == "queued"
    assert api.get(f"/api/executions/{running}").json()["status"] == "running"


@pytest.mark.slow
def test_enqueue_runs_the_new_input_after_the_running_turn(team, scripted_session, worker):
    # the first turn must still be running when the poll below looks (every 50 ms): 400 ms was
    # missed on a loaded machine (the poll saw it only once it had succeeded)
    api, sid = scripted_session(team.member, [{"sleep_ms": 2500}, {"text": "done: {{prompt}}"}])
    first = started(api, sid, "one")
    wait_running(api, first)
    second = started(api, sid, "two", "enqueue")
    a, b = api.wait(first), api.wait(second)
    assert (a["status"], b["status"]) == ("succeeded", "succeeded")
    # compared as times: the API writes whole seconds without a fraction ("…25Z" vs "…25.066Z")
    assert parse_datetime(a["finished_at"]) <= parse_datetime(b["started_at"]) and a["branch"] == b["branch"]
    assert not ExecutionCommand.objects.exists()


@pytest.mark.slow
def test_interrupt_cancels_through_the_command_and_runs_the_input_on_the_same_branch(
    team, scripted_session, api_as, worker
):
    api, sid = scripted_session(team.member, {"user": [{"text": "done: {{prompt}}"}]})
    running = unending_turn(api_as, team, api, sid, "long job")

    r = post_turn(api, sid, "stop, do this instead", "interrupt", agent_id="bot")
    assert r.status_code == 202, r.content
    new = r.json()
    done = api.wait(new["execution_id"])
    assert done["status"] == "succeeded" and done["result"] == "done: stop, do this instead"
    old = api.wait(running)
    assert old["status"] == "cancelled" and old["finished_at"] <= done["started_at"]
    assert new["branch"] == old["branch"] == done["branch"]

    command = ExecutionCommand.objects.get(job_id=running)  # the cancel command, on record
    assert command.action == "execution.cancel" and command.issued_by_id == team.member.pk
    texts = [m.text for m in branch_history(done["branch"]) if m.role in ("user", "assistant")]
    assert texts == ["long job", "stop, do this instead", "done: stop, do this instead"]
    assert_legal_transitions(api, sid)


@pytest.mark.slow
def test_interrupt_and_rollback_need_the_right_to_cancel_and_archive(team, scripted_session, api_as, worker):
    """A member may cancel only the executions they started: interrupting someone
    else's turn is refused, and nothing is admitted."""
    owner_api, sid = scripted_session(team.owner, SLOW)
    r = owner_api.post(f"/api/sessions/{sid}/shares", {"username": "member", "role": "member"})
    assert r.status_code in (200, 201), r.content
    running = started(owner_api, sid, "the owner's job")
    wait_running(owner_api, running)
    member = api_as(team.member)
    r = post_turn(member, sid, "mine now", "interrupt")
    assert r.status_code == 403, r.content
    r = post_turn(member, sid, "mine now", "rollback")  # archiving another's branch is not theirs either
    assert r.status_code == 403, r.content
    assert Job.objects.filter(session_id=sid).count() == 1
    assert not ExecutionCommand.objects.exists() and not Branch.objects.filter(archived=True).exists()
    assert owner_api.get(f"/api/executions/{running}").json()["status"] == "running"


@pytest.mark.slow
def test_rollback_forks_before_the_running_prompt_and_archives_the_old_branch(
    team, scripted_session, api_as, worker
):
    api, sid = scripted_session(team.member, {"user": [{"text": "done: {{prompt}}"}]})
    first = api.wait(started(api, sid, "setup"), timeout=20)
    assert first["status"] == "succeeded"
    running = unending_turn(api_as, team, api, sid, "the wrong question")

    r = post_turn(api, sid, "the right question", "rollback", agent_id="bot")
    assert r.status_code == 202, r.content
    new = r.json()
    old_branch = Branch.objects.get(pk=first["branch"])
    assert new["branch"] != old_branch.pk
    done = api.wait(new["execution_id"])
    assert done["status"] == "succeeded" and done["result"] == "done: the right question"
    assert api.wait(running)["status"] == "cancelled"

    old_branch.refresh_from_db()
    assert old_branch.archived and old_branch.archive_reason == "rolled back"
    fork = Branch.objects.get(pk=new["branch"])
    rolled = Job.objects.get(pk=running)
    assert fork.forked_from_id == rolled.prompt_msg.predecessor_id  # just before the running turn's prompt
    texts = [m.text for m in branch_history(fork.pk) if m.role in ("user", "assistant")]
    assert texts == ["setup", "done: setup", "the right question", "done: the right question"]
    # non-destructive: the old branch keeps its history, the rolled-back prompt included
    assert "the wrong question" in [m.text for m in branch_history(old_branch.pk)]
    assert Session.objects.get(pk=sid).head.branch_id == fork.pk  # the person's selection follows
    assert_legal_transitions(api, sid)


@pytest.mark.slow
def test_interrupt_racing_the_turns_completion_runs_the_new_input_exactly_once(team, scripted_session, worker):
    """Bounded race: the interrupt lands before, during or after the running turn's end.
    Whatever wins, the running turn ends once (succeeded or cancelled), the new input runs
    exactly once, and no job changes state illegally."""
    api, sid = scripted_session(team.member, {"user": [{"sleep_ms": 400}, {"text": "done: {{prompt}}"}]})
    rng = random.Random(16)
    for i in range(6):
        running = started(api, sid, f"turn {i}")
        api.wait(running, statuses={"running"} | TERMINAL, timeout=20)  # on a loaded machine it may be over already
        time.sleep(rng.uniform(0.05, 0.6))
        new = started(api, sid, f"instead {i}", "interrupt")
        done = api.wait(new)
        old = api.wait(running)
        assert done["status"] == "succeeded" and done["result"] == f"done: instead {i}", done
        assert old["status"] in ("succeeded", "cancelled"), old
        assert Message.objects.filter(job_id=new, role="user").count() == 1
        assert prompts_of(sid).count(f"instead {i}") == 1
    assert_legal_transitions(api, sid)
    branch = Job.objects.get(pk=new).branch_id
    assert not Job.objects.filter(session_id=sid).exclude(branch_id=branch).exists()
    prompts = [m.text for m in branch_history(branch) if m.role == "user"]
    assert [p for p in prompts if p.startswith("instead")] == [f"instead {i}" for i in range(6)]


@pytest.mark.slow
def test_two_interrupts_at_once_cancel_the_running_turn_once_and_lose_no_input(
    team, scripted_session, api_as, worker
):
    api, sid = scripted_session(team.member, {"user": [{"sleep_ms": 2000}, {"text": "done: {{prompt}}"}]})
    running = unending_turn(api_as, team, api, sid, "long")
    answers, barrier = {}, threading.Barrier(2)

    def send(prompt):
        try:
            barrier.wait(5)
            answers[prompt] = post_turn(api, sid, prompt, "interrupt", agent_id="bot")
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(p,)) for p in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {p: r.status_code for p, r in answers.items()} == {"x": 202, "y": 202}, {p: r.content for p, r in answers.items()}
    jobs = settle_session(api, sid, quiet=0.5)
    by_prompt = {j["id"]: j for j in jobs}
    assert by_prompt[running]["status"] == "cancelled"
    for prompt in ("x", "y"):
        job = by_prompt[answers[prompt].json()["execution_id"]]
        # each input either ran to its answer or was itself interrupted by the other; it is never dropped
        assert job["status"] in ("succeeded", "cancelled"), job
        assert prompts_of(sid).count(prompt) == 1
    assert sum(1 for p in ("x", "y") if by_prompt[answers[p].json()["execution_id"]]["status"] == "succeeded") >= 1
    assert_legal_transitions(api, sid)
    commands = ExecutionCommand.objects.filter(job__session_id=sid)
    assert commands.count() >= 1 and all(c.response_status == 202 for c in commands)


# --- interrupt with a model that asked for tools ----------------------------------------------------------------


def assert_anthropic_calls_answered(messages: list[dict]) -> None:
    """The Messages API form of the same rule: each assistant ``tool_use`` is answered by a
    ``tool_result`` block in the very next (user) message."""
    def blocks(m):
        return [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]

    for n, m in enumerate(messages):
        uses = [b["id"] for b in blocks(m) if b["type"] == "tool_use"] if m["role"] == "assistant" else []
        if not uses:
            continue
        nxt = messages[n + 1] if n + 1 < len(messages) else {"role": "none", "content": []}
        answered = [b["tool_use_id"] for b in blocks(nxt) if b["type"] == "tool_result"]
        assert nxt["role"] == "user" and sorted(answered) == sorted(uses), (uses, nxt)


def well_formed(wire, request) -> None:
    if wire is OpenAIDialect:
        assert_every_call_answered(wire.messages(request))
    else:
        assert_anthropic_calls_answered(wire.messages(request))


@pytest.mark.slow
def test_interrupt_after_tool_calls_sends_the_model_a_well_formed_history(team, api_as, fake, dialect, worker):  # noqa: F811
    """The model asks for two tools; the first (a foreground sub-agent) is still working when the
    person interrupts, the second never runs. The turn ends cancelled; both calls have results
    ("cancelled"), and the next turn's request — OpenAI Chat Completions and Anthropic Messages
    alike — carries each call with its result."""
    connection_name = f"fake-double-text-{dialect.name}"
    operator_connection(connection_name, dialect.name, dialect.base_url(fake), "")
    owner = api_as(team.owner)
    r = owner.post("/api/projects/alpha/agent-specs", {
        "agent_id": "llm", "provider": dialect.name, "model": "fake-model", "connection": connection_name,
        "limits": {"stream": False}})
    assert r.status_code == 201, r.content
    r = owner.post("/api/projects/alpha/agent-specs", {"agent_id": "slowkid", "provider": "scripted", "script": SLOW})
    assert r.status_code == 201, r.content

    def respond(request):
        if dialect.system(request) == TITLE_SYSTEM:
            return dialect.text("A Title")
        texts = dialect.user_texts(request)
        if texts and texts[-1] == "second thoughts":
            return dialect.text("fresh answer")
        if dialect.ends_with_tool_result(request):
            return dialect.text("tools done")
        return dialect.tools([
            ("call_kid", "agent", {"prompt": "work slowly", "agent_id": "slowkid", "description": "kid"}),
            ("call_list", "todo_list", {}),
        ])

    fake.responder = respond
    api = api_as(team.member)
    sid = api.post("/api/projects/alpha/sessions", {"title": "t", "agent_id": "llm"}).json()["id"]
    first = started(api, sid, "do things with tools")
    poll(lambda: Job.objects.filter(parent_job_id=first, status="running").exists(), what="the sub-agent to run")

    second = started(api, sid, "second thoughts", "interrupt")
    done = api.wait(second, timeout=30)
    assert done["status"] == "succeeded" and done["result"] == "fresh answer", done
    assert api.wait(first)["status"] == "cancelled"
    assert Job.objects.get(parent_job_id=first).status == "cancelled"

    results = {m.tool_call_id: m for m in Message.objects.filter(job_id=first, role="tool")}
    assert set(results) == {"call_kid", "call_list"}
    assert "cancelled" in results["call_list"].text and results["call_list"].metadata["is_error"]
    assert "cancelled" in results["call_kid"].text

    models = [q for q in fake.requests if dialect.system(q) != TITLE_SYSTEM]
    after = [q for q in models if (dialect.user_texts(q) or [""])[-1] == "second thoughts"]
    assert len(after) == 1
    well_formed(dialect, after[0])
    flat = dialect.flat(after[0])
    assert flat[0] == ("user", "do things with tools")
    assert flat[1:5] == [("call", "agent"), ("call", "todo_list"), ("result", "call_kid"), ("result", "call_list")]
    assert flat[-1] == ("user", "second thoughts")
    sent = dialect.results(after[0])
    assert "cancelled" in str(sent["call_list"]) and MISSING_RESULT not in str(sent)
    for q in models:  # no request ever held a call without its result
        well_formed(dialect, q)
