"""R7 (docs/contract.md#admission-budgets-and-quotas): concurrent clients forking
one session at one node and posting → 0 cycles, 0 orphans, 0 shared tips; answers 202/409/429
(and the page's 302), never a 500.

``CLIENTS`` threads (50 in CI) start at once on one session. Each is a person or an agent: a
person forks at THE node from the page and posts a turn on the main branch; others post turns on
the main branch (``enqueue``, or ``reject`` while it is busy); an agent forks at THE node through
the tool gateway (``agent(start_from=…)``, its result coming back to the main branch as a
follow-up) and posts a turn on its fork with ``reject``; others cancel whatever runs. The
session admits at most ``QUEUED`` waiting jobs, so some are refused 429.

Then, once the real workers are at rest, the session's DAG: following predecessors from any node
reaches the root (no cycle); every branch's first node hangs off the node it forked from, its
tip is on it and ends its one chain, every job's prompt is on its branch (no orphan); no two
branches share a tip.

Moved here from tests/collab/test_lock_order.py and extended.
"""

import random
import threading
import time
import uuid
from collections import Counter

import pytest
from django.db import connection
from django.test import Client

from tests.conftest import ApiClient, settle_session
from tests.reliability.conftest import size

pytestmark = pytest.mark.slow

WAIT = 120.0
CLIENTS = size(50, 200)
QUEUED = CLIENTS // 2  # max_queued_per_session: enough to admit most, few enough that some get 429
SEED = 20261201


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_spec(api, agent_id, script):
    r = api.post("/api/projects/alpha/agent-specs", {"agent_id": agent_id, "provider": "scripted", "script": script})
    assert r.status_code == 201, r.content


def dag_faults(sid) -> dict[str, list]:
    """The session's DAG checked whole: cycles, orphans, shared tips, branches forked inside themselves."""
    from collab.models import Branch, Job, Message

    nodes = {m["id"]: m for m in Message.objects.filter(session_id=sid).values(
        "id", "predecessor_id", "branch_id", "depth", "kind")}
    cycles, orphans = [], []
    for start in nodes:
        seen, node = set(), start
        while node is not None:
            if node in seen:
                cycles.append(start)
                break
            seen.add(node)
            pred = nodes[node]["predecessor_id"]
            if pred is not None and pred not in nodes:
                orphans.append(("predecessor outside the session", node))
                break
            if pred is not None and nodes[pred]["depth"] != nodes[node]["depth"] - 1:
                orphans.append(("depth does not follow the predecessor", node))
            node = pred
    roots = [m for m in nodes.values() if m["predecessor_id"] is None]
    if len(roots) != 1:
        orphans.append(("roots", [m["id"] for m in roots]))
    chain = [m for m in nodes.values() if m["kind"] != "attach"]
    for branch in Branch.objects.filter(session_id=sid):
        own = [m for m in chain if m["branch_id"] == branch.pk]
        if not own:
            continue
        first = min(own, key=lambda m: m["depth"])
        if first["predecessor_id"] != branch.forked_from_id:
            orphans.append(("first node does not hang off the fork point", branch.pk))
        if branch.tip_id not in {m["id"] for m in own}:
            orphans.append(("tip not on the branch", branch.pk))
        elif any(m["predecessor_id"] == branch.tip_id for m in own):
            orphans.append(("tip is not the end of the chain", branch.pk))
    for job in Job.objects.filter(session_id=sid).exclude(prompt_msg=None).select_related("prompt_msg"):
        if job.prompt_msg.branch_id != job.branch_id:
            orphans.append(("prompt off its branch", job.pk))
    tips = Counter(Branch.objects.filter(session_id=sid).exclude(tip=None).values_list("tip_id", flat=True))
    inside = Counter((m["branch_id"], m["predecessor_id"]) for m in chain)
    return {"cycles": cycles, "orphans": orphans, "shared_tips": [t for t, n in tips.items() if n > 1],
            "forked_inside": [k for k, n in inside.items() if n > 1]}


@pytest.mark.timeout(300 + CLIENTS)
def test_concurrent_forks_turns_deliveries_and_cancels_at_one_node_keep_the_dag_whole(
    team, api_as, worker, figure
):
    from collab.models import Branch

    owner = api_as(team.owner)
    r = owner.patch("/api/projects/alpha/limits", {"max_spawn_fanout": 0, "max_messages": 0, "max_spawn_depth": 0,
                                                   "max_queued_per_session": QUEUED})
    assert r.status_code == 200, r.content
    make_spec(owner, "hub", {
        "user": [{"sleep_ms": 200}, {"text": "heard"}],
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
    fork_at = first["prompt_msg"]  # THE node every fork starts from
    main = f"{sid}:{fork_at}"  # the main branch (a stale head still names it)

    rng = random.Random(SEED)
    barrier = threading.Barrier(CLIENTS)
    answers: list[tuple[str, int]] = []
    lock = threading.Lock()

    def act(n: int, delay: float) -> None:
        client = ApiClient(Client(raise_request_exception=False), None)
        client.headers = dict(api.headers)
        kind = ("fork", "turn", "reject", "agent_fork", "cancel")[n % 5]

        def answered(what, r):
            with lock:
                answers.append((what, r.status_code if r is not None else 0))

        try:
            barrier.wait(timeout=WAIT)
            time.sleep(delay)
            if kind == "fork":
                page = Client(raise_request_exception=False)
                page.force_login(team.member)
                answered("fork", page.post(f"/s/{sid}/m/{fork_at}/fork", {"prompt": f"person fork {n}"}))
                kind = "turn"  # and then posts, as the person's next request
            if kind in ("turn", "reject"):
                strategy = "reject" if kind == "reject" else "enqueue"
                answered(kind, client.post(f"/api/sessions/{sid}/turns", {
                    "prompt": f"turn {n}", "branch": main, "multitask_strategy": strategy}))
            elif kind == "agent_fork":
                r = client.post(f"/api/branches/{main}/tools/agent", {"arguments": {
                    "prompt": f"agent fork {n}", "start_from": f"{sid}:{fork_at}", "run_in_background": True}})
                answered("agent_fork", r)
                body = r.json() if r.status_code == 200 else {}
                if body and not body["is_error"]:
                    answered("fork_turn", client.post(f"/api/sessions/{sid}/turns", {
                        "prompt": f"on my fork {n}", "branch": body["details"]["address"],
                        "multitask_strategy": "reject"}))
                elif body:
                    answered(f"agent_fork:{body['details'].get('code')}", r)
            elif kind == "cancel":
                open_ = [j for j in client.get("/api/executions", session=sid, limit=500).json()
                         if j["status"] in ("queued", "running")]
                if not open_:
                    answered("cancel", None)
                else:
                    job = rng.choice(open_)
                    answered("cancel", client.post(f"/api/executions/{job['id']}/commands", {
                        "command_id": f"cmd-{uuid.uuid4().hex}", "action": "execution.cancel",
                        "expected_version": job["version"], "payload": {}}))
        except Exception:  # an exception escaping a view is a 500 too
            with lock:
                answers.append((kind, 500))
            raise
        finally:
            connection.close()

    threads = [threading.Thread(target=act, args=(n, rng.uniform(0, 0.3))) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads)

    codes = Counter(code for _, code in answers)
    assert [a for a in answers if a[1] >= 500] == [], answers
    expected = {"fork": {302, 400}, "turn": {202, 429}, "reject": {202, 409, 429}, "agent_fork": {200},
                "fork_turn": {202, 409, 429}, "cancel": {0, 202, 409}}
    unexpected = [a for a in answers if a[1] not in expected.get(a[0], {200})]
    assert unexpected == [], answers
    refused = [a for a in answers if a[0].startswith("agent_fork:")]
    assert {a[0] for a in refused} <= {"agent_fork:quota.queue_full"}, refused

    jobs = settle_session(api, sid, timeout=WAIT)
    faults = dag_faults(sid)
    branches = Branch.objects.filter(session_id=sid).count()
    figure(f"R7: {CLIENTS} concurrent clients at one node, {len(answers)} answers {dict(sorted(codes.items()))}, "
           f"{branches} branches, {len(jobs)} jobs, {len(faults['cycles'])} cycles, {len(faults['orphans'])} orphans, "
           f"{len(faults['shared_tips'])} shared tips, 0 answers 5xx")
    assert faults == {"cycles": [], "orphans": [], "shared_tips": [], "forked_inside": []}, faults
    assert any(j["kind"] == "followup" for j in jobs), "no delivery raced the turns"
    forks = sum(1 for what, code in answers if (what, code) in (("fork", 302), ("fork_turn", 202), ("fork_turn", 409),
                                                                 ("fork_turn", 429)))
    assert branches >= 1 + forks  # main + every fork that was admitted
