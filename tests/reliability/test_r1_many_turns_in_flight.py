"""R1 with many turns in one process: SIGKILL a worker process while it holds ``TURNS`` turns in
its slots → each of them is recovered exactly once, none runs twice, nothing is lost, and the
turns waiting behind them run on a new worker process.

One worker machine with a single worker process (``TRELLIS_WORKERS=1``), the reliability suite's
short lease (3 s) and reconcile interval (1 s), and a project cap above ``TURNS``. ``TURNS``
sessions each start a long turn (a scripted ``sleep_ms`` far longer than the test: only the
kill ends it), all claimed by that one process and running side by side in its slots. Then,
while the process waits for its next task (its tasks return as soon as their turns are in its
slots), it dies by SIGKILL (its heartbeat, stop watch and every turn thread with it), in one of
two ways:

- ``machine``: its whole machine (the qcluster process group) dies, and a new machine is started;
- ``worker process``: only the worker process dies; its machine lives on and its sentinel starts
  a new worker process in its place.

Behind each dead turn, on its branch, a quick turn is then admitted (``queued``: the dead turn
still looks running until its lease runs out). Nobody helps from outside: the new worker process
reconciles like any live one. Then, from the rows and through the API: every long turn ended
``interrupted`` after its lease, once — one terminal event, its only node its prompt (never
re-run, never answered); every quick turn behind it ran once, on the new worker process, and
succeeded; every job is terminal and every branch is one well-formed chain.
"""

import os
import signal
import time
from collections import Counter

import pytest

from tests.collab.test_cancel_fence import assert_well_formed
from tests.conftest import TERMINAL, events, make_spec, open_session, poll, turn
from tests.reliability.conftest import LEASE, RECONCILE, WAIT, size

pytestmark = pytest.mark.slow

TURNS = size(24, 32)
NAP_MS = 600_000  # a long turn never ends by itself: only the kill ends it
AFTER_RECOVERY = 60.0  # for the turns queued behind to run once the dead ones are recovered (seconds in practice)


def pid_of(worker: str) -> int:
    return int(worker.rpartition(":")[2])


@pytest.mark.timeout(300)  # a hang guard, not a latency bound (about 20 s each in CI)
@pytest.mark.parametrize("dies", ["machine", "worker process"])
def test_a_killed_worker_process_holding_many_turns_has_each_recovered_once(team, api_as, machines, figure, dies):
    from collab.models import Job, Message
    from collab.services.admission import PROMPT_KIND

    # the suite's machines cap a project at 16 running jobs; this test needs all its turns in flight
    machines.env = dict(machines.env, TRELLIS_MAX_RUNNING_PER_PROJECT=str(2 * TURNS))
    owner = api_as(team.owner)
    make_spec(owner, "long", [{"sleep_ms": NAP_MS}, {"text": "never"}])
    make_spec(owner, "quick", [{"text": "after the crash: {{prompt}}"}])
    machine = machines.start(workers=1)
    api = api_as(team.member)
    sids = [open_session(api, "long", title=f"r1 many {n}") for n in range(TURNS)]
    longs = [turn(api, sid, f"long {n}") for n, sid in enumerate(sids)]

    def all_running():
        rows = list(Job.objects.filter(pk__in=longs).values_list("status", "worker"))
        return rows if all(status == "running" for status, _ in rows) else None

    rows = poll(all_running, timeout=WAIT, interval=0.1, what=f"all {TURNS} long turns running")
    workers = {worker for _, worker in rows}
    assert len(workers) == 1, f"{TURNS} turns ran in {len(workers)} processes: {workers}"
    doomed = workers.pop()
    pid = pid_of(doomed)
    assert pid != machine.pid and os.getpgid(pid) == machine.pid  # the machine's one worker process

    # Its tasks returned as soon as their turns were in its slots: the process now waits for its
    # next task (django-q2's worker loop), as a worker holding turns does nearly all the time.
    time.sleep(1.0)
    if dies == "machine":
        machines.kill(machine)
    else:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    # still in flight at the kill: none of the long turns had ended
    assert Job.objects.filter(pk__in=longs, status="running").count() == TURNS

    # the dead turns still look running (their lease has not run out): these wait behind them
    behind = [turn(api, sid, f"quick {n}", agent_id="quick") for n, sid in enumerate(sids)]
    assert {j.status for j in Job.objects.filter(pk__in=behind)} == {"queued"}  # each waits for its branch
    if dies == "machine":
        machine = machines.start(workers=1)

    poll(lambda: not Job.objects.filter(pk__in=longs).exclude(status__in=TERMINAL).exists(), timeout=WAIT,
         interval=0.2, what="the dead process's turns to be recovered")
    recovered_in = time.monotonic() - killed_at

    def all_ended():
        return not Job.objects.filter(session_id__in=sids).exclude(status__in=TERMINAL).exists()

    try:
        poll(all_ended, timeout=AFTER_RECOVERY, interval=0.2, what="the turns queued behind to run")
    except AssertionError:
        waiting = Counter(Job.objects.filter(pk__in=behind).values_list("status", flat=True))
        ran = Job.objects.filter(pk__in=behind).exclude(worker="").count()
        pytest.fail(
            f"{dies} killed: the {TURNS} dead turns were recovered ({recovered_in:.1f}s after the kill), but "
            f"{AFTER_RECOVERY:.0f}s later the turns queued behind them are {dict(waiting)} ({ran} claimed by "
            f"any worker): the new worker process of machine {machine.pid} takes no task\n{machines.log_tail()}")
    assert machine.poll() is None, machines.log_tail()

    jobs = list(Job.objects.filter(session_id__in=sids))
    statuses = Counter(j.status for j in jobs)
    assert len(jobs) == 2 * TURNS, statuses

    # every long turn: interrupted, recorded against the dead process, never re-run, never answered
    for job in Job.objects.filter(pk__in=longs):
        assert (job.status, job.error_code) == ("interrupted", "interrupted"), (job.pk, job.status, job.error_code)
        assert job.worker == doomed, (job.pk, job.worker)
        assert list(Message.objects.filter(job_id=job.pk).values_list("role", flat=True)) == ["user"], job.pk

    # every quick turn: run once, on a live worker process, not the dead one
    replacement = set()
    for job in Job.objects.filter(pk__in=behind):
        assert job.status == "succeeded", (job.pk, job.status, job.error_code, job.result)
        assert job.worker != doomed, job.pk
        replacement.add(job.worker)

    # no job ran twice: one prompt node each, at most one final answer (exactly one if it succeeded)
    reran = []
    for job in jobs:
        prompts = Message.objects.filter(job_id=job.pk, role="user", kind=PROMPT_KIND[job.kind]).count()
        finals = Message.objects.filter(job_id=job.pk, metadata__final=True).count()
        if prompts != 1 or finals > 1 or (job.status == "succeeded" and finals != 1):
            reran.append((job.pk, job.kind, job.status, prompts, finals))
    assert reran == [], reran

    # each job ended once: exactly one terminal event on its session's log, the one its row says
    ends = Counter()
    for sid in sids:
        for event in events(api, sid):
            if event["type"] in {f"job.{status}" for status in TERMINAL}:
                ends[(event["payload"].get("job"), event["type"])] += 1
    for job in jobs:
        assert ends.pop((job.pk, f"job.{job.status}"), 0) == 1, (job.pk, job.status)
    assert not ends, f"terminal events no job's row agrees with: {dict(ends)}"

    for sid in sids:
        assert_well_formed(sid)
    figure(f"R1 (many turns in one process, {dies} killed): {TURNS} turns in flight in one worker process, "
           f"SIGKILLed; {statuses.get('interrupted', 0)} interrupted once, recovered {recovered_in:.1f}s after "
           f"the kill (lease {LEASE} s, reconcile {RECONCILE} s); {statuses.get('succeeded', 0)} turns queued "
           f"behind them succeeded on {len(replacement)} new worker process(es); {len(reran)} run twice")
