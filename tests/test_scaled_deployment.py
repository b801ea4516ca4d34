"""The scaled deployment, run as it runs on many machines.

Two web processes and three workers, each started from its line in ``deploy/Procfile``, share
one PostgreSQL and one Redis (this run's test database, queue and channel prefix). Nothing but
the database and Redis connects them, exactly as on separate machines:

- a WebSocket client on web A sees, live and in order, the events of turns submitted over HTTP
  to web B and run by whichever worker took them;
- web A is killed (SIGKILL) mid-turn: the client reconnects to web B with ``?after=<last seq>``
  and gets exactly the rest of the log — no event lost, none twice;
- the worker running a turn is killed (SIGKILL, its whole process group): the surviving workers
  end that turn ``interrupted`` within lease + reconcile interval (docs/contract.md#crash-recovery) by themselves, and
  the next turn on the branch runs on a survivor;
- ``deploy/nginx.conf`` runs in front of both web processes: API calls and the WebSocket upgrade
  pass through it, and after web A died a client reconnecting through it reaches web B.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from tests.collab.test_live_events import WsClient, assert_contiguous, bearer
from tests.conftest import ROOT, _wait_for_output, free_port, poll

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not settings.REDIS_URL, reason="the scaled deployment is PostgreSQL + Redis"),
]

LEASE, RECONCILE = 3, 1
WAIT = 120.0  # generous for a loaded machine; never reached when things work


def procfile() -> dict[str, str]:
    lines = (ROOT / "deploy" / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


def start(name: str, env: dict, log: Path) -> subprocess.Popen:
    """One Procfile line, run by a shell as a process manager would, in its own process group."""
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", "exec " + procfile()[name]], env=env, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    return proc


def start_proxy(webs, tmp_path: Path) -> str:
    """deploy/nginx.conf with its upstream pointed at this test's web processes."""
    if not shutil.which("nginx"):
        if os.environ.get("TRELLIS_REQUIRE_SERVICES") == "1":
            raise AssertionError("nginx is not installed (.ci/run installs it)")
        pytest.skip("nginx is not installed")
    port = free_port()
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    upstream = "".join(f"server {web.url.removeprefix('http://')};\n" for web in webs)
    assert "server web:8000;" in conf and "listen 8080;" in conf
    conf = (conf.replace("server web:8000;", upstream).replace("listen 8080;", f"listen 127.0.0.1:{port};")
            .replace("/tmp/trellis-nginx.pid", str(tmp_path / "nginx.pid")))
    (tmp_path / "nginx.conf").write_text(conf)
    (tmp_path / "logs").mkdir()
    proxy = subprocess.Popen(["nginx", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"],
                             stdout=subprocess.DEVNULL, stderr=open(tmp_path / "nginx.log", "w"), start_new_session=True)
    proxy.url = f"http://127.0.0.1:{port}"
    proxy.log = tmp_path / "nginx.log"
    return proxy


def kill(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(15)


@pytest.fixture
def deployment(transactional_db, process_env, tmp_path):
    """Two `web` and three `worker` Procfile processes on their own queue, with a short lease."""
    queue = process_env["TRELLIS_QUEUE_NAME"] + "-scaled"
    env = dict(process_env, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", HOST="127.0.0.1",
               Q_CLUSTER_NAME=queue, TRELLIS_WORKERS="1",
               TRELLIS_LEASE_SECONDS=str(LEASE), TRELLIS_RECONCILE_SECONDS=str(RECONCILE))
    webs, workers = [], []
    try:
        for name in ("a", "b"):
            port = free_port()
            web = start("web", dict(env, PORT=str(port)), tmp_path / f"web-{name}.log")
            web.url = f"http://127.0.0.1:{port}"
            webs.append(web)
        for n in range(3):
            worker = start("worker", env, tmp_path / f"worker-{n}.log")
            workers.append(worker)
        for web in webs:
            poll(lambda: _ready(web), timeout=60, what=f"{web.url}/readyz")
        proxy = start_proxy(webs, tmp_path)
        webs.append(proxy)  # killed with the rest
        poll(lambda: _ready(proxy), timeout=30, what="the proxy")
        for worker in workers:
            _wait_for_output(worker.log, "running.", worker, 60)
        yield webs, workers  # every turn is admitted by web B, which enqueues on `queue`
    finally:
        for proc in webs + workers:
            kill(proc)


def _ready(web) -> bool:
    if web.poll() is not None:
        raise AssertionError(f"web process exited:\n{web.log.read_text()[-3000:]}")
    try:
        with urllib.request.urlopen(web.url + "/readyz", timeout=5) as r:
            return json.load(r)["ok"]
    except (OSError, urllib.error.HTTPError):
        return False


class Http:
    """An API client over real HTTP to one web process."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")


def test_scaled_deployment_two_webs_three_workers(team, api_as, deployment):
    """Events reach every web process; a dead worker's turn is ended by the others."""
    from collab.models import Job

    (web_a, web_b, proxy), workers = deployment
    owner = api_as(team.owner)
    r = owner.post("/api/projects/alpha/agent-specs", {"agent_id": "steady", "provider": "scripted",
                                                       "script": [{"sleep_ms": 1500}, {"text": "done: {{prompt}}"}]})
    assert r.status_code == 201, r.content
    r = owner.post("/api/projects/alpha/agent-specs", {"agent_id": "stuck", "provider": "scripted",
                                                       "script": [{"sleep_ms": 600_000}, {"text": "never"}]})
    assert r.status_code == 201, r.content
    header = bearer(team.member)[1].decode()
    b = Http(web_b.url, header.removeprefix("Bearer "))
    status, session = b.call("POST", "/api/projects/alpha/sessions", {"title": "scaled", "agent_id": "steady"})
    assert status == 201, session
    sid = session["id"]

    async def through_a_then_b():
        client = await WsClient.connect(web_a.url.replace("http", "ws", 1) + f"/ws/sessions/{sid}/?after=0",
                                        {"Authorization": header}, web_a.url)
        try:
            status, first = b.call("POST", f"/api/sessions/{sid}/turns", {"prompt": "one"})
            assert status == 202, first
            frames = await client.frames_until("job.succeeded")
            status, second = b.call("POST", f"/api/sessions/{sid}/turns", {"prompt": "two"})
            assert status == 202, second
            frames += await client.frames_until("job.running")
        finally:
            client.writer.transport.abort()
        kill(web_a)  # web A dies mid-turn; the client goes to B for the rest
        again = await WsClient.connect(web_b.url.replace("http", "ws", 1) + f"/ws/sessions/{sid}/?after={frames[-1]['seq']}",
                                       {"Authorization": header}, web_b.url)
        try:
            frames += await again.frames_until("job.succeeded")
        finally:
            await again.close()
        status, third = b.call("POST", f"/api/sessions/{sid}/turns", {"prompt": "three"})
        assert status == 202, third
        # Through the proxy: web A is dead, so the upgrade reaches B, from where the client left off.
        via_proxy = await WsClient.connect(proxy.url.replace("http", "ws", 1) + f"/ws/sessions/{sid}/?after={frames[-1]['seq']}",
                                           {"Authorization": header}, proxy.url)
        try:
            frames += await via_proxy.frames_until("job.succeeded")
        finally:
            await via_proxy.close()
        return first["execution_id"], second["execution_id"], frames

    first, second, frames = async_to_sync(through_a_then_b)()
    assert_contiguous(frames, 1)
    status, log = b.call("GET", f"/api/sessions/{sid}/events?after=0")
    assert status == 200
    assert frames == log["events"][:len(frames)]
    answers = [f["payload"]["text"] for f in frames if f["type"] == "message.created" and f["payload"]["role"] == "assistant"]
    assert answers == ["done: one", "done: two", "done: three"]
    through_proxy = Http(proxy.url, b.token)
    status, listed = through_proxy.call("GET", f"/api/sessions/{sid}/events?after={frames[-1]['seq'] - 1}")
    assert status == 200 and [e["seq"] for e in listed["events"]] == [frames[-1]["seq"]]
    for eid in (first, second):
        assert Job.objects.get(pk=eid).worker, "a worker claimed the job"

    # A worker dies mid-turn: the other two end its turn, then run the next one.
    status, stuck = b.call("POST", "/api/projects/alpha/sessions", {"title": "stuck", "agent_id": "stuck"})
    assert status == 201, stuck
    status, doomed_turn = b.call("POST", f"/api/sessions/{stuck['id']}/turns", {"prompt": "hang"})
    assert status == 202, doomed_turn
    eid = doomed_turn["execution_id"]
    poll(lambda: Job.objects.get(pk=eid).status == "running", timeout=WAIT, what="the stuck turn running")
    pid = int(Job.objects.get(pk=eid).worker.rpartition(":")[2])
    doomed = next(w for w in workers if os.getpgid(pid) == w.pid)
    kill(doomed)
    ended = poll(lambda: (lambda j: j if j.status not in ("queued", "running", "stopping") else None)(
        Job.objects.get(pk=eid)), timeout=WAIT, interval=0.2, what="the dead worker's turn to end")
    assert ended.status == "interrupted", (ended.status, ended.error_code)

    status, after = b.call("POST", f"/api/sessions/{sid}/turns", {"prompt": "four"})
    assert status == 202, after
    done = poll(lambda: (lambda j: j if j.status == "succeeded" else None)(Job.objects.get(pk=after["execution_id"])),
                timeout=WAIT, interval=0.2, what="a turn after the worker's death")
    survivor_pid = int(done.worker.rpartition(":")[2])
    assert os.getpgid(survivor_pid) in {w.pid for w in workers if w is not doomed}
