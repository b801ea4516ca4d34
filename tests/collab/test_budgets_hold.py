"""Budgets hold (docs/contract.md#topology-budgets).

Through the tool gateway and real worker processes: a failure notice continues its sender's
chain counters, so a retry loop runs out of messages; the fan-out count is taken inside the
admission transaction under the caller's lock, so concurrent spawns never overshoot it.
"""

import threading

import pytest
from django.db import connection

from tests.conftest import (
    TERMINAL,
    WAIT,
    address_of,
    executions,
    make_spec,
    open_session,
    poll,
    set_limits,
    settle,
    tool,
    turn,
    undelivered_results,
)

pytestmark = pytest.mark.slow


def test_a_failure_notice_continues_the_senders_chain_so_a_retry_loop_stops(team, api_as, worker):
    """An agent that answers every rejection by sending again spends its chain's
    messages (max_messages=4): the send (1), the rejection's notice (2 on the sender), the retry
    (3), its notice (4) — then delegation is closed and the loop ends after two holds."""
    from collab.models import Job

    owner = api_as(team.owner)
    set_limits(owner, max_messages=4)
    make_spec(owner, "quiet", [{"text": "quiet"}])
    api = api_as(team.member)
    tsid = open_session(api, "quiet", title="target")
    target = address_of(api.wait(turn(api, tsid, "hello")))
    send = {"name": "send_message", "arguments": {"to": target, "message": "ping"}}
    make_spec(owner, "pest", {"user": [{"tool_calls": [send]}, {"text": "sent"}],
                              "followup": [{"tool_calls": [send]}, {"text": "retried"}]})
    sid = open_session(api, "pest", title="sender")
    assert owner.patch("/api/projects/alpha", {"watch_policy": "confirm_deliveries"}).status_code == 200

    root = turn(api, sid, "start pestering")
    rejected = []
    for _ in range(8):  # without the chain a rejection loop never ends; 8 is far past the budget
        def pending():
            # a state, never a moment: every job of both sessions has ended (the turn that sent
            # is over, so a rejection's notice comes back as a follow-up turn, never into the
            # sending turn's own mailbox), and then either a hold waits for a decision or no
            # result is owed back to the sender (the rejected delivery's notice lives in the
            # target's session, owed to the sender's branch until its follow-up is admitted)
            if [j for j in executions(api, sid) + executions(api, tsid) if j["status"] not in TERMINAL]:
                return None
            holds = [h for h in api.get(f"/api/sessions/{sid}/holds").json() if h["status"] == "pending"]
            return holds or (not undelivered_results([sid, tsid]) and "idle")

        got = poll(pending, timeout=WAIT, what="a pending hold or a quiet session")
        if got == "idle":
            break
        for hold in got:
            assert api.post(f"/api/holds/{hold['id']}/reject").json()["status"] == "rejected"
            rejected.append(hold["id"])
    jobs = settle(api, sid, tsid)
    assert len(rejected) == 2, rejected
    notices = [j for j in jobs if j["error_code"] == "delivery_rejected"]
    followups = sorted((j for j in jobs if j["kind"] == "followup"), key=lambda j: j["created_at"])
    assert len(notices) == 2 and len(followups) == 2, jobs
    counters = {j.pk: j.chain_messages for j in Job.objects.filter(session_id__in=(sid, tsid))}
    assert counters[root] == 0
    assert sorted(counters[n["id"]] for n in notices) == [1, 3]
    assert [counters[f["id"]] for f in followups] == [2, 4]


def _spawn(api, main, name):
    return tool(api, main, "agent", prompt=f"leaf {name}", agent_id="leaf", description=name, run_in_background=True)


def test_two_concurrent_spawns_at_fanout_7_of_8_admit_exactly_one(team, api_as, worker):
    """The fan-out of one calling turn is counted in the admission transaction under
    the caller's lock: two spawns racing for the last of 8 slots admit exactly one, every time."""
    from collab.models import Job

    owner = api_as(team.owner)
    set_limits(owner, max_spawn_fanout=8)
    make_spec(owner, "leaf", [{"text": "leaf done"}])
    make_spec(owner, "caller", [{"text": "ok"}], followup_mode="mailbox")  # results wait: no turns in between
    api = api_as(team.member)
    sid = open_session(api, "caller")
    racers = [api_as(team.member) for _ in range(2)]

    for iteration in range(6):
        main = address_of(api.wait(turn(api, sid, f"round {iteration}")))  # a new calling turn: 8 fresh slots
        for n in range(7):
            assert not _spawn(api, main, f"r{iteration}n{n}")["is_error"]
        barrier = threading.Barrier(2)
        answers = [None, None]

        def race(i):
            try:
                barrier.wait(10)
                answers[i] = _spawn(racers[i], main, f"r{iteration}race{i}")
            finally:
                connection.close()

        threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert sorted(a["is_error"] for a in answers) == [False, True], (iteration, answers)
        assert [a["details"].get("code") for a in answers if a["is_error"]] == ["budget.fanout_exhausted"]
        assert sum(j.prompt_text.startswith(f"leaf r{iteration}") for j in
                   Job.objects.filter(kind="spawn", session_id=sid).select_related("prompt_msg")) == 8
        settle(api, sid)
