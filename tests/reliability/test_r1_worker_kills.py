"""R1 (docs/contract.md#crash-recovery): SIGKILL the workers at random moments across
many background jobs → 0 lost, 0 doubled results, every job terminal, every caller's transcript
well-formed.

Callers ("boss" turns, one per session) each spawn ``KIDS`` background children in one model
step; every child's result comes back to its caller exactly once (a follow-up turn, or a node
drained into the caller's running turn). Meanwhile, at random moments, the worker process running
one of these jobs is SIGKILLed — mid-turn, mid-spawn, mid-completion, whatever it was doing —
and every third kill takes its whole machine (the qcluster process group), which is replaced by a
new one. Nobody helps from outside: the surviving workers' reconcilers end the dead jobs
``interrupted`` after their lease, hand lost queued jobs off again and settle owed results.

Then, from the rows and through the API: every job is terminal; each child's result is in its
caller's transcript exactly once (0 lost, 0 doubled); no job ran twice (one prompt node, at most
one final answer); every tool call has exactly one result and every branch is one chain.
"""

import os
import random
import signal
import time
from collections import Counter

import pytest
from django.db.models import Q

from tests.collab.test_cancel_fence import assert_well_formed
from tests.conftest import TERMINAL, agent_call, make_spec, open_session, settle_session, step, turn
from tests.reliability.conftest import WAIT, size

pytestmark = pytest.mark.slow

SESSIONS = size(4, 20)
KIDS = size(6, 10)  # children per caller: CI 24, full 200
KILLS = size(5, 20)
SEED = int(os.environ.get("TRELLIS_RELIABILITY_SEED", "20261201"))


@pytest.mark.timeout(600 + 30 * KILLS)  # a hang guard, not a latency bound
def test_sigkilled_workers_lose_and_double_nothing(team, api_as, machines, figure):
    from collab.models import Job, Message
    from collab.services.admission import PROMPT_KIND

    owner = api_as(team.owner)
    r = owner.patch("/api/projects/alpha/limits", {"max_spawn_fanout": 0, "max_messages": 0, "max_spawn_depth": 0})
    assert r.status_code == 200, r.content
    make_spec(owner, "kid", [{"sleep_ms": 800}, {"text": "result of {{prompt}}"}])
    make_spec(owner, "boss", {
        "user": [step(*[agent_call(f"part {i}", "kid", description=f"kid {i}") for i in range(KIDS)]),
                 {"text": "dispatched"}],
        "followup": [{"text": "heard"}],
    })
    machines.start()
    machines.start()
    api = api_as(team.member)
    sids = [open_session(api, "boss", title=f"r1 {n}") for n in range(SESSIONS)]
    for n, sid in enumerate(sids):
        turn(api, sid, f"fan out {n}")

    rng = random.Random(SEED)
    kills = machine_kills = 0
    next_kill = time.monotonic() + rng.uniform(0.2, 1.0)
    deadline = time.monotonic() + WAIT
    while kills < KILLS and time.monotonic() < deadline:
        time.sleep(0.05)
        if time.monotonic() < next_kill:
            continue
        if not kills and Job.objects.filter(session_id__in=sids, kind="spawn").count() < SESSIONS * KIDS // 2:
            continue  # the first kill waits for half the children: the run keeps its volume
        running = list(Job.objects.filter(session_id__in=sids, status="running").exclude(worker="")
                       .values_list("worker", flat=True))
        victims = [(int(w.rpartition(":")[2]), m) for w in running
                   if (m := machines.owner_of(int(w.rpartition(":")[2]))) is not None]
        if not victims:
            if not Job.objects.filter(session_id__in=sids).exclude(status__in=TERMINAL).exists():
                break  # the work ended before every kill landed; what was killed is checked below
            continue
        pid, machine = rng.choice(victims)
        if kills % 3 == 2:  # the whole machine dies; a new one takes its place
            machines.kill(machine)
            machines.start()
            machine_kills += 1
        else:  # one worker process dies mid-turn; its machine's sentinel starts another
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        kills += 1
        next_kill = time.monotonic() + rng.uniform(0.2, 1.0)
    assert kills, "no job was ever running on a machine of this test"

    jobs = settle_session(api, *sids, timeout=WAIT, quiet=0.5)
    statuses = Counter(j["status"] for j in jobs)
    assert set(statuses) <= TERMINAL, statuses

    kids = [j for j in jobs if j["kind"] == "spawn"]
    assert kids, "no child was admitted"
    lost, doubled = [], []
    for kid in kids:
        copies = Message.objects.filter(session_id=kid["caller_session"] or kid["session"]).filter(
            Q(metadata__followup_of=kid["id"]) | Q(metadata__result_of=kid["id"])).count()
        (lost if copies == 0 else doubled if copies > 1 else []).append((kid["id"], kid["status"], copies))
    reran = []
    for job in Job.objects.filter(session_id__in=sids):
        prompts = Message.objects.filter(job_id=job.pk, role="user", kind=PROMPT_KIND[job.kind]).count()  # its prompt nodes
        finals = Message.objects.filter(job_id=job.pk, metadata__final=True).count()
        if prompts > 1 or finals > 1 or (job.status == "succeeded" and finals != 1):
            reran.append((job.pk, job.kind, job.status, prompts, finals))
    figure(f"R1: {len(kids)} background jobs ({len(jobs)} in all), {kills} kills ({machine_kills} whole machines), "
           f"{statuses.get('interrupted', 0)} interrupted, {len(lost)} lost, {len(doubled)} doubled, "
           f"{len(reran)} run twice")
    assert lost == [] and doubled == [], (lost, doubled, machines.log_tail())
    assert reran == [], reran
    assert not Job.objects.filter(session_id__in=sids, followup_state="owed").exists()
    for sid in sids:
        assert_well_formed(sid)
