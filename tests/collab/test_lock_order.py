"""Locks without stale reads (SPEC §7; STYLE §12; OP C1, OP §5.3, §5.4; issue 12 item 3).

Every row read under a lock is read after the lock is held, in one order (session → branch →
job, collab/services/locking.py), and a transaction that can still deadlock runs again whole.
Seen from outside: fifty people and agents forking, posting turns, delegating forks whose
results come back as follow-ups, and cancelling — all at once on one branch — never get a 500,
and every branch stays one chain (no two of its nodes share a predecessor).

Real worker processes run the turns; the requests are the Django test client's, in threads,
each with its own database connection (``transactional_db``).
"""

import random
import threading
import time
import uuid
from collections import Counter

import pytest
from django.db import connection
from django.test import Client

from tests.conftest import ApiClient, make_spec, settle

pytestmark = pytest.mark.slow

WAIT = 90.0
REQUESTS = 50


def test_op_c1_fifty_concurrent_forks_turns_deliveries_and_cancels_keep_one_chain_per_branch(team, api_as, worker):
    """Issue 12 item 3 / OP C1: 50 concurrent requests on one branch — person forks (the page),
    turns on the branch (the API), agent forks through the tool gateway whose results return to
    the branch as follow-up turns, cancels of whatever runs — never answer 500, and afterwards
    every branch of the session is exactly one chain."""
    from collab.models import Branch, Message

    owner = api_as(team.owner)
    r = owner.patch("/api/projects/alpha/limits", {"max_spawn_fanout": 0, "max_messages": 0, "max_spawn_depth": 0})
    assert r.status_code == 200, r.content
    make_spec(owner, "hub", {
        "user": [{"text": "heard"}],
        "spawn": [{"text": "side work done"}],
        "followup": [{"text": "noted"}],
    })
    api = api_as(team.member)
    r = api.post("/api/projects/alpha/sessions", {"title": "busy", "agent_id": "hub"})
    assert r.status_code == 201, r.content
    sid = r.json()["id"]
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "start"})
    assert r.status_code == 202, r.content
    first = api.wait(r.json()["execution_id"], timeout=WAIT)
    assert first["status"] == "succeeded"
    fork_at = first["prompt_msg"]
    main = f"{sid}:{fork_at}"  # the main branch (a stale head still names it)

    rng = random.Random(20261201)
    barrier = threading.Barrier(REQUESTS)
    answers: list[tuple[str, int]] = []
    lock = threading.Lock()

    def act(n: int, delay: float) -> None:
        client = ApiClient(Client(raise_request_exception=False), None)
        client.headers = dict(api.headers)
        kind = ("fork", "turn", "turn", "agent_fork", "cancel")[n % 5]
        try:
            barrier.wait(timeout=WAIT)
            time.sleep(delay)
            if kind == "fork":
                page = Client(raise_request_exception=False)
                page.force_login(team.member)
                r = page.post(f"/s/{sid}/m/{fork_at}/fork", {"prompt": f"person fork {n}"})
            elif kind == "turn":
                r = client.post(f"/api/sessions/{sid}/turns", {"prompt": f"turn {n}", "branch": main})
            elif kind == "agent_fork":
                r = client.post(f"/api/branches/{main}/tools/agent", {"arguments": {
                    "prompt": f"agent fork {n}", "start_from": f"{sid}:{fork_at}", "run_in_background": True}})
            else:
                open_ = [j for j in client.get("/api/executions", session=sid, limit=500).json()
                         if j["status"] in ("queued", "running")]
                if not open_:
                    r = None
                else:
                    job = rng.choice(open_)
                    r = client.post(f"/api/executions/{job['id']}/commands", {
                        "command_id": f"cmd-{uuid.uuid4().hex}", "action": "execution.cancel",
                        "expected_version": job["version"], "payload": {}})
            with lock:
                answers.append((kind, r.status_code if r is not None else 0))
        except Exception as exc:  # an exception escaping the view is a 500 too
            with lock:
                answers.append((kind, 500))
            raise exc
        finally:
            connection.close()

    threads = [threading.Thread(target=act, args=(n, rng.uniform(0, 0.3))) for n in range(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads)

    assert len(answers) == REQUESTS
    assert [a for a in answers if a[1] >= 500] == [], answers
    expected = {"fork": {302}, "turn": {202}, "agent_fork": {200}, "cancel": {0, 202, 409}}
    assert [a for a in answers if a[1] not in expected[a[0]]] == [], answers

    jobs = settle(api, sid, timeout=WAIT)
    assert any(j["kind"] == "followup" for j in jobs), "no delivery raced the turns"
    nodes = list(Message.objects.filter(session_id=sid).exclude(kind="attach").values_list("branch_id", "predecessor_id"))
    shared = [k for k, n in Counter(nodes).items() if n > 1]
    assert shared == [], f"{len(shared)} predecessors with two nodes of one branch"
    branches = Branch.objects.filter(session_id=sid)
    assert branches.count() >= 1 + REQUESTS // 5 * 2  # main + the person forks + the agent forks
    for branch in branches:  # each branch's tip is the end of its one chain
        on_branch = Message.objects.filter(branch=branch).exclude(kind="attach")
        if on_branch.exists():
            assert not on_branch.filter(predecessor_id=branch.tip_id).exists(), branch.pk


@pytest.mark.django_db(transaction=True)
def test_op_5_3_a_stopping_job_ends_only_cancelled_and_the_database_agrees(team, api_as):
    """SPEC §7 / issue 12 item 3: ``stopping`` → ``succeeded``/``failed``/``interrupted`` is refused
    by the database guard (migration 0012), ``stopping`` → ``cancelled`` is accepted; and
    ``finish_job`` asked to end a stopping job as succeeded ends it cancelled, without its answer."""
    from django.db import DatabaseError, transaction
    from django.utils import timezone

    from collab.models import Branch, Job, Message, Session
    from collab.services.execution import finish_job
    from collab.services.turns import selected_branch

    owner = api_as(team.owner)
    make_spec(owner, "quick", [{"text": "done"}])
    api = api_as(team.member)
    now = timezone.now()
    ids = []
    for n in range(2):  # rows made here, never handed to a worker: moved by hand to "stopping"
        sid = api.post("/api/projects/alpha/sessions", {"title": f"guard {n}", "agent_id": "quick"}).json()["id"]
        branch = selected_branch(Session.objects.get(pk=sid))
        job = Job.objects.create(project_id=team.alpha.pk, session_id=sid, branch=branch, kind="user",
                                 status="queued", prompt=f"p{n}", started_by=team.member)
        Job.objects.filter(pk=job.pk).update(status="running", started_at=now)
        Job.objects.filter(pk=job.pk).update(status="stopping", cancel_requested_at=now)
        ids.append(job.pk)
    assert Branch.objects.filter(jobs__pk__in=ids).count() == 2

    for illegal in ("succeeded", "failed", "interrupted"):
        with pytest.raises(DatabaseError), transaction.atomic():
            Job.objects.filter(pk=ids[0]).update(status=illegal, finished_at=now)
    assert Job.objects.get(pk=ids[0]).status == "stopping"

    ended = finish_job(Job.objects.get(pk=ids[0]), status="succeeded", final_text="a late answer", result_text="a late answer")
    assert (ended.status, ended.error_code, ended.is_error) == ("cancelled", "cancelled", True)
    assert not Message.objects.filter(job_id=ids[0], text="a late answer").exists()
    Job.objects.filter(pk=ids[1]).update(status="cancelled", finished_at=now)
    assert Job.objects.get(pk=ids[1]).status == "cancelled"
