"""One worker process runs many turns side by side (collab/runtime/slots.py).

End to end through the REST API on ONE real worker process: a ``manage.py qcluster`` with
``TRELLIS_WORKERS=1``, started here on a queue of its own (the session-wide ``worker`` fixture runs
two processes), with the deployment's default slots per process (``TRELLIS_TURNS_PER_WORKER``)
and running cap.

- 16 sessions each start a turn that sleeps 2 s in its model step: all 16 succeed, every job row
  names the same worker process, and they ran side by side — each of them had started before
  the first of them finished (the rows' ``started_at``/``finished_at``, on the database's clock).
  One turn at a time would take 32 s.
- A coordinator's 8 background children (``agent`` with ``run_in_background``) of 2 s each run
  side by side in that one process too.

The turns are admitted before the worker starts, so the test measures the worker taking and
running them, not how fast this test process admits them.
"""

import pytest

from tests.collab.test_liveness import start_cluster, stop_cluster
from tests.conftest import (
    agent_call,
    make_spec,
    open_session,
    set_limits,
    settle_session,
    wait_at_rest,
    step,
    turn,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NAP_MS = 2000
SESSIONS = 16
CHILDREN = 8
WAIT = 120.0  # a hang guard for loaded machines; never reached when things work


@pytest.fixture(scope="module")
def queue_name(process_env):
    return process_env["TRELLIS_QUEUE_NAME"] + "-side-by-side"


@pytest.fixture
def one_worker(transactional_db, process_env, queue_name, monkeypatch, tmp_path):
    """``one_worker()`` starts a qcluster with a single worker process serving this module's
    queue (the turns this test admits go there) and returns it; keyword arguments set more of
    its environment (``TRELLIS_TURNS_PER_WORKER="2"``). Afterwards whatever is still open is
    cancelled and let go quiet while the worker lives, then the worker is stopped."""
    from django_q.brokers import get_broker
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "CLUSTER_NAME", queue_name)
    env = dict(process_env, Q_CLUSTER_NAME=queue_name)
    for name in ("TRELLIS_TURNS_PER_WORKER", "TRELLIS_MAX_RUNNING_PER_PROJECT"):
        env.pop(name, None)  # the deployment's defaults: 128 slots per process, cap = workers x slots
    started = []

    def start(**more_env):
        proc = start_cluster(dict(env, **more_env), tmp_path / "qcluster.log", workers=1)
        started.append(proc)
        return proc

    try:
        yield start
        # every job ended (cancelled if open); the broker is left out: what this queue still holds
        # is purged below, and on Redis it was also counting the session's main queue, which no
        # worker serves in this module — a minute's wait for nothing
        wait_at_rest(60, cancel=True, broker=False)
    finally:
        for proc in started:
            stop_cluster(proc)
        get_broker().purge_queue()


def worker_pid(job) -> int:
    host, _, pid = job.worker.rpartition(":")
    assert host and pid.isdigit(), job.worker
    return int(pid)


def assert_ran_side_by_side(jobs, cluster) -> None:
    """Every job started before the first of them finished; all in one worker process of ``cluster``."""
    import os

    assert all(j.started_at and j.finished_at for j in jobs), [(j.pk, j.started_at, j.finished_at) for j in jobs]
    last_start = max(j.started_at for j in jobs)
    first_end = min(j.finished_at for j in jobs)
    spread = (last_start - min(j.started_at for j in jobs)).total_seconds()
    span = (max(j.finished_at for j in jobs) - min(j.started_at for j in jobs)).total_seconds()
    print(f"{len(jobs)} turns: started within {spread:.2f}s, all done {span:.2f}s after the first started")
    assert last_start < first_end, (
        f"the last of {len(jobs)} turns started {spread:.2f}s after the first, after the first had "
        f"finished: they did not all run side by side")
    workers = {j.worker for j in jobs}
    assert len(workers) == 1, f"the turns ran in {len(workers)} processes: {workers}"
    pid = worker_pid(jobs[0])
    assert pid != cluster.pid and os.getpgid(pid) == cluster.pid  # a worker process of that cluster


def test_one_worker_process_runs_sixteen_sleeping_turns_side_by_side(team, api_as, one_worker):
    from collab.models import Job

    owner = api_as(team.owner)
    make_spec(owner, "napper", [{"sleep_ms": NAP_MS}, {"text": "rested: {{prompt}}"}])
    api = api_as(team.member)
    sids = [open_session(api, "napper", title=f"nap {n}") for n in range(SESSIONS)]
    ids = [turn(api, sid, f"nap {n}") for n, sid in enumerate(sids)]

    cluster = one_worker()
    for n, eid in enumerate(ids):
        done = api.wait(eid, timeout=WAIT)
        assert done["status"] == "succeeded", done
        assert done["result"] == f"rested: nap {n}", done

    jobs = list(Job.objects.filter(pk__in=ids))
    assert len(jobs) == SESSIONS
    assert_ran_side_by_side(jobs, cluster)
    for job in jobs:  # each ran its whole nap (one turn in one slot, not cut short)
        assert (job.finished_at - job.started_at).total_seconds() >= NAP_MS / 1000 * 0.9, job.pk


def test_one_worker_process_runs_a_coordinators_background_children_side_by_side(team, api_as, one_worker):
    from collab.models import Job

    owner = api_as(team.owner)
    set_limits(owner, max_spawn_fanout=0, max_messages=0)
    make_spec(owner, "kid", [{"sleep_ms": NAP_MS}, {"text": "finished {{prompt}}"}])
    make_spec(owner, "boss", {
        "user": [step(*[agent_call(f"part {i}", "kid", description=f"kid {i}") for i in range(CHILDREN)]),
                 {"text": "dispatched"}],
        "followup": [{"text": "heard"}],
    })
    api = api_as(team.member)
    sid = open_session(api, "boss", title="coordinator")
    root = turn(api, sid, "fan out")

    cluster = one_worker()
    jobs = settle_session(api, sid, timeout=WAIT, quiet=0.3)
    by_id = {j["id"]: j for j in jobs}
    assert by_id[root]["status"] == "succeeded" and by_id[root]["result"] == "dispatched", by_id[root]
    kids = [j for j in jobs if j["kind"] == "spawn"]
    assert len(kids) == CHILDREN, [(j["kind"], j["status"]) for j in jobs]
    assert all(j["status"] == "succeeded" for j in kids), [(j["id"], j["status"], j["result"]) for j in kids]
    assert sorted(j["result"] for j in kids) == sorted(f"finished part {i}" for i in range(CHILDREN))
    assert all(j["status"] == "succeeded" for j in jobs), [(j["kind"], j["status"]) for j in jobs]

    rows = list(Job.objects.filter(pk__in=[j["id"] for j in kids]))
    assert_ran_side_by_side(rows, cluster)
    assert Job.objects.get(pk=root).worker == rows[0].worker  # the coordinator's process too
