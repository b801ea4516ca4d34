"""No agent turn runs in a web process (docs/capacity.md, "No agent turn runs in a web process").

A foreground ``agent`` call made through the REST tool gateway or MCP is admitted as a job like
any other: a worker process runs it, within the project's running cap, and the web side waits
for it holding no thread. Its answer is still the child's final reply, given once: no follow-up
turn carries it to the caller again. Everything here runs against a real daphne process and a
real django-q2 worker on the test database."""

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from collab.models import Job
from tests.collab.test_mcp import head_address, over_mcp, rest, token

pytestmark = pytest.mark.slow

SCRIPT = {"user": [{"text": "ready"}], "spawn": [{"text": "child says: {{prompt}}"}], "followup": [{"text": "noted"}]}


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or one of its descendants (read from /proc)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])  # field 4: the parent's pid
        except FileNotFoundError:
            return False
    return False


def ran_on(job: Job, worker, server) -> None:
    """The job row names a worker process of the qcluster, not the web process."""
    host, pid = job.worker.rsplit(":", 1)
    assert host == socket.gethostname(), job.worker
    assert int(pid) != server.pid and descends_from(int(pid), worker.pid), (job.worker, worker.pid, server.pid)


def ready_address(api, sid) -> str:
    address, first = head_address(api, sid)
    assert api.wait(first)["status"] == "succeeded"
    return address


def test_a_foreground_agent_through_the_gateway_runs_on_a_worker_and_answers_once(team, scripted_session, server, worker):
    """The REST gateway's foreground ``agent`` answers with the child's final reply; the child's
    row names the worker process that ran it (not daphne), marks it as answering the call, and
    no follow-up turn delivers the same result to the caller a second time."""
    api, sid = scripted_session(team.member, SCRIPT)
    address = ready_address(api, sid)
    raw = token(team.member)

    status, body = rest(server, raw, "POST", f"/api/branches/{address}/tools/agent",
                        {"arguments": {"prompt": "count the files", "description": "scout"}})
    assert status == 200 and body["is_error"] is False, body
    assert body["text"] == "child says: count the files", body
    child = Job.objects.get(pk=body["details"]["execution_id"])
    assert (child.status, child.answers_call, child.followup_state) == ("succeeded", True, "none")
    ran_on(child, worker, server)
    time.sleep(1)  # a follow-up, were one owed, is admitted when the child ends: give it the time
    assert not Job.objects.filter(session_id=sid, kind="followup").exists()
    assert list(Job.objects.filter(session_id=sid).order_by("created_at").values_list("kind", flat=True)) == ["user", "spawn"]


def test_a_foreground_agent_over_mcp_runs_on_a_worker(team, scripted_session, server, worker):
    """The same call through the MCP server: the child's reply is the tool's content, and the
    row names the worker process."""
    api, sid = scripted_session(team.member, SCRIPT)
    address = ready_address(api, sid)

    async def work(session):
        return await session.call_tool("agent", {"prompt": "read the logs", "description": "reader"})

    answer = over_mcp(server, token(team.member), address, work)
    assert not answer.isError, answer
    assert answer.content[0].text == "child says: read the logs"
    child = Job.objects.get(pk=answer.structuredContent["execution_id"])
    assert (child.status, child.answers_call) == ("succeeded", True)
    ran_on(child, worker, server)


def test_foreground_agents_through_the_gateway_wait_for_the_projects_running_cap(team, scripted_session, api_as, server, worker):
    """Four concurrent foreground calls in a project capped at one running job: their children
    never run two at once (each call waits queued for the slot, as any job does), and all four
    calls answer with their own child's reply."""
    assert api_as(team.owner).patch("/api/projects/alpha/limits", {"max_running_jobs": 1}).status_code == 200
    script = {**SCRIPT, "spawn": [{"sleep_ms": 700}, {"text": "child says: {{prompt}}"}]}
    addresses = []
    for n in range(4):
        api, sid = scripted_session(team.member, script, agent_id=f"bot{n}")
        addresses.append(ready_address(api, sid))
    raw = token(team.member)
    seen_running: list[int] = []

    def call(n: int):
        return rest(server, raw, "POST", f"/api/branches/{addresses[n]}/tools/agent",
                    {"arguments": {"prompt": f"task {n}", "description": f"helper {n}"}})

    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(call, n) for n in range(4)]
        while not all(c.done() for c in calls):
            seen_running.append(Job.objects.filter(project=team.alpha, kind="spawn", status="running").count())
            time.sleep(0.02)
        answers = [c.result() for c in calls]

    for n, (status, body) in enumerate(answers):
        assert status == 200 and body["is_error"] is False, body
        assert body["text"] == f"child says: task {n}", body
    assert max(seen_running) == 1, seen_running  # one at a time, and they did run while we looked
    children = Job.objects.filter(project=team.alpha, kind="spawn")
    assert sorted(children.values_list("status", flat=True)) == ["succeeded"] * 4
    for child in children:
        ran_on(child, worker, server)


def test_a_foreground_agent_past_the_users_open_waits_is_refused_with_nothing_started(team, scripted_session, server):
    """The web side's wait for a foreground child is one of the person's open waits: with the
    bound (``TRELLIS_MAX_OPEN_STREAMS_PER_USER``, 32) taken by ``?wait=`` reads on a job that does
    not end, a foreground ``agent`` call is refused 429 ``too_many_open_waits`` and no child is
    admitted."""
    bound = 32
    assert os.environ.get("TRELLIS_MAX_OPEN_STREAMS_PER_USER") in (None, str(bound))  # daphne's bound too
    api, sid = scripted_session(team.member, [{"sleep_ms": 600_000}, {"text": "ok"}])
    address, job_id = head_address(api, sid)
    raw = token(team.member)

    with ThreadPoolExecutor(bound) as pool:
        waits = [pool.submit(rest, server, raw, "GET", f"/api/executions/{job_id}?wait=60") for _ in range(bound)]
        time.sleep(1.5)  # the reads are parked
        assert not any(w.done() for w in waits), [w.result() for w in waits if w.done()]
        status, body = rest(server, raw, "POST", f"/api/branches/{address}/tools/agent",
                            {"arguments": {"prompt": "one more", "description": "extra"}})
        assert (status, body.get("code")) == (429, "too_many_open_waits"), body
        assert not Job.objects.filter(session_id=sid, kind="spawn").exists()

        version = api.get(f"/api/executions/{job_id}").json()["version"]
        r = api.post(f"/api/executions/{job_id}/commands", {"command_id": "end-reads", "action": "execution.cancel",
                                                             "expected_version": version, "payload": {}})
        assert r.status_code == 202, r.content
        assert all(w.result()[0] == 200 for w in waits)

