"""Waiting without polling: ``POST /api/sessions/{sid}/turns?wait=S`` and
``GET /api/executions/{id}?wait=S`` (0–60 s) answer when the execution is terminal or the wait
ends, holding no thread and no database connection while they wait. Through a real daphne
process (the wake-up comes from the worker's events: channels-redis with REDIS_URL, the
embedded relay without), on PostgreSQL + Redis and on SQLite."""

import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connection

from tests.collab.test_web_never_stalls import http
from tests.conftest import poll

pytestmark = pytest.mark.slow


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _db_connections() -> int | None:
    """Connections to the test database other than this one (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def _group_size(sid: str) -> int | None:
    """Channels subscribed to the session's event group on Redis (None without Redis)."""
    if not settings.REDIS_URL:
        return None
    import redis

    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return client.zcard(f"{prefix}:group:session.{sid}")
    finally:
        client.close()


def _cancel(client, job_id: str):
    version = client.get(f"/api/executions/{job_id}").json()["version"]
    r = client.post(f"/api/executions/{job_id}/commands", json={
        "command_id": f"wait-{job_id}", "action": "execution.cancel", "expected_version": version, "payload": {}})
    assert r.status_code == 202, r.text


def test_post_turn_with_wait_answers_with_the_terminal_status(team, scripted_session, server, worker):
    """A quick scripted turn: the 202 carries ``succeeded``, ``waited`` and the execution with
    its result; the answer is in the session's transcript."""
    _, sid = scripted_session(team.member, [{"text": "the waited answer"}])
    with http(server, team.member) as client:
        r = client.post(f"/api/sessions/{sid}/turns?wait=30", json={"prompt": "hi"})
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["status"] == "succeeded" and body["waited"] is True, body
        assert body["execution"]["id"] == body["execution_id"] and body["execution"]["status"] == "succeeded"
        assert "the waited answer" in body["execution"]["result"], body
        head = client.get(f"/api/sessions/{sid}").json()["head"]
        transcript = client.get(f"/api/branches/{sid}:{head}/transcript")
        assert transcript.status_code == 200 and "the waited answer" in transcript.text, transcript.text

        # without ?wait= the answer is today's: at once, not waited
        r = client.post(f"/api/sessions/{sid}/turns", json={"prompt": "again"})
        assert r.status_code == 202 and r.json()["waited"] is False and r.json()["execution"] is None, r.text


def test_get_execution_with_wait_answers_when_a_slow_turn_ends(team, scripted_session, server, worker):
    _, sid = scripted_session(team.member, [{"sleep_ms": 1500}, {"text": "slow answer"}])
    with http(server, team.member) as client:
        job_id = client.post(f"/api/sessions/{sid}/turns", json={"prompt": "go"}).json()["execution_id"]
        assert client.get(f"/api/executions/{job_id}").json()["status"] in ("queued", "running")
        r = client.get(f"/api/executions/{job_id}?wait=30")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "succeeded" and r.json()["waited"] is True, r.json()
        assert "slow answer" in r.json()["result"]
        assert client.get(f"/api/executions/{job_id}").json()["waited"] is False


def test_a_wait_that_ends_first_answers_with_the_current_status(team, scripted_session, server):
    """No worker takes the 10-minute turn before the wait ends: the answer is the current status."""
    _, sid = scripted_session(team.member, [{"sleep_ms": 600_000}, {"text": "never"}])
    with http(server, team.member) as client:
        r = client.post(f"/api/sessions/{sid}/turns?wait=0.5", json={"prompt": "go"})
        assert r.status_code == 202, r.text
        assert r.json()["status"] in ("queued", "running") and r.json()["waited"] is True, r.json()
        job_id = r.json()["execution_id"]
        r = client.get(f"/api/executions/{job_id}?wait=0.3")
        assert r.status_code == 200 and r.json()["status"] in ("queued", "running"), r.text
        assert r.json()["waited"] is True
        _cancel(client, job_id)
        r = client.get(f"/api/executions/{job_id}?wait=30")
        assert r.json()["status"] == "cancelled", r.text


def test_bad_wait_values_are_refused_with_a_reason(team, scripted_session, server):
    _, sid = scripted_session(team.member, [{"text": "ok"}])
    with http(server, team.member) as client:
        job_id = client.post(f"/api/sessions/{sid}/turns", json={"prompt": "go"}).json()["execution_id"]
        for bad in ("-1", "61", "1e9", "nan", "inf", "soon", "1,5"):
            for method, path in (("GET", f"/api/executions/{job_id}?wait={bad}"),
                                 ("POST", f"/api/sessions/{sid}/turns?wait={bad}")):
                r = client.get(path) if method == "GET" else client.post(path, json={"prompt": "x"})
                assert r.status_code in (400, 422), (method, bad, r.status_code, r.text)
                assert r.json()["code"] in ("invalid_wait", "invalid_request") and "wait" in r.json()["detail"], r.text
        # a refused POST started no turn
        turns = [e for e in client.get(f"/api/sessions/{sid}/events").json()["events"] if e["type"] == "job.queued"]
        assert len(turns) == 1, turns
        # someone who may not see the execution learns nothing by waiting on it
        with http(server, team.outsider) as outsider:
            assert outsider.get(f"/api/executions/{job_id}?wait=1").status_code == 404


def test_many_waiting_clients_hold_no_thread_or_connection(team, scripted_session, server):
    """20 clients wait on an execution that does not end (no worker takes its 10-minute
    step): a plain GET answers while all of them are still waiting, the web process has not
    grown a thread per waiter, nor the database a connection per waiter; cancelling the
    execution wakes every one of them with ``cancelled``."""
    _, sid = scripted_session(team.member, [{"sleep_ms": 600_000}, {"text": "never"}])
    waiters = 20
    with http(server, team.member) as client, ThreadPoolExecutor(waiters + 1) as pool:
        job_id = client.post(f"/api/sessions/{sid}/turns", json={"prompt": "go"}).json()["execution_id"]
        assert client.get("/api/projects").status_code == 200
        threads_before, connections_before = _threads(server.pid), _db_connections()
        calls = [pool.submit(client.get, f"/api/executions/{job_id}?wait=60") for _ in range(waiters)]
        if settings.REDIS_URL:  # every waiter has subscribed: it is parked on the channel layer
            poll(lambda: _group_size(sid) >= waiters, timeout=30, what="the waiters to subscribe")

        read = pool.submit(client.get, f"/api/sessions/{sid}")
        assert read.result(timeout=30).status_code == 200
        assert not any(c.done() for c in calls), [c.result().text for c in calls if c.done()]
        # once parked (on SQLite there is no subscription to watch: wait for the condition)
        poll(lambda: _threads(server.pid) - threads_before < waiters, timeout=15,
             what=f"the waiters to give their threads back ({threads_before} before)")
        if connections_before is not None:
            poll(lambda: _db_connections() - connections_before < waiters, timeout=15,
                 what=f"the waiters to give their connections back ({connections_before} before)")
        assert not any(c.done() for c in calls)

        _cancel(client, job_id)
        for call in calls:
            r = call.result(timeout=30)
            assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["waited"], r.text


@pytest.mark.skipif(not settings.REDIS_URL, reason="group membership is a Redis layer's (the relay keeps none)")
def test_a_waiting_turn_leaves_the_session_group_whatever_its_answer(team, scripted_session, server, worker):
    """``POST …/turns?wait=`` listens on the session's group from before the turn exists (so it
    never reads the execution before it can have ended) and leaves the group after answering —
    a succeeded turn, a refused one (an outsider: 404; a viewer: 403) and an unknown session
    alike: no channel is left subscribed once the answers are in."""
    _, sid = scripted_session(team.member, [{"text": "done"}])
    missing = f"nosuch{uuid.uuid4().hex[:12]}"
    with http(server, team.member) as client:
        for _ in range(3):
            r = client.post(f"/api/sessions/{sid}/turns?wait=30", json={"prompt": "hi"})
            assert r.status_code == 202 and r.json()["status"] == "succeeded", r.text
    with http(server, team.outsider) as client:
        r = client.post(f"/api/sessions/{sid}/turns?wait=30", json={"prompt": "mine?"})
        assert r.status_code == 404, r.text
    with http(server, team.viewer) as client:
        r = client.post(f"/api/sessions/{sid}/turns?wait=30", json={"prompt": "may I?"})
        assert r.status_code == 403, r.text
        r = client.post(f"/api/sessions/{missing}/turns?wait=30", json={"prompt": "?"})
        assert r.status_code == 404, r.text
        r = client.post("/api/sessions/not%20a%20plain%20id/turns?wait=30", json={"prompt": "?"})
        assert r.status_code == 404, r.text
    poll(lambda: (_group_size(sid), _group_size(missing)) == (0, 0), timeout=15,
         what="every waiting turn to leave its session's group")


@pytest.mark.slow
def test_many_waits_ending_together_each_answer_at_their_bound(team, scripted_session, server):
    """Thirty-two ``?wait=2`` on an execution that does not end meanwhile (queued, or running a
    long scripted step if a worker takes it), all at once, six rounds against one daphne: every
    wait answers 200 with the open execution about two seconds after it was asked, none later
    than five. (With Redis, a wait that ended by
    cancelling its channel-layer read could lose the cancellation and never answer: about one
    round in two hung a request here.)"""
    import asyncio
    import time

    import httpx

    from accounts.models import ApiToken, TokenScope

    api, sid = scripted_session(team.member, [{"sleep_ms": 60_000}, {"text": "ok"}], agent_id="slow-waits")
    eid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "stays open"}).json()["execution_id"]
    raw = ApiToken.issue(team.member, name="waits", scopes=TokenScope.values)[1]

    async def round_of(n: int) -> list[tuple[int, float]]:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {raw}"},
                                     timeout=30, limits=httpx.Limits(max_connections=n)) as client:
            async def one():
                start = time.monotonic()
                r = await client.get(f"/api/executions/{eid}?wait=2")
                return r.status_code, time.monotonic() - start, r.json()["status"]
            return await asyncio.gather(*[one() for _ in range(n)])

    try:
        for _ in range(6):
            answers = asyncio.run(round_of(32))
            assert {code for code, _, _ in answers} == {200}, answers
            assert {status for _, _, status in answers} <= {"queued", "running"}, answers
            assert all(1.9 <= took <= 5 for _, took, _ in answers), sorted(took for _, took, _ in answers)
    finally:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {raw}"}, timeout=30) as client:
            _cancel(client, eid)
