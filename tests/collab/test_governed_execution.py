"""Governed execution (docs/contract.md#admission-budgets-and-quotas, #cancel-and-archive,
#crash-recovery and #results).

Admission, topology budgets, resource quotas, the versioned ``execution.cancel``
command, crash recovery and bounded results, driven through public entry points
— user turns, executions and commands over the REST API, the tool gateway
(``POST /api/branches/{address}/tools/{tool}``), scripted agents' own tool
calls, ``manage.py`` commands — against real django-q2 worker processes where turns must
run side by side (cancels, races, quotas on running jobs), and in this process
(``run_queued``, tests/conftest.py) where one turn after another is all a rule needs.

Waiting is always polling with a timeout; no fixed sleep is an assertion. Rows
are read directly only to observe what the API does not show (message nodes,
"nothing was created" counts, which worker holds a job) and to simulate what
cannot be caused from outside (a lease running out, an artifact expiring, a
failing artifact write, an illegal UPDATE the database must refuse).
"""

import hashlib
import io
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from tests.collab.test_liveness import stop_cluster
from tests.conftest import (
    ROOT,
    TERMINAL,
    WAIT,
    ApiClient,
    _wait_for_output,
    address_of,
    agent_call,
    branches,
    cancel,
    drop_tasks,
    events,
    execution,
    executions,
    make_spec,
    open_session,
    poll,
    set_limits,
    settle,
    start_turn,
    step,
    taken_tasks,
    tool,
    tool_results,
    transcript_messages,
    turn,
)

pytestmark = pytest.mark.slow

LONG_MS = 30_000  # a model call that is always cancelled long before it ends
# a model call that cannot end by itself within any wait of a test (the scripted provider's
# longest sleep): a job with this step that reaches a terminal state within WAIT was
# stopped by what the test did (a cancel), not by the sleep running out — "promptly" without a
# wall-clock bound
UNENDING_MS = 600_000


# --- helpers ----------------------------------------------------------------------------------


def sender_and_busy_target(team, api_as, nap_ms: int, quiet_text: str = "quiet"):
    """A member's idle sender branch and a target branch busy with a ``nap_ms`` sleep step
    (running): (member's api, sender session id, sender address, target session id, busy execution
    id, target address)."""
    owner = api_as(team.owner)
    make_spec(owner, "nap", [{"sleep_ms": nap_ms}, {"text": "rested"}])
    make_spec(owner, "quiet", [{"text": quiet_text}])
    api = api_as(team.member)
    ssid = open_session(api, "quiet", title="sender")
    sender = address_of(api.wait(turn(api, ssid, "hello")))
    tsid = open_session(api, "nap", title="target")
    busy = turn(api, tsid, "busy for a while")
    target = address_of(api.wait(busy, {"running"}))
    return api, ssid, sender, tsid, busy, target


def children(parent_id, agent_id=None):
    """Jobs whose parent is ``parent_id`` (optionally run by the saved agent ``agent_id``)."""
    from collab.models import Job

    qs = Job.objects.filter(parent_job_id=parent_id).order_by("created_at")
    if agent_id:
        qs = qs.filter(agent_spec__agent_id=agent_id)
    return list(qs)


def job_count(**filters) -> int:
    from collab.models import Job

    return Job.objects.filter(**filters).count()


def terminal_events(api, sid) -> dict[str, list[str]]:
    """``{job_id: [terminal event types]}`` from the session's event log."""
    out: dict[str, list[str]] = {}
    for e in events(api, sid):
        kind = e["type"].removeprefix("job.")
        if e["type"].startswith("job.") and kind in TERMINAL:
            out.setdefault(e["payload"]["job"], []).append(kind)
    return out


def event_types(api, sid) -> list[tuple[str, dict]]:
    return [(e["type"], e["payload"]) for e in events(api, sid)]


# --- both agent modes admit Jobs; cancel is the versioned execution command --------------------


def test_background_and_foreground_agent_calls_both_admit_jobs(team, api_as, run_queued):
    owner = api_as(team.owner)
    make_spec(owner, "child", [{"text": "child says {{prompt}}"}])
    make_spec(owner, "boss", {"user": [
        step(agent_call("fore", "child", background=False, description="fore")),
        step(agent_call("back", "child", description="back")),
        {"text": "dispatched"},
    ]})
    api = api_as(team.member)
    sid = open_session(api, "boss")
    root = turn(api, sid, "split the work")
    assert api.wait(root, timeout=WAIT)["status"] == "succeeded"
    jobs = settle(api, sid)

    spawned = [j for j in jobs if j["kind"] == "spawn"]
    assert len(spawned) == 2, jobs
    assert {j["parent_job"] for j in spawned} == {root}
    assert sorted(j["result"] for j in spawned) == ["child says back", "child says fore"]
    assert all(j["status"] == "succeeded" for j in spawned)
    # only the background child owes a follow-up; the foreground result came back inline
    followups = [j for j in jobs if j["kind"] == "followup"]
    assert len(followups) == 1, jobs
    root_tools = tool_results(root)
    assert root_tools[0]["tool"] == "agent" and root_tools[0]["text"] == "child says fore"
    assert "background" in root_tools[1]["text"] and not root_tools[1]["is_error"]

    # through the gateway too: a foreground call (run inline) is an admitted, listed Job
    main = address_of(execution(api, root))
    fg = tool(api, main, "agent", prompt="from the gateway", agent_id="child")
    assert not fg["is_error"], fg
    listed = {j["id"]: j for j in executions(api, sid)}
    assert listed[fg["details"]["execution_id"]]["status"] == "succeeded"
    assert listed[fg["details"]["execution_id"]]["kind"] == "spawn"

    # the job tools are list_jobs / job_output; there is no job_stop / task_stop tool
    jl = tool(api, main, "list_jobs")
    assert not jl["is_error"] and {j["job_id"] for j in jl["details"]["jobs"]} >= {j["id"] for j in spawned}
    out = tool(api, main, "job_output", job_id=spawned[0]["id"], block=False)
    assert not out["is_error"] and out["details"]["job_id"] == spawned[0]["id"]
    for name in ("job_stop", "task_stop"):
        r = tool(api, main, name, job_id=spawned[0]["id"])
        assert r["is_error"] and r["details"]["code"] == "unknown_tool", r


# --- execution.cancel (docs/contract.md#cancel) --------------------------------------------------


def test_cancel_is_versioned_idempotent_and_handles_queued_running_terminal(team, api_as, worker):
    owner = api_as(team.owner)
    make_spec(owner, "slow", [{"sleep_ms": UNENDING_MS}, {"text": "slept"}])
    api = api_as(team.member)
    sid = open_session(api, "slow")
    first = turn(api, sid, "one")
    api.wait(first, {"running"})
    second = turn(api, sid, "two")  # queued behind the running turn on the same branch
    queued = execution(api, second)
    assert queued["status"] == "queued"

    # a stale version is a conflict and changes nothing
    r = cancel(api, second, version=queued["version"] + 1)
    assert r.status_code == 409, r.content
    assert r.json()["code"] == "stale_version"
    assert execution(api, second)["version"] == queued["version"]

    # queued → cancelled without starting
    r = cancel(api, second, version=queued["version"], command_id="cancel-the-queued-one")
    assert r.status_code == 202, r.content
    answer = r.json()
    assert answer["status"] == "cancelled" and answer["version"] > queued["version"]
    gone = execution(api, second)
    assert gone["status"] == "cancelled" and gone["started_at"] is None and gone["prompt_msg"] is None
    assert gone["is_error"] and gone["error_code"] == "cancelled"
    # repeating the command_id returns the first answer (even though its version is stale now)
    again = cancel(api, second, version=queued["version"], command_id="cancel-the-queued-one")
    assert again.status_code == 202 and again.json() == answer

    # the running turn kept running: cancelling the queued one touched nothing else
    running = execution(api, first)
    assert running["status"] == "running"
    r = cancel(api, first, version=running["version"] - 1)
    assert r.status_code == 409 and r.json()["code"] == "stale_version"
    # a command_id is scoped to its execution: on another one it is a new command, not a replay
    r = cancel(api, first, version=running["version"] - 1, command_id="cancel-the-queued-one")
    assert r.status_code == 409 and r.json()["code"] == "stale_version", r.content
    r = cancel(api, first, action="execution.pause")
    assert r.status_code == 400 and r.json()["code"] == "invalid_action"
    r = cancel(api, first, payload={"force": True})
    assert r.status_code == 400 and r.json()["code"] == "invalid_payload"

    # running → stopping (cancel requested) → cancelled (stopped), promptly: the cancel ends
    # the unending model call (within WAIT; by itself it would run ten minutes)
    r = cancel(api, first, version=running["version"])
    assert r.status_code == 202, r.content
    assert r.json()["status"] == "stopping"
    done = api.wait(first, timeout=WAIT)
    assert done["status"] == "cancelled" and done["error_code"] == "cancelled" and done["is_error"]
    # the UI can tell "cancel requested" from "stopped": two distinct events, in that order
    states = [t for t, p in event_types(api, sid) if p.get("job") == first and t in ("job.stopping", "job.cancelled")]
    assert states == ["job.stopping", "job.cancelled"]
    assert [m for m in transcript_messages(api, address_of(done)) if m["role"] == "assistant"] == []

    # terminal → idempotent no-op (202, nothing changes)
    r = cancel(api, first, version=done["version"])
    assert r.status_code == 202, r.content
    assert r.json()["status"] == "cancelled" and r.json()["version"] == done["version"]
    assert execution(api, first)["version"] == done["version"]


def test_cancel_cascades_through_a_three_level_tree(team, api_as, worker):
    owner = api_as(team.owner)
    set_limits(owner, max_spawn_depth=3)
    make_spec(owner, "leaf", [{"sleep_ms": UNENDING_MS}, {"text": "leaf done"}])
    make_spec(owner, "mid", {"spawn": [step(agent_call("grandchild work", "leaf", description="leaf")),
                                       {"sleep_ms": UNENDING_MS}, {"text": "mid done"}]})
    make_spec(owner, "root", {"user": [step(agent_call("child work", "mid", description="mid")),
                                       {"sleep_ms": UNENDING_MS}, {"text": "root done"}]})
    api = api_as(team.member)
    sid = open_session(api, "root")
    root = turn(api, sid, "grow a tree")

    def tree():
        jobs = {j["id"]: j for j in executions(api, sid)}
        mid = [j for j in jobs.values() if j["parent_job"] == root]
        leaf = [j for j in jobs.values() if mid and j["parent_job"] == mid[0]["id"]]
        if jobs[root]["status"] == "running" and mid and mid[0]["status"] == "running" and leaf:
            return mid[0], leaf[0]
        return None

    mid, leaf = poll(tree, what="root and child running, grandchild admitted")
    r = cancel(api, root)
    assert r.status_code == 202, r.content
    assert r.json()["status"] == "stopping"
    assert set(r.json()["cascaded"]) == {mid["id"], leaf["id"]}
    for eid in (root, mid["id"], leaf["id"]):  # each unending model call was ended by the cancel
        assert api.wait(eid, timeout=WAIT)["status"] == "cancelled", eid

    # each cancelled child's result still reaches its caller exactly once, as an error — as a
    # notice on the cancelled caller's branch, never as a new model turn (the cancel fence)
    jobs = settle(api, sid)
    root_job, mid_job = execution(api, root), execution(api, mid["id"])
    for caller, child in ((root_job, mid_job), (mid_job, execution(api, leaf["id"]))):
        notices = [m for m in transcript_messages(api, address_of(caller))
                   if m["role"] == "user" and f"did not finish execution {child['id']}" in m["text"]]
        assert len(notices) == 1, (caller["id"], child["id"], notices)
        assert notices[0]["kind"] == "notice", notices
        assert "cancelled" in notices[0]["text"] and "is_error=true" in notices[0]["text"]
    assert [j for j in jobs if j["kind"] == "followup"] == [], jobs


def test_cancel_reaches_a_foreground_child_running_inline(team, api_as, worker):
    """A foreground ``agent`` call runs its child inside the caller's worker; cancelling the
    caller stops both, promptly (the child's unending model call ends by the cancel), and
    neither leaves an answer behind."""
    owner = api_as(team.owner)
    make_spec(owner, "leaf", [{"sleep_ms": UNENDING_MS}, {"text": "leaf done"}])
    make_spec(owner, "root", {"user": [step(agent_call("wait for me", "leaf", background=False, description="fg")),
                                       {"text": "root done"}]})
    api = api_as(team.member)
    sid = open_session(api, "root")
    root = turn(api, sid, "go")
    child = poll(lambda: next((j for j in executions(api, sid) if j["parent_job"] == root
                               and j["status"] == "running"), None), what="the inline child running")
    r = cancel(api, root)
    assert r.status_code == 202 and r.json()["cascaded"] == [child["id"]], r.content
    assert api.wait(child["id"], timeout=WAIT)["status"] == "cancelled"
    assert api.wait(root, timeout=WAIT)["status"] == "cancelled"
    jobs = settle(api, sid)
    assert len(jobs) == 2  # a foreground child owes no follow-up
    assert [m for m in transcript_messages(api, address_of(execution(api, root)))
            if m["role"] == "assistant" and not m["tool_calls"]] == []


def test_cancel_needs_runtime_control_or_ownership(team, api_as, make_user, worker):
    from accounts.models import Membership

    colleague = make_user("member2")
    Membership.objects.create(user=colleague, project=team.alpha, role="member")
    owner = api_as(team.owner)
    make_spec(owner, "slow", [{"sleep_ms": LONG_MS}, {"text": "slept"}])
    api = api_as(team.member)
    sid = open_session(api, "slow")
    eid = turn(api, sid, "mine")
    version = api.wait(eid, {"running"})["version"]

    # another member may see it but not stop it; a viewer neither
    for user in (colleague, team.viewer):
        r = cancel(api_as(user), eid, version=version, command_id=f"try-{user.username}")
        assert r.status_code == 403, (user.username, r.content)
        assert r.json()["code"] == "forbidden"
    # knowing the id grants nothing to an outsider: indistinguishable from a missing id
    outsider = api_as(team.outsider)
    for path in (f"/api/executions/{eid}", "/api/executions/no-such-execution"):
        r = outsider.get(path)
        assert r.status_code == 404 and r.json() == {"detail": "not found", "code": "not_found"}
    r = cancel(outsider, eid, version=version)
    assert r.status_code == 404 and r.json() == {"detail": "not found", "code": "not_found"}
    assert outsider.get("/api/executions", session=sid).status_code == 404
    assert execution(api, eid)["status"] == "running" and execution(api, eid)["version"] == version

    # a maintainer holds runtime.control; refused attempts recorded nothing, so a refused
    # command_id is still free
    r = cancel(api_as(team.maintainer), eid, version=version, command_id="try-member2")
    assert r.status_code == 202, r.content
    assert r.json()["status"] == "stopping"
    assert api.wait(eid)["status"] == "cancelled"


def test_racing_cancels_leave_every_job_terminal_once(team, api_as, worker):
    owner = api_as(team.owner)
    make_spec(owner, "brief", [{"sleep_ms": 150}, {"text": "done"}])
    api = api_as(team.member)
    sid = open_session(api, "brief")
    ids = [turn(api, sid, f"turn {i}") for i in range(20)]
    token_clients = [api_as(team.member) for _ in range(4)]
    rng = random.Random(20240607)
    answers: list[tuple[str, int, dict]] = []
    lock = threading.Lock()

    def racer(eid, delay, base):
        client = ApiClient(type(base.client)(), None)
        client.headers = dict(base.headers)
        try:
            time.sleep(delay)  # a random moment: queued, running or already finished
            for _ in range(3):
                version = client.get(f"/api/executions/{eid}").json()["version"]
                r = cancel(client, eid, version=version)
                with lock:
                    answers.append((eid, r.status_code, r.json()))
                if r.status_code != 409:
                    break
        finally:
            connection.close()

    threads = [threading.Thread(target=racer, args=(eid, rng.uniform(0, 4.0), token_clients[n % 4]))
               for n, eid in enumerate(ids * 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads)

    final = {eid: api.wait(eid, timeout=WAIT) for eid in ids}
    assert all(j["status"] in ("succeeded", "cancelled") for j in final.values()), final
    for j in final.values():
        if j["status"] == "cancelled" and j["started_at"] is None:
            assert j["prompt_msg"] is None, j  # cancelled before it started: it never wrote a node
    assert {code for _, code, _ in answers} <= {202, 409}, answers
    for _eid, code, body in answers:
        if code == 409:
            assert body["code"] == "stale_version", body
        else:
            assert body["status"] in ("stopping", "cancelled", "succeeded"), body
    assert any(code == 202 for _, code, _ in answers)
    # every job reached exactly one terminal state
    ends = terminal_events(api, sid)
    assert {eid: ends.get(eid) for eid in ids} == {eid: [final[eid]["status"]] for eid in ids}
    settle(api, sid)


def test_database_refuses_illegal_job_transitions(team, api_as, worker):
    from collab.models import Job

    owner = api_as(team.owner)
    make_spec(owner, "quick", [{"text": "done"}])
    api = api_as(team.member)
    sid = open_session(api, "quick")
    done = turn(api, sid, "finish")
    assert api.wait(done)["status"] == "succeeded"
    make_spec(owner, "slow", [{"sleep_ms": LONG_MS}])
    busy = turn(api, sid, "hold the branch", agent_id="slow")
    api.wait(busy, {"running"})
    queued_behind = turn(api, sid, "wait")
    assert cancel(api, queued_behind).status_code == 202
    assert execution(api, queued_behind)["status"] == "cancelled"

    for eid, status in ((done, "running"), (done, "queued"), (done, "cancelled"), (queued_behind, "running"),
                        (queued_behind, "queued"), (busy, "queued")):
        with pytest.raises(DatabaseError):
            with transaction.atomic():
                Job.objects.filter(pk=eid).update(status=status)
    assert execution(api, done)["status"] == "succeeded"
    assert execution(api, queued_behind)["status"] == "cancelled"
    assert execution(api, busy)["status"] == "running"


# --- crash recovery (docs/contract.md#crash-recovery) ------------------------------------------


def _gone(pid: int) -> bool:
    """The process no longer runs (it does not exist, or it is a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _is_qcluster(pid: int) -> bool:
    try:
        return b"qcluster" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False


def test_killed_worker_job_is_interrupted_never_rerun_and_followed_up_once(
    transactional_db, team, api_as, process_env, tmp_path
):
    """SIGKILL the worker process running a background child mid-turn. After its lease runs out
    the reconciler (``manage.py reconcile``) ends it ``interrupted``; it is never re-run, and its
    caller gets exactly one follow-up. This test starts its own worker (lease 5 s); the shared
    session worker may be running too, so whichever claimed the job is the one killed."""
    from collab.models import Job, Message

    env = dict(process_env, TRELLIS_LEASE_SECONDS="5", TRELLIS_WORKERS="1")
    log = tmp_path / "qcluster.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"], env=env, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    orphaned = []
    try:
        _wait_for_output(log, "running.", proc, 60)
        owner = api_as(team.owner)
        make_spec(owner, "sleeper", [{"sleep_ms": 60_000}, {"text": "never reached"}])
        make_spec(owner, "caller", {"user": [step(agent_call("sleep for a minute", "sleeper", description="sleeper")),
                                             {"text": "dispatched"}]})
        api = api_as(team.member)
        sid = open_session(api, "caller")
        root = turn(api, sid, "start a long child")
        assert api.wait(root, timeout=WAIT)["status"] == "succeeded"
        child = poll(lambda: next((j for j in executions(api, sid) if j["parent_job"] == root
                                   and j["status"] == "running"), None), what="the child running")
        row = Job.objects.get(pk=child["id"])
        host, _, pid = row.worker.rpartition(":")
        pid = int(pid)
        assert host == socket.gethostname(), row.worker
        # the claim names the q2 worker process itself: its parent (the sentinel) and grandparent
        # (the cluster) are qcluster processes too
        assert _is_qcluster(pid) and _is_qcluster(_parent(pid)) and _is_qcluster(_parent(_parent(pid))), pid
        mine = os.getpgid(pid) == proc.pid

        if mine:  # the whole worker machine dies
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)
        else:  # only the session worker's process; its guard may start a new one
            os.kill(pid, signal.SIGKILL)
        poll(lambda: _gone(pid), timeout=15, what=f"worker {pid} gone")
        orphaned = taken_tasks()  # the dead worker's broker row is never acknowledged
        assert execution(api, child["id"])["status"] in ("running", "interrupted")

        if mine:  # the lease (5 s) runs out by itself
            def expired():
                row = Job.objects.get(pk=child["id"])
                return row.status != "running" or row.lease_expires_at < timezone.now()

            poll(expired, timeout=20, interval=0.2, what="the lease to expire")
        else:  # the session worker leases for 30 s: expire it now rather than wait
            Job.objects.filter(pk=child["id"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

        out = io.StringIO()
        call_command("reconcile", stdout=out)
        ended = execution(api, child["id"])
        assert ended["status"] == "interrupted", (ended, out.getvalue())
        assert ended["is_error"] and ended["error_code"] == "interrupted"
        assert ended["started_at"] == child["started_at"]

        def nodes():
            return (Message.objects.filter(job_id=child["id"], role="user").count(),
                    Message.objects.filter(job_id=child["id"], role="assistant").count())

        assert nodes() == (1, 0)  # its prompt node only: no answer, no second start
        followups = poll(lambda: list(Job.objects.filter(followup_of_id=child["id"])), timeout=15,
                         what="the follow-up to be admitted")
        assert len(followups) == 1
        notice = followups[0].prompt_text
        assert f"did not finish execution {child['id']}: interrupted" in notice and "is_error=true" in notice
        assert followups[0].branch_id == Job.objects.get(pk=root).branch_id

        # reconciling again changes nothing: no re-run, no second follow-up
        call_command("reconcile", stdout=io.StringIO())
        again = execution(api, child["id"])
        assert again["status"] == "interrupted" and again["version"] == ended["version"]
        assert nodes() == (1, 0)
        assert Job.objects.filter(followup_of_id=child["id"]).count() == 1
    finally:
        drop_tasks(orphaned)  # else the teardown's wait for the workers counts it as queued
        stop_cluster(proc)


# --- topology budgets (docs/contract.md#topology-budgets) --------------------------------------


def _target_branch(api, owner):
    """An idle branch B in its own session (for agent(to=B) / send_message(to=B))."""
    make_spec(owner, "quiet", [{"text": "quiet here"}])
    tsid = open_session(api, "quiet", title="target")
    first = turn(api, tsid, "hello")
    assert api.wait(first)["status"] == "succeeded"
    return tsid, address_of(execution(api, first))


def test_messages_exhausted_refuses_delegation_but_not_reads_or_running_work(team, api_as, worker):
    from collab.models import InboxEntry

    owner = api_as(team.owner)
    set_limits(owner, max_messages=1)
    api = api_as(team.member)
    tsid, target = _target_branch(api, owner)
    make_spec(owner, "sleeper", [{"sleep_ms": LONG_MS}, {"text": "slept"}])
    make_spec(owner, "spent", {"spawn": [
        step({"name": "agent", "arguments": {"to": target, "prompt": "please do this"}}),
        step({"name": "send_message", "arguments": {"to": target, "message": "hello B"}}),
        step({"name": "list_jobs", "arguments": {}}),
        step({"name": "job_output", "arguments": {"job_id": "{{last.details.jobs.0.job_id}}", "block": False}}),
        step({"name": "list_agents", "arguments": {}}),
        {"text": "finished without delegating"},
    ]})
    make_spec(owner, "boss", {"user": [
        step(agent_call("keep working", "sleeper", description="sleeper"),
             agent_call("try to delegate", "spent", description="spent")),
        {"text": "dispatched"},
    ]})
    sid = open_session(api, "boss")
    target_jobs = len(executions(api, tsid))
    root = turn(api, sid, "go")
    assert api.wait(root)["status"] == "succeeded"
    spent = poll(lambda: children(root, "spent"), what="the spent child")[0]
    assert api.wait(spent.pk)["status"] == "succeeded"

    results = tool_results(spent.pk)
    assert [r["tool"] for r in results] == ["agent", "send_message", "list_jobs", "job_output", "list_agents"]
    assert results[0]["is_error"] and results[0]["code"] == "budget.messages_exhausted", results[0]
    assert results[1]["is_error"] and results[1]["code"] == "budget.messages_exhausted", results[1]
    assert "max_messages" in results[0]["text"]
    for r in results[2:]:
        assert not r["is_error"], r  # reading results and listing cost nothing
    # the refused deliveries created nothing on B
    assert len(executions(api, tsid)) == target_jobs
    assert InboxEntry.objects.count() == 0
    # nothing already accepted was cancelled, and cancel itself stays available
    sleeper = children(root, "sleeper")[0]
    assert execution(api, sleeper.pk)["status"] == "running"
    assert cancel(api, sleeper.pk).status_code == 202
    assert api.wait(sleeper.pk)["status"] == "cancelled"


def test_depth_exhausted_refuses_spawning_but_not_delivering(team, api_as, run_queued):
    owner = api_as(team.owner)
    set_limits(owner, max_spawn_depth=1)
    api = api_as(team.member)
    tsid, target = _target_branch(api, owner)
    make_spec(owner, "deep", {"spawn": [
        step(agent_call("a grandchild", description="grandchild")),
        step(agent_call("a foreground grandchild", background=False)),
        step({"name": "agent", "arguments": {"to": target, "prompt": "a task for B"}}),
        step({"name": "send_message", "arguments": {"to": target, "message": "a note for B"}}),
        {"text": "delegated instead"},
    ]})
    make_spec(owner, "boss", {"user": [step(agent_call("go deep", "deep", description="deep")), {"text": "ok"}]})
    sid = open_session(api, "boss")
    root = turn(api, sid, "go")
    deep = poll(lambda: children(root, "deep"), what="the child")[0]
    assert api.wait(deep.pk)["status"] == "succeeded"
    results = tool_results(deep.pk)
    assert [r["code"] for r in results[:2]] == ["budget.depth_exhausted", "budget.depth_exhausted"], results
    assert not results[2]["is_error"] and not results[3]["is_error"], results
    settle(api, sid, tsid)
    # no grandchild branch or job; B got the task and the message
    assert sorted(b["name"] for b in branches(api, sid)) == ["deep", "main"]
    assert children(deep.pk, None) and all(j.session_id == tsid for j in children(deep.pk))
    kinds = sorted(j["kind"] for j in executions(api, tsid) if j["kind"] in ("task", "message"))
    assert kinds == ["message", "task"]


def test_fanout_exhausted_refuses_the_extra_spawn_and_zero_means_unlimited(team, api_as, worker):
    owner = api_as(team.owner)
    set_limits(owner, max_spawn_fanout=2)
    make_spec(owner, "leafq", [{"text": "leaf ok"}])
    make_spec(owner, "boss", {"user": [
        step(*(agent_call(f"part {n}", "leafq", description=f"part{n}") for n in range(3))),
        {"text": "ok"},
    ]})
    api = api_as(team.member)
    sid = open_session(api, "boss")
    root = turn(api, sid, "fan out")
    assert api.wait(root)["status"] == "succeeded"
    results = tool_results(root)
    assert [r["is_error"] for r in results] == [False, False, True], results
    assert results[2]["code"] == "budget.fanout_exhausted"
    settle(api, sid)
    assert sorted(b["name"] for b in branches(api, sid)) == ["main", "part0", "part1"]
    assert len([j for j in executions(api, sid) if j["kind"] == "spawn"]) == 2
    # the slots belong to the calling (session, turn): the next turn has its own two
    again = turn(api, sid, "fan out again")
    assert api.wait(again)["status"] == "succeeded"
    assert [r["is_error"] for r in tool_results(again)] == [False, False, True]
    settle(api, sid)
    assert len([j for j in executions(api, sid) if j["kind"] == "spawn"]) == 4

    # 0 = unlimited: nine spawns in one turn (default fan-out is 8), and a grandchild (depth 2)
    set_limits(owner, max_spawn_fanout=0, max_spawn_depth=0)
    make_spec(owner, "nest", {"spawn": [step(agent_call("grandchild", "leafq", description="grand")),
                                        {"text": "nested"}]})
    make_spec(owner, "wide", {"user": [
        step(*(agent_call(f"w{n}", "leafq", description=f"w{n}") for n in range(8)),
             agent_call("nest", "nest", description="nest")),
        {"text": "ok"},
    ]})
    sid2 = open_session(api, "wide")
    root2 = turn(api, sid2, "fan out wide")
    assert api.wait(root2)["status"] == "succeeded"
    assert not any(r["is_error"] for r in tool_results(root2)), tool_results(root2)
    jobs = settle(api, sid2)
    assert len([j for j in jobs if j["kind"] == "spawn"]) == 10
    assert all(j["status"] == "succeeded" for j in jobs), jobs


# --- resource quotas (docs/contract.md#resource-quotas) ----------------------------------------


def test_queue_full_and_jobs_exhausted_are_distinct_and_counted_on_the_executing_session(
    team, api_as, worker
):
    owner = api_as(team.owner)
    set_limits(owner, max_queued_per_session=1, max_jobs_per_session=4)
    make_spec(owner, "slow", [{"sleep_ms": LONG_MS}, {"text": "slept"}])
    make_spec(owner, "fast", [{"text": "fast"}])
    api = api_as(team.member)
    sid = open_session(api, "fast")
    first = turn(api, sid, "long one", agent_id="slow")
    api.wait(first, {"running"})
    second = turn(api, sid, "waits")
    assert execution(api, second)["status"] == "queued"

    r = start_turn(api, sid, "one too many")
    assert r.status_code == 429, r.content
    assert r.json()["code"] == "quota.queue_full" and r.json()["retryable"] is True
    assert len(executions(api, sid)) == 2  # no job was made up for the refusal

    # the queued job starts: it leaves the queue and is not counted a second time
    assert cancel(api, first).status_code == 202
    done = api.wait(second)
    assert done["status"] == "succeeded" and done["started_at"] is not None
    third = turn(api, sid, "room again")
    assert api.wait(third)["status"] == "succeeded"
    fourth = turn(api, sid, "the last one")
    assert api.wait(fourth)["status"] == "succeeded"

    # cumulative: four admitted jobs, all terminal now, still use the quota up
    r = start_turn(api, sid, "fifth")
    assert r.status_code == 429, r.content
    assert r.json()["code"] == "quota.jobs_exhausted" and r.json()["retryable"] is False
    assert len(executions(api, sid)) == 4

    # foreground spawns are admitted too (the child runs in this session)
    main = address_of(execution(api, fourth))
    before = len(branches(api, sid))
    fg = tool(api, main, "agent", prompt="inline child", agent_id="fast")
    assert fg["is_error"] and fg["details"]["code"] == "quota.jobs_exhausted", fg
    assert len(branches(api, sid)) == before and len(executions(api, sid)) == 4

    # counted on the executing session: S → this session is refused; S itself is not charged
    other = open_session(api, "fast", title="other")
    s_first = turn(api, other, "hello")
    assert api.wait(s_first)["status"] == "succeeded"
    r = tool(api, address_of(execution(api, s_first)), "agent", to=main, prompt="a task for the full session")
    assert r["is_error"] and r["details"]["code"] == "quota.jobs_exhausted", r
    assert len(executions(api, sid)) == 4 and len(executions(api, other)) == 1
    assert api.wait(turn(api, other, "still fine"))["status"] == "succeeded"


def _flood(api_as, user, sid, n):
    """``n`` threads post a user turn at the same moment; returns their responses."""
    clients = [api_as(user) for _ in range(n)]
    barrier = threading.Barrier(n)
    answers = [None] * n

    def post(i):
        try:
            barrier.wait(10)
            r = start_turn(clients[i], sid, f"flood {i}")
            answers[i] = (r.status_code, r.json())
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads)
    return answers


def test_concurrent_admissions_never_exceed_the_quotas(team, api_as, worker):
    owner = api_as(team.owner)
    make_spec(owner, "slow", [{"sleep_ms": LONG_MS}, {"text": "slept"}])
    make_spec(owner, "fast", [{"text": "fast"}])
    api = api_as(team.member)

    # max_queued_per_session: the branch is busy, so everything admitted waits
    set_limits(owner, max_queued_per_session=3)
    sid = open_session(api, "fast")
    busy = turn(api, sid, "hold the branch", agent_id="slow")
    api.wait(busy, {"running"})
    answers = _flood(api_as, team.member, sid, 12)
    codes = sorted(code for code, _ in answers)
    assert codes == [202] * 3 + [429] * 9, answers
    assert {body["code"] for code, body in answers if code == 429} == {"quota.queue_full"}
    assert len(executions(api, sid, status="queued")) == 3 and len(executions(api, sid)) == 4

    # max_jobs_per_session: cumulative admissions from a standing start
    set_limits(owner, max_queued_per_session=None, max_jobs_per_session=5)
    sid2 = open_session(api, "fast")
    answers = _flood(api_as, team.member, sid2, 12)
    codes = sorted(code for code, _ in answers)
    assert codes == [202] * 5 + [429] * 7, answers
    assert {body["code"] for code, body in answers if code == 429} == {"quota.jobs_exhausted"}
    jobs = settle(api, sid2)
    assert len(jobs) == 5 and all(j["status"] == "succeeded" for j in jobs)


def test_max_live_per_session_runs_background_children_one_at_a_time(team, api_as, worker):
    owner = api_as(team.owner)
    set_limits(owner, max_live_per_session=1)
    make_spec(owner, "nap", [{"sleep_ms": 700}, {"text": "rested"}])
    make_spec(owner, "boss", {"user": [
        step(agent_call("first nap", "nap", description="one"), agent_call("second nap", "nap", description="two"),
             agent_call("third nap", "nap", description="three")),
        {"text": "dispatched"},
    ]})
    api = api_as(team.member)
    sid = open_session(api, "boss")
    root = turn(api, sid, "go")
    jobs = settle(api, sid)
    assert all(j["status"] == "succeeded" for j in jobs), jobs
    assert len([j for j in jobs if j["parent_job"] == root]) == 3
    # each child's result reaches the boss exactly once: as a follow-up turn when the
    # boss is idle, or drained into a follow-up already queued or running before its model call
    # — which of the two depends on which job the one live slot goes to first
    delivered = [m for m in transcript_messages(api, address_of(execution(api, root)))
                 if m["kind"] in ("followup", "agent_message")]
    assert len(delivered) == 3, delivered
    assert 1 <= len([j for j in jobs if j["kind"] == "followup"]) <= 3
    _assert_one_running_at_a_time(api, sid)

    # admissions with nothing running: through the gateway, three children at once, so two
    # workers try to claim at the same moment
    main = address_of(execution(api, root))
    for n in range(3):
        r = tool(api, main, "agent", prompt=f"nap {n}", agent_id="nap", description=f"gw{n}", run_in_background=True)
        assert not r["is_error"], r
    jobs = settle(api, sid)
    assert len([j for j in jobs if j["kind"] == "spawn"]) == 6 and all(j["status"] == "succeeded" for j in jobs)
    _assert_one_running_at_a_time(api, sid)


def _assert_one_running_at_a_time(api, sid):
    """The session's event log is in commit order (its seq is taken under the session row lock):
    between one job's "running" and its end no other job of the session may start. (Wall-clock
    started_at/finished_at are taken before lock waits, so they cannot show this.)"""
    running = None
    for kind, payload in event_types(api, sid):
        if kind == "job.running":
            assert running is None, f"{payload['job']} ({payload['kind']}) started while {running} was running"
            running = payload["job"]
        elif kind.removeprefix("job.") in TERMINAL and payload.get("job") == running:
            running = None
    assert running is None


def test_runtime_and_idle_limits_end_a_turn_as_failed(team, api_as, worker):
    owner = api_as(team.owner)
    make_spec(owner, "slow", [{"sleep_ms": UNENDING_MS}, {"text": "slept"}])
    api = api_as(team.member)
    sid = open_session(api, "slow")
    for field, code in (("max_runtime_seconds", "quota.runtime_exceeded"), ("max_idle_seconds", "quota.idle_exceeded")):
        set_limits(owner, **{"max_runtime_seconds": None, "max_idle_seconds": None, field: 1})
        # the limit, not the sleep running out, ended the turn: it failed with the limit's code
        # within WAIT while its model call could not end by itself
        done = api.wait(turn(api, sid, f"run into {field}"), timeout=WAIT)
        assert done["status"] == "failed" and done["error_code"] == code and done["is_error"], done
        assert field in done["error_reason"]


# --- bounded results and artifacts (docs/contract.md#results) -----------------------------------


BIG = "HEAD<" + "".join(f"{n:06d}." for n in range(8_000))[: 50_000 - 10] + ">TAIL"


def test_long_results_are_bounded_and_the_full_text_is_an_authorized_artifact(team, api_as, worker):
    from collab.models import Artifact

    assert len(BIG) == 50_000
    owner = api_as(team.owner)
    make_spec(owner, "big", [{"text": BIG}])
    make_spec(owner, "boss", {"user": [
        step(agent_call("write a lot", "big", description="big1"), agent_call("write a lot more", "big",
                                                                               description="big2")),
        step({"name": "job_output", "arguments": {"job_id": "{{last.details.execution_id}}", "timeout": 60_000}}),
        {"text": "read it"},
    ]})
    api = api_as(team.member)
    sid = open_session(api, "boss")
    root = turn(api, sid, "go")
    jobs = settle(api, sid)
    big = [j for j in jobs if j["parent_job"] == root]
    assert len(big) == 2 and all(j["status"] == "succeeded" for j in big), jobs

    artifact_ids = []
    for job in big:
        result = job["result"]
        assert len(result) <= 30_000
        assert result.startswith("HEAD<") and ">TAIL" in result and "characters omitted" in result
        match = re.search(r"artifact (\S+?),", result)
        assert match, result[-300:]
        artifact_ids.append(match.group(1))

    # the full text, to those who may read the execution only
    for user in (team.member, team.viewer, team.owner):
        r = api_as(user).get(f"/api/artifacts/{artifact_ids[0]}")
        assert r.status_code == 200, (user.username, r.content[:200])
        assert r.content.decode() == BIG
        assert r["X-Content-SHA256"] == hashlib.sha256(BIG.encode()).hexdigest()
    outsider = api_as(team.outsider)
    for aid in (artifact_ids[0], "no-such-artifact"):
        r = outsider.get(f"/api/artifacts/{aid}")
        assert r.status_code == 404 and r.json() == {"detail": "not found", "code": "not_found"}

    # job_output and the results returned to the caller are the same bounded summary
    (output,) = [r for r in tool_results(root) if r["tool"] == "job_output"]
    assert len(output["text"]) <= 30_000 and "characters omitted" in output["text"]
    notices = [m for m in transcript_messages(api, address_of(execution(api, root)))
               if m["kind"] in ("agent_message", "followup") and "finished execution" in m["text"]]
    assert len(notices) == 2, [m["text"][:200] for m in notices]
    for m in notices:
        header, _, body = m["text"].partition("\n\n")
        assert len(body) <= 30_000 and BIG not in m["text"] and "characters omitted" in body

    # retention follows the project's setting; cleanup removes only expired artifacts
    stored = Artifact.objects.get(pk=artifact_ids[0])
    assert abs((stored.expires_at - stored.created_at) - timedelta(days=30)) < timedelta(minutes=1)
    Artifact.objects.filter(pk=artifact_ids[0]).update(expires_at=timezone.now() - timedelta(seconds=1))
    out = io.StringIO()
    call_command("cleanup_artifacts", stdout=out)
    assert "deleted 1 " in out.getvalue()
    assert api.get(f"/api/artifacts/{artifact_ids[0]}").status_code == 404
    assert api.get(f"/api/artifacts/{artifact_ids[1]}").status_code == 200
    out = io.StringIO()
    call_command("cleanup_artifacts", stdout=out)
    assert "deleted 0 " in out.getvalue()


def test_a_failed_artifact_write_never_yields_a_reference(team, api_as, run_queued, monkeypatch):
    """The foreground gateway call runs its child in this process, where the write is made to fail."""
    import collab.services.artifacts as artifacts

    owner = api_as(team.owner)
    make_spec(owner, "big", [{"text": BIG}])
    make_spec(owner, "quick", [{"text": "hi"}])
    api = api_as(team.member)
    sid = open_session(api, "quick")
    first = turn(api, sid, "hello")
    assert api.wait(first)["status"] == "succeeded"

    class Broken:
        class objects:
            @staticmethod
            def create(**kwargs):
                raise DatabaseError("disk full")

    monkeypatch.setattr(artifacts, "Artifact", Broken)
    r = tool(api, address_of(execution(api, first)), "agent", prompt="write a lot", agent_id="big")
    assert not r["is_error"], r["text"][:300]
    job = execution(api, r["details"]["execution_id"])
    assert job["status"] == "succeeded" and len(job["result"]) <= 30_000
    assert "could not be stored" in job["result"]
    assert not re.search(r"artifact \S+,", job["result"])  # no reference to something that does not exist
    assert len(r["text"]) <= 30_000


# --- archive_when_done (docs/contract.md#agent) -----------------------------------------------


def test_archive_when_done_applies_to_background_and_foreground_runs(team, api_as, run_queued):
    owner = api_as(team.owner)
    make_spec(owner, "quick", [{"text": "finished"}])
    make_spec(owner, "boss", {"user": [
        step(agent_call("fg work", "quick", background=False, description="fg-arch", archive_when_done=True)),
        step(agent_call("bg work", "quick", description="bg-arch", archive_when_done=True)),
        step(agent_call("kept work", "quick", description="kept")),
        {"text": "ok"},
    ]})
    api = api_as(team.member)
    sid = open_session(api, "boss")
    root = turn(api, sid, "go")
    jobs = settle(api, sid)
    assert all(j["status"] == "succeeded" for j in jobs), jobs  # archiving never fails a finished run
    archived = {b["name"]: b for b in branches(api, sid, "archived")}
    assert set(archived) == {"fg-arch", "bg-arch"}
    for b in archived.values():
        assert b["archived"] and b["archived_at"] and b["archive_reason"] == "archive_when_done"
    assert {b["name"] for b in branches(api, sid)} == {"main", "kept"}
    # archived on completion first, then by hand: the first archived_at stays
    bg = archived["bg-arch"]
    r = api.post(f"/api/branches/{bg['address']}/archive", {"reason": "tidy up"})
    assert r.status_code == 200 and r.json()["archived_at"] == bg["archived_at"], r.content
    # with to=… the flag is an error (it only applies to a branch the call creates)
    kept = next(b for b in branches(api, sid) if b["name"] == "kept")
    r = tool(api, address_of(execution(api, root)), "agent", to=kept["address"], prompt="x", archive_when_done=True)
    assert r["is_error"] and r["details"]["code"] == "invalid_arguments"


def test_manual_archive_first_keeps_its_time_and_reason_and_never_cancels(team, api_as, worker):
    # the child runs until this test cancels it (never a timed period): the manual archive
    # certainly comes first, and the automatic one (archive_when_done) when the child ends
    owner = api_as(team.owner)
    make_spec(owner, "nap", [{"sleep_ms": UNENDING_MS}, {"text": "rested"}])
    make_spec(owner, "boss", {"user": [step(agent_call("nap", "nap", description="napper", archive_when_done=True)),
                                       {"text": "ok"}]})
    api = api_as(team.member)
    sid = open_session(api, "boss")
    root = turn(api, sid, "go")
    child = poll(lambda: next((j for j in executions(api, sid) if j["parent_job"] == root
                               and j["status"] == "running"), None), what="the child running")
    r = api.post(f"/api/branches/{address_of(child)}/archive", {"reason": "manual: enough"})
    assert r.status_code == 200, r.content
    first = r.json()
    assert first["archived"] and first["archive_reason"] == "manual: enough"
    assert execution(api, child["id"])["status"] == "running"  # archive never cancels
    assert cancel(api, child["id"]).status_code == 202  # the child ends: its automatic archive comes now
    assert api.wait(child["id"], timeout=WAIT)["status"] == "cancelled"
    settle(api, sid)
    (row,) = [b for b in branches(api, sid, "archived") if b["name"] == "napper"]
    assert row["archived_at"] == first["archived_at"] and row["archive_reason"] == "manual: enough"
    # a repeated manual archive is idempotent and keeps the first values too
    r = api.post(f"/api/branches/{address_of(child)}/archive", {"reason": "another reason"})
    assert r.status_code == 200
    assert r.json()["archived_at"] == first["archived_at"] and r.json()["archive_reason"] == "manual: enough"


def test_delivery_accepted_before_archive_but_not_started_fails_archived(team, api_as, worker):
    # the target stays busy until this test cancels its turn (never a timed busy period)
    api, ssid, sender, tsid, busy, target = sender_and_busy_target(team, api_as, UNENDING_MS)

    accepted = tool(api, sender, "agent", to=target, prompt="a task for later")
    assert not accepted["is_error"] and accepted["details"]["queued"] is True, accepted
    task = accepted["details"]["execution_id"]
    assert execution(api, task)["status"] == "queued"
    r = api.post(f"/api/branches/{target}/archive", {"reason": "retired"})
    assert r.status_code == 200, r.content
    refused = tool(api, sender, "agent", to=target, prompt="too late")
    assert refused["is_error"] and refused["details"]["code"] in ("archived", "not_found"), refused

    assert execution(api, busy)["status"] == "running"  # the archive did not cancel the running turn
    assert cancel(api, busy).status_code == 202  # the target's turn ends: the task may start now
    assert api.wait(busy, timeout=WAIT)["status"] == "cancelled"
    ended = api.wait(task)
    assert ended["status"] == "failed" and ended["error_code"] == "archived" and ended["is_error"]
    assert "archived" in ended["error_reason"]
    jobs = settle(api, ssid, tsid)
    # the refusal reaches the sender exactly once, as an error
    followups = [j for j in jobs if j["kind"] == "followup" and j["session"] == ssid]
    assert len(followups) == 1, jobs
    notices = [m for m in transcript_messages(api, sender)
               if m["role"] == "user" and f"did not finish execution {task}" in m["text"]]
    assert len(notices) == 1 and "failed" in notices[0]["text"] and "is_error=true" in notices[0]["text"]


# --- limits: API and command --------------------------------------------------------------------


def test_an_amount_that_rounds_to_nothing_or_past_the_bound_is_refused_not_stored(team, api_as):
    """max_cost_per_job is kept at 6 places: one that rounds to 0 (the CHECK cost > 0) or to
    1000000 (past numeric(12,6)) is the 400 of any bad amount, never a 500."""
    owner = api_as(team.owner)
    for value in ("0.0000001", 1e-7, "999999.9999999"):
        r = owner.patch("/api/projects/alpha/limits", {"max_cost_per_job": value})
        assert r.status_code == 400 and r.json()["code"] == "invalid_limit", (value, r.content)
    r = owner.patch("/api/projects/alpha/limits", {"max_cost_per_job": "0.0000015"})
    assert r.status_code == 200 and r.json()["max_cost_per_job"] == "0.000002", r.content


@pytest.mark.parametrize("field", ["max_spawn_depth", "max_live_per_session", "max_cost_per_job", "max_active_turns",
                                   "max_running_jobs", "max_runtime_seconds"])
def test_the_published_limit_schema_says_what_check_limits_accepts(field):
    """``PATCH /api/projects/{slug}/limits`` publishes each field as ``limit_schema``: a value it
    allows is accepted, one it refuses is refused (ceilings included)."""
    import jsonschema_rs

    from accounts.limits import LimitError, check_limits, limit_schema

    validator = jsonschema_rs.validator_for(limit_schema(field))
    cap = settings.TRELLIS_LIMIT_CEILINGS.get(field)
    for value in (0, 1, 2, 7, 2**31 - 1, 2**31, -1, 1.5, 3.0, None, "", "5", "0.5", "x", True, [1], 0.0000001,
                  999999.999999, 1000000, "999999.9999999", cap, (cap or 0) + 1):
        stated = validator.is_valid(value)
        try:
            check_limits({field: value})
            accepted = True
        except LimitError:
            accepted = False
        if stated:  # the schema never promises what the service refuses
            assert accepted, (field, value)


def test_owners_set_validated_limits_through_the_api_and_the_limits_command(team, api_as):
    owner = api_as(team.owner)
    r = owner.get("/api/projects/alpha/limits")
    assert r.status_code == 200
    limits = r.json()
    assert (limits["max_spawn_depth"], limits["max_messages"], limits["max_spawn_fanout"]) == (1, 8, 8)
    assert limits["max_queued_per_session"] is None and limits["max_jobs_per_session"] is None

    # settings belong to owners
    for user in (team.member, team.maintainer, team.viewer):
        r = api_as(user).patch("/api/projects/alpha/limits", {"max_messages": 2})
        assert r.status_code == 403, (user.username, r.content)
    outsider = api_as(team.outsider)
    assert outsider.get("/api/projects/alpha/limits").status_code == 404
    assert outsider.patch("/api/projects/alpha/limits", {"max_messages": 2}).status_code == 404
    assert owner.get("/api/projects/alpha/limits").json()["max_messages"] == 8

    # validation: one error naming the field; nothing changes
    for field, value in (("max_messages", -1), ("max_spawn_depth", -3), ("max_live_per_session", 0),
                         ("max_jobs_per_session", -5), ("max_spawn_fanout", None), ("max_queued_per_session", "x")):
        r = owner.patch("/api/projects/alpha/limits", {field: value})
        assert r.status_code == 400, (field, value, r.content)
        assert r.json()["code"] == "invalid_limit" and r.json()["field"] == field, r.json()
        assert field in r.json()["detail"]
    assert owner.get("/api/projects/alpha/limits").json() == limits
    assert owner.patch("/api/projects/alpha/limits", {"max_bananas": 1}).status_code == 422

    # 0 = unlimited for topology; null inherits for resources
    r = owner.patch("/api/projects/alpha/limits", {"max_spawn_fanout": 0, "max_queued_per_session": 5})
    assert r.status_code == 200 and r.json()["max_spawn_fanout"] == 0 and r.json()["max_queued_per_session"] == 5
    r = owner.patch("/api/projects/alpha/limits", {"max_queued_per_session": None})
    assert r.status_code == 200 and r.json()["max_queued_per_session"] is None
    assert r.json()["max_spawn_fanout"] == 0  # untouched fields stay

    out = io.StringIO()
    call_command("limits", "alpha", "max_messages=3", "max_jobs_per_session=7", stdout=out)
    assert "max_messages = 3" in out.getvalue() and "max_jobs_per_session = 7" in out.getvalue()
    current = owner.get("/api/projects/alpha/limits").json()
    assert current["max_messages"] == 3 and current["max_jobs_per_session"] == 7
    call_command("limits", "alpha", "max_jobs_per_session=null", stdout=io.StringIO())
    assert owner.get("/api/projects/alpha/limits").json()["max_jobs_per_session"] is None
    with pytest.raises(CommandError, match="max_messages"):
        call_command("limits", "alpha", "max_messages=-2", stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("limits", "nope", stdout=io.StringIO())
    assert owner.get("/api/projects/alpha/limits").json()["max_messages"] == 3
