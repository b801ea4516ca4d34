"""R8 (docs/contract.md#people-in-the-loop): turns waiting for people survive their workers'
death, and two people deciding at once decide each item once.

Each session's turn makes a call its spec's ``approvals`` name (plus, in half of them, an
``ask_person`` before it), on real worker machines. While every turn waits, the machine that ran
them is SIGKILLed and replaced; then two people decide every item at the same moment (threads,
one request each). Afterwards, through the API and the rows: each item was decided exactly once
(one 200 and one 409 per item), every turn resumed once and succeeded, the approved call ran
exactly once (one todo per session), and every transcript is well-formed.
"""

import threading

import pytest

from tests.collab.test_cancel_fence import assert_well_formed
from tests.conftest import make_spec, open_session, poll, turn
from tests.reliability.conftest import WAIT, size

pytestmark = pytest.mark.slow

SESSIONS = size(6, 40)


def _decide_together(clients, item) -> list[int]:
    """Both people send their decision at once; the statuses they got."""
    body = ({"decision": "answer", "answer": "yes"} if item["kind"] == "question"
            else {"decision": "approve"})
    start, statuses = threading.Barrier(len(clients)), []

    def send(api):
        from django.db import connections

        start.wait()
        try:
            statuses.append(api.post(f"/api/inbox/{item['id']}", body).status_code)
        finally:  # the test client keeps a thread's connection: give it back to the pool
            connections.close_all()

    threads = [threading.Thread(target=send, args=(api,)) for api in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return sorted(statuses)


@pytest.mark.timeout(600)  # a hang guard, not a latency bound
def test_waiting_turns_survive_killed_workers_and_each_decision_counts_once(team, api_as, machines, figure):
    from collab.models import Job, PersonAsk, Todo

    owner = api_as(team.owner)
    approve_step = {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "approved work"}}]}
    ask_step = {"tool_calls": [{"name": "ask_person", "arguments": {"question": "go on?", "choices": ["yes", "no"]}}]}
    make_spec(owner, "careful", [approve_step, {"text": "done: {{last.text}}"}], approvals=["todo_create"])
    make_spec(owner, "asking", [ask_step, approve_step, {"text": "done: {{last.text}}"}], approvals=["todo_create"])
    machine = machines.start()
    api = api_as(team.member)
    sids = [open_session(api, "asking" if n % 2 else "careful", title=f"r8 {n}") for n in range(SESSIONS)]
    jobs = [turn(api, sid, f"work {n}") for n, sid in enumerate(sids)]

    def all_waiting():
        return all(api.get(f"/api/executions/{j}").json()["status"] == "waiting" for j in jobs) or None

    poll(all_waiting, timeout=WAIT)
    machines.kill(machine)  # nothing is lost with it: no job holds a worker while it waits
    machines.start()

    people = [api_as(team.member), api_as(team.maintainer)]
    decided, rounds = 0, 0
    while rounds < 3 * SESSIONS:
        rounds += 1
        items = people[0].get("/api/inbox").json()["items"]
        if not items:
            if all(api.get(f"/api/executions/{j}").json()["status"] == "succeeded" for j in jobs):
                break
            poll(lambda: people[0].get("/api/inbox").json()["items"] or all(
                api.get(f"/api/executions/{j}").json()["status"] == "succeeded" for j in jobs) or None, timeout=WAIT)
            continue
        for item in items:
            assert _decide_together(people, item) == [200, 409], item
            decided += 1

    for j in jobs:
        assert api.get(f"/api/executions/{j}").json()["status"] == "succeeded", api.get(f"/api/executions/{j}").json()
    assert decided == SESSIONS + SESSIONS // 2
    assert PersonAsk.objects.filter(status="pending").count() == 0
    assert PersonAsk.objects.exclude(status__in=["approved", "answered"]).count() == 0
    for sid in sids:
        assert Todo.objects.filter(session_id=sid).count() == 1  # the approved call ran once
        assert_well_formed(sid)
    assert Job.objects.filter(pk__in=jobs, status="succeeded").count() == SESSIONS
    figure(f"R8: {SESSIONS} waiting turns, their machine SIGKILLed while they waited, {decided} items each decided "
           f"by two people at once: {decided} decided once (200 + 409), 0 lost, 0 run twice")
