"""Liveness is the worker's, not the loop's (docs/contract.md#crash-recovery).

End to end through the REST API on real ``qcluster`` processes started here with a SHORT
lease (``TRELLIS_LEASE_SECONDS=3``, ``TRELLIS_RECONCILE_SECONDS=1``), so every worker
process reconciles every second while the tests run:

- a turn blocked far longer than the lease — in ``job_output(block=true)`` on a sleeping
  background child, in a scripted ``sleep_ms`` step, in a non-streaming model call to a
  fake OpenAI server that answers late — stays ``running`` and succeeds, while reconcile
  runs (in the workers and from ``manage.py reconcile``); a turn queued behind it on the
  same branch waits for it, so the branch stays one chain (no second leaf);
- a SIGKILLed worker's running job becomes ``interrupted``, its ``stopping`` job
  ``cancelled``, and its queued jobs start on a new worker (the time this takes is
  measured by ``bench/recovery.py``, not here).

The tasks of this module go to a queue of their own (``QUEUE``) that only the workers
started here serve, so the job under test always runs with the short lease even when the
session-wide ``worker`` (30 s lease) is running in the same test run.
"""

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.collab.fake_llm import OpenAIDialect
from tests.collab.test_providers import operator_connection
from tests.conftest import (
    agent_call,
    cancel,
    execution,
    executions,
    make_spec,
    open_session,
    poll,
    step,
    turn,
)
from tests.conftest import ROOT, _wait_for_output, settle_worker, wait_at_rest

pytestmark = pytest.mark.slow

LEASE = 3  # seconds
RECONCILE = 1  # seconds
BLOCK_MS = 5 * LEASE * 1000  # every blocked turn here outlives five leases
WAIT = 120.0  # generous poll timeout for loaded machines; never reached when things work
KEY_ENV = "TRELLIS_TEST_LIVENESS_KEY"
os.environ.setdefault(KEY_ENV, "sk-liveness-test")


@pytest.fixture(scope="module")
def queue_name(process_env):
    return process_env["TRELLIS_QUEUE_NAME"] + "-liveness"


@pytest.fixture(scope="module")
def short_lease_env(process_env, queue_name):
    # Q_CLUSTER_NAME (django-q2) is the broker list a cluster serves; its TRELLIS_QUEUE_NAME (the
    # signing salt of every task) stays the test run's
    return dict(process_env, TRELLIS_LEASE_SECONDS=str(LEASE), TRELLIS_RECONCILE_SECONDS=str(RECONCILE),
                Q_CLUSTER_NAME=queue_name, **{KEY_ENV: os.environ[KEY_ENV]})


def start_cluster(env, log: Path, workers: int):
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"],
                                env=dict(env, TRELLIS_WORKERS=str(workers)), cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    _wait_for_output(log, "running.", proc, 60)
    proc.log = log
    return proc


def stop_cluster(proc) -> None:
    """Stop a cluster as its operator does: SIGTERM to its main process, which stops its own
    processes (a SIGTERM to the whole group reaches them first and django-q2's stop then never
    ends: 15 s of waiting for the SIGKILL below, every time); what is left gets SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(5)


@pytest.fixture(scope="module")
def live_cluster(short_lease_env, tmp_path_factory):
    """A real qcluster (2 worker processes) with the short lease, serving ``queue_name``."""
    proc = start_cluster(short_lease_env, tmp_path_factory.mktemp("liveness") / "qcluster.log", workers=2)
    yield proc
    stop_cluster(proc)


@pytest.fixture(autouse=True)
def _own_queue(transactional_db, queue_name, monkeypatch):
    """Turns admitted through the API by this test go to this module's queue; afterwards
    whatever is still open is cancelled and the workers are let go quiet."""
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "CLUSTER_NAME", queue_name)
    yield
    settle_worker(timeout=30)


def reconcile_from_outside() -> str:
    """``manage.py reconcile`` from this process (one more reconciler besides the workers')."""
    out = io.StringIO()
    call_command("reconcile", stdout=out)
    return out.getvalue()


def wait_ended(api, eid, *, while_running=None) -> dict:
    """Poll the execution until it is terminal, running ``manage.py reconcile`` between polls
    and checking ``while_running()`` (if given) every time."""
    def ended():
        if while_running is not None:
            while_running()
        reconcile_from_outside()
        body = execution(api, eid)
        return body if body["status"] in {"succeeded", "failed", "cancelled", "interrupted"} else None

    return poll(ended, timeout=WAIT, interval=0.5, what=f"execution {eid} to end")


def assert_one_chain(branch_id: str) -> None:
    """No node of the branch has two successors on the branch: it is one chain, one leaf
    (``attach`` nodes, which record a spawn beside the chain without moving the tip, aside)."""
    from collab.models import Message

    preds = list(Message.objects.filter(branch_id=branch_id).exclude(kind="attach")
                 .values_list("predecessor_id", flat=True))
    assert len(preds) == len(set(preds)), f"branch {branch_id} forked inside itself: {preds}"


def worker_alive(job_id: str) -> bool:
    from collab.models import Job

    pid = int(Job.objects.get(pk=job_id).worker.rpartition(":")[2])
    return Path(f"/proc/{pid}").exists()


def claimed_by(job_id: str, cluster) -> bool:
    """The job is running in a worker process of ``cluster`` (the short-lease one)."""
    from collab.models import Job

    row = Job.objects.get(pk=job_id)
    pid = int(row.worker.rpartition(":")[2])
    try:
        return os.getpgid(pid) == cluster.pid
    except ProcessLookupError:
        return False


def blocked_turn_survives(api, sid, root_id, cluster, **behind) -> dict:
    """The turn ``root_id`` is blocked far past the lease: it must stay running (never
    interrupted) while reconcile runs, and a second turn queued behind it on the branch must
    wait for it (``behind``: that turn's extra fields, e.g. an ``agent_id`` that answers at
    once, so the test does not block a second time). Returns the root's final execution."""
    from collab.models import Job

    poll(lambda: execution(api, root_id)["status"] == "running", timeout=WAIT, what="the turn running")
    assert claimed_by(root_id, cluster)
    behind = turn(api, sid, "and then this", **behind)

    def still_alive():
        status = execution(api, root_id)["status"]
        assert status != "interrupted", f"a healthy turn was declared dead: {execution(api, root_id)}"
        if status == "running":
            assert execution(api, behind)["status"] == "queued", "a second turn started on a busy branch"

    ended = wait_ended(api, root_id, while_running=still_alive)
    assert ended["status"] == "succeeded", ended
    assert not ended["is_error"]
    assert api.wait(behind, timeout=WAIT)["status"] == "succeeded"
    root = Job.objects.get(pk=root_id)
    nxt = Job.objects.get(pk=behind)
    assert nxt.branch_id == root.branch_id
    assert_one_chain(root.branch_id)
    node, lineage = nxt.prompt_msg, []
    while node is not None:
        lineage.append((node.job_id, (node.metadata or {}).get("final", False)))
        node = node.predecessor
    assert (root_id, True) in lineage  # the next turn hangs off this turn's answer
    return ended


# --- a blocked turn outlives its lease ---------------------------------------------------------------


def test_turn_blocked_in_job_output_outlives_the_lease(team, api_as, live_cluster):
    """A turn blocked in ``job_output(block=true)`` on a background child that
    sleeps five leases stays running and succeeds; so does the child."""
    owner = api_as(team.owner)
    make_spec(owner, "sleeper", [{"sleep_ms": BLOCK_MS}, {"text": "slept"}])
    make_spec(owner, "quick", [{"text": "right after"}])
    make_spec(owner, "waiter", {
        "user": [
            step(agent_call("sleep for a while", "sleeper", description="sleeper")),
            step({"name": "job_output", "arguments": {"job_id": "{{last.details.execution_id}}", "block": True,
                                                      "timeout": 4 * BLOCK_MS}}),
            {"text": "the child said: {{last.text}}"},
        ],
        "followup": [{"text": "noted"}],
    })
    api = api_as(team.member)
    sid = open_session(api, "waiter")
    root = turn(api, sid, "wait for your child")
    ended = blocked_turn_survives(api, sid, root, live_cluster, agent_id="quick")
    child = next(j for j in executions(api, sid) if j["parent_job"] == root)
    assert child["status"] == "succeeded", child
    assert ended["result"] == "the child said: slept", ended


def test_turn_blocked_in_a_sleep_step_outlives_the_lease(team, api_as, live_cluster):
    """A scripted ``sleep_ms`` step of five leases (the turn loop only reads the
    job's status meanwhile; the worker process renews the lease) stays running and succeeds."""
    owner = api_as(team.owner)
    make_spec(owner, "slow", {"user": [{"sleep_ms": BLOCK_MS}, {"text": "done sleeping"}]})
    make_spec(owner, "quick", [{"text": "right after"}])
    api = api_as(team.member)
    sid = open_session(api, "slow")
    root = turn(api, sid, "sleep")
    ended = blocked_turn_survives(api, sid, root, live_cluster, agent_id="quick")
    assert ended["result"] == "done sleeping"


@pytest.fixture(scope="module")
def fake_server():
    from tests.collab.fake_llm import FakeLLM

    server = FakeLLM().start()
    yield server
    server.stop()


def test_slow_non_streaming_model_call_outlives_the_lease(team, api_as, live_cluster, fake_server):
    """A non-streaming model call that the (fake, local) OpenAI server answers
    only after five leases stays running and succeeds."""
    fake_server.reset()
    fake_server.add(OpenAIDialect.text("a slow answer", delay=BLOCK_MS / 1000))
    owner = api_as(team.owner)
    operator_connection("liveness-llm", "openai", OpenAIDialect.base_url(fake_server), KEY_ENV)
    r = owner.post("/api/projects/alpha/agent-specs", {
        "agent_id": "slowllm", "provider": "openai", "model": "gpt-test", "connection": "liveness-llm",
        "limits": {"stream": False},
    })
    assert r.status_code == 201, r.content
    api = api_as(team.member)
    sid = open_session(api, "slowllm")
    root = turn(api, sid, "think slowly")
    ended = blocked_turn_survives(api, sid, root, live_cluster)
    assert ended["result"] == "a slow answer"
    assert len(fake_server.requests) == 2  # one model call per turn: the slow one was never re-run
    assert fake_server.requests[0].body.get("stream") in (None, False)


# --- a dead worker's jobs are recovered --------------------------------------------------------------


def test_killed_worker_jobs_are_recovered_by_a_new_worker(team, api_as, short_lease_env, queue_name,
                                                                  tmp_path, monkeypatch):
    """SIGKILL a whole worker machine (its qcluster process group) while it runs
    two turns, one of which is then cancelled (``stopping`` with nobody to confirm it), and a
    third turn waits behind one of them on its branch. The surviving workers (and a new one
    started afterwards) recover everything by themselves, with no reconcile run from outside:
    the running turn ends ``interrupted`` (never re-run), the stopping one ``cancelled``, the
    queued ones start on a live worker."""
    from collab.models import Job, Message

    owner = api_as(team.owner)
    make_spec(owner, "long", [{"sleep_ms": 600_000}, {"text": "never"}])
    make_spec(owner, "quick", [{"text": "quick answer"}])
    api = api_as(team.member)
    from django_q.brokers import get_broker
    from django_q.conf import Conf

    doomed_queue = queue_name + "-doomed"  # only the doomed machine serves it
    doomed = start_cluster(dict(short_lease_env, Q_CLUSTER_NAME=doomed_queue), tmp_path / "doomed.log", workers=2)
    monkeypatch.setattr(Conf, "CLUSTER_NAME", doomed_queue)
    new = None
    try:
        s1, s2 = open_session(api, "long", title="one"), open_session(api, "long", title="two")
        s3 = open_session(api, "quick", title="three")
        running = turn(api, s1, "run long")
        stopping = turn(api, s2, "run long too")
        for eid in (running, stopping):
            poll(lambda: execution(api, eid)["status"] == "running", timeout=WAIT, what="both turns running")
            assert claimed_by(eid, doomed)
        behind = turn(api, s1, "after the long one")  # queued behind `running` on its branch
        other = turn(api, s3, "a turn of its own")  # may sit in the doomed cluster's local queue

        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait(15)
        r = cancel(api, stopping, command_id="cancel-after-death")
        assert r.status_code == 202, r.content
        assert execution(api, stopping)["status"] == "stopping"

        new = start_cluster(short_lease_env, tmp_path / "new.log", workers=2)

        def ended(eid):
            body = execution(api, eid)
            return body if body["status"] not in ("queued", "running", "stopping") else None

        dead = poll(lambda: ended(running), timeout=WAIT, interval=0.2, what="the dead worker's turn to end")
        assert dead["status"] == "interrupted" and dead["error_code"] == "interrupted", dead
        assert Message.objects.filter(job_id=running).count() == 1  # its prompt only: never re-run
        cancelled = poll(lambda: ended(stopping), timeout=WAIT, interval=0.2, what="the stopping turn to end")
        assert cancelled["status"] == "cancelled", cancelled
        assert poll(lambda: ended(other), timeout=WAIT, interval=0.2, what="the queued turn")["status"] == "succeeded"
        poll(lambda: execution(api, behind)["status"] == "running", timeout=WAIT, interval=0.2,
             what="the turn queued behind the dead one to start")
        assert not claimed_by(behind, doomed) and worker_alive(behind)
        assert Job.objects.get(pk=behind).branch_id == Job.objects.get(pk=running).branch_id
        assert_one_chain(Job.objects.get(pk=running).branch_id)
    finally:
        # The turn behind runs a 600 s step on the new machine: cancel it while that machine lives
        # to confirm it (a qcluster's graceful stop waits for its running tasks). The doomed list's
        # rows were taken by the dead machine and are never acknowledged: nobody serves it now.
        wait_at_rest(WAIT, cancel=True, broker=False)
        get_broker(doomed_queue).purge_queue()
        stop_cluster(doomed)
        if new is not None:
            stop_cluster(new)


# --- the stated bound is validated at start-up ---------------------------------------------------


@pytest.mark.parametrize(("env", "message"), [
    ({"TRELLIS_LEASE_SECONDS": "thirty"}, "TRELLIS_LEASE_SECONDS must be an integer"),
    ({"TRELLIS_LEASE_SECONDS": "1"}, "TRELLIS_LEASE_SECONDS must be >= 2"),
    ({"TRELLIS_RECONCILE_SECONDS": "0"}, "TRELLIS_RECONCILE_SECONDS must be >= 1"),
    ({"TRELLIS_LEASE_SECONDS": "10", "TRELLIS_RECONCILE_SECONDS": "11"}, "must not exceed TRELLIS_LEASE_SECONDS"),
])
def test_lease_and_reconcile_interval_are_validated_loudly(tmp_path, env, message):
    """Recovery takes up to lease + reconcile interval, so a reconcile interval longer than
    the lease (a bound over 2 x lease) or a value that is not a positive integer stops start-up."""
    from tests.test_settings import load_settings

    r = load_settings(tmp_path, **env)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize(("env", "expected"), [({}, (30, 10)), ({"TRELLIS_LEASE_SECONDS": "5"}, (5, 1)),
                                               ({"TRELLIS_LEASE_SECONDS": "3", "TRELLIS_RECONCILE_SECONDS": "3"}, (3, 3))])
def test_defaults_state_a_bound_within_two_leases(tmp_path, env, expected):
    """The defaults are a 30 s lease and a reconcile every lease/3 (bound 40 s <= 60 s)."""
    code = "import config.settings as s; print(s.TRELLIS_LEASE_SECONDS, s.TRELLIS_RECONCILE_SECONDS)"
    from tests.test_settings import CLEAN

    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**CLEAN, "TRELLIS_VAR_DIR": str(tmp_path), **env})
    assert r.returncode == 0, r.stderr
    lease, reconcile = map(int, r.stdout.split())
    assert (lease, reconcile) == expected and lease + reconcile <= 2 * lease
