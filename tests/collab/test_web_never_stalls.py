"""No request can stall the web process (docs/contract.md#http-api). On a real daphne process:
a pathological ``grep`` pattern answers and a plain read goes on meanwhile; 50 concurrent
blocking gateway calls are bounded per user (the excess 429 with a code) and a plain read
answers while the admitted ones wait; a socket's huge ``?after=`` silences no one. In process:
every unbounded parameter is clamped or refused with 4xx, never 500. (Latency figures:
``bench/stall.py``.)"""

import io
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection

from accounts.models import ApiToken
from tests.collab.test_live_events import WsClient, auth_header, run, write_events, ws_url
from tests.conftest import poll

PATHOLOGICAL = r"(\w+\s?)*$"


def head_address(api, sid) -> str:
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"})
    assert r.status_code == 202, r.content
    return f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}", r.json()["execution_id"]


class Answer:
    def __init__(self, status_code: int, body: bytes, headers=None):
        self.status_code, self.text = status_code, body.decode(errors="replace")
        self.headers = dict(headers or {})

    def json(self):
        return json.loads(self.text)


class Http:
    """A bearer-token JSON client for the real daphne process (stdlib only; one request per call,
    safe to use from many threads)."""

    def __init__(self, server, user):
        _, raw = ApiToken.issue(user, name="stall-test")
        self.base, self.token = server.url, raw

    def _send(self, method: str, path: str, body=None) -> Answer:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return Answer(response.status, response.read(), response.headers)
        except urllib.error.HTTPError as error:
            return Answer(error.code, error.read(), error.headers)

    def get(self, path: str) -> Answer:
        return self._send("GET", path)

    def post(self, path: str, json=None) -> Answer:
        return self._send("POST", path, json if json is not None else {})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def http(server, user) -> Http:
    return Http(server, user)


@pytest.fixture
def openwork_root(team, scripted_session, tmp_path):
    """An OpenWork root branch (member's) in a project whose workspace holds one long line that
    makes a backtracking engine take forever on ``PATHOLOGICAL``."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "long.txt").write_text("word " * 5000 + "!\n")
    call_command("workspace", "alpha", str(workspace), stdout=io.StringIO())
    api, sid = scripted_session(team.member, [], agent_id="ow", toolset="openwork")
    address, _ = head_address(api, sid)
    return api, address


def test_grep_refuses_what_re2_cannot_match_in_linear_time(openwork_root):
    """Backreferences and lookaround are refused with a code; there is no fallback to ``re``."""
    api, address = openwork_root
    for pattern in (r"(wo)rd \1", r"word(?= )", r"(?<=w)ord"):
        body = api.post(f"/api/branches/{address}/tools/grep", {"arguments": {"pattern": pattern}}).json()
        assert body["is_error"] and body["details"]["code"] == "invalid_pattern", (pattern, body)
        assert "RE2" in body["text"]
    body = api.post(f"/api/branches/{address}/tools/grep", {"arguments": {"pattern": "WORD !", "ignore_case": True}}).json()
    assert body["text"].startswith("long.txt:1: word word"), body


@pytest.mark.slow
def test_a_pathological_grep_answers_and_a_plain_read_completes_meanwhile(team, openwork_root, server):
    _, address = openwork_root
    with http(server, team.member) as client, ThreadPoolExecutor(2) as pool:
        grep = pool.submit(client.post, f"/api/branches/{address}/tools/grep",
                           json={"arguments": {"pattern": PATHOLOGICAL}})
        read = pool.submit(client.get, "/api/projects")
        assert read.result().status_code == 200
        answer = grep.result()
    assert answer.status_code == 200, answer.text
    assert not answer.json()["is_error"] and answer.json()["text"].startswith("long.txt:1: word"), answer.json()


@pytest.mark.slow
def test_blocking_gateway_calls_are_bounded_per_user_and_reads_go_on(team, scripted_session, server):
    """50 concurrent ``job_output(block=true)`` calls on a job that does not finish (no worker):
    the user's bound (TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER, 4 by default) are admitted and wait,
    the other 46 get 429 ``too_many_blocking_calls`` at once; while the 4 wait, plain API reads
    answer — on the same web process. Cancelling the job releases them with its result."""
    # a long sleep step: the job does not finish whether or not a worker (left running by an
    # earlier test) picks it up; only the cancel below ends it
    api, sid = scripted_session(team.member, [{"sleep_ms": 600_000}, {"text": "ok"}])
    address, job_id = head_address(api, sid)
    arguments = {"job_id": job_id, "block": True, "timeout": 600_000}

    with http(server, team.member) as client, ThreadPoolExecutor(50) as pool:
        calls = [pool.submit(client.post, f"/api/branches/{address}/tools/job_output", json={"arguments": arguments})
                 for _ in range(50)]
        refused = poll(lambda: [c for c in calls if c.done()] if sum(c.done() for c in calls) >= 46 else None,
                       timeout=60, what="the calls past the bound to be refused")
        assert len(refused) == 46
        for call in refused:
            r = call.result()
            assert r.status_code == 429 and r.json()["code"] == "too_many_blocking_calls", r.text
        waiting = [c for c in calls if not c.done()]

        for path in ("/api/projects", f"/api/sessions/{sid}", f"/api/executions/{job_id}"):
            assert client.get(path).status_code == 200
        assert len(waiting) == 4 and not any(c.done() for c in waiting)  # the reads did not wait for them

        # another person is not held back by this one's bound
        with http(server, team.owner) as other:
            r = other.post(f"/api/branches/{address}/tools/job_output", json={"arguments": {**arguments, "block": False}})
            assert r.status_code == 200 and r.json()["details"]["status"] in ("queued", "running"), r.text

        version = client.get(f"/api/executions/{job_id}").json()["version"]
        r = client.post(f"/api/executions/{job_id}/commands", json={
            "command_id": f"stall-{job_id}", "action": "execution.cancel", "expected_version": version, "payload": {}})
        assert r.status_code == 202, r.text
        for call in waiting:
            r = call.result()
            assert r.status_code == 200 and r.json()["details"]["status"] == "cancelled", r.text


@pytest.mark.slow
def test_a_socket_with_a_huge_after_silences_no_one(team, scripted_session, server):
    """A viewer's socket asking for events after 10^12 is served from the log's end: it and every
    other socket on the session in that web process receive the next events live."""
    _, sid = scripted_session(team.member, [{"text": "ok"}])
    origin = server.url

    def write_two_events():  # in a thread of its own, as another process would; its connection closed after
        try:
            return write_events(sid, 2, "test.note")
        finally:
            connection.close()

    viewer, member = auth_header(team.viewer), auth_header(team.member)

    async def body():
        greedy = await WsClient.connect(ws_url(server, sid, 10**12), viewer, origin)
        plain = await WsClient.connect(ws_url(server, sid, 0), member, origin)
        try:
            assert (await plain.recv())["type"] == "session.created"
            seqs = await sync_to_async(write_two_events, thread_sensitive=False)()
            got_plain = await plain.frames_until("test.note")
            got_plain += [await plain.recv()]
            got_greedy = [await greedy.recv(), await greedy.recv()]
        finally:
            await greedy.close()
            await plain.close()
        return seqs, got_plain, got_greedy

    seqs, got_plain, got_greedy = run(body)
    assert [f["seq"] for f in got_plain[-2:]] == seqs
    assert [f["seq"] for f in got_greedy] == seqs


def test_unbounded_parameters_are_clamped_or_refused_never_500(team, scripted_session):
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address, job_id = head_address(api, sid)
    huge = 10**30

    for path, params in [
        (f"/api/sessions/{sid}/events", {"after": huge}),
        (f"/api/sessions/{sid}/events", {"after": -5, "limit": huge}),
        (f"/api/branches/{address}/transcript", {"max_chars": huge}),
        (f"/api/branches/{address}/transcript", {"max_chars": -1, "start_turn": -huge, "end_turn": huge}),
        ("/api/executions", {"session": sid, "limit": huge}),
        (f"/api/sessions/{sid}/branches", {"limit": huge}),
        (f"/api/sessions/{sid}/holds", {"limit": -huge}),
    ]:
        r = api.get(path, **params)
        assert r.status_code == 200, (path, params, r.status_code, r.content[:300])
    assert api.get(f"/api/sessions/{sid}/events", after=huge).json() == {"events": []}
    assert len(api.get(f"/api/sessions/{sid}/events", after=0, limit=huge).json()["events"]) >= 3

    for path in (f"/api/holds/{huge}/approve",):
        r = api.post(path)
        assert r.status_code == 404 and r.json()["code"] == "not_found"

    for tool, arguments in [
        ("read_conversation", {"session_id": address, "max_chars": huge}),
        ("job_output", {"job_id": job_id, "timeout": huge}),
        ("list_agents", {"limit": huge}),
        ("list_jobs", {"limit": huge}),
    ]:
        body = api.post(f"/api/branches/{address}/tools/{tool}", {"arguments": arguments}).json()
        assert body["is_error"] and body["details"]["code"] == "invalid_arguments", (tool, body)

