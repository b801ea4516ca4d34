"""Streaming runs over plain HTTP: ``GET /api/executions/{id}/stream``.

Server-Sent Events through a real daphne process, with a real worker running the turn: the
execution's events (status changes, the messages it wrote: tool call, tool result, the final
answer) as ``id: <seq>`` / ``event: <type>`` / ``data: <wire>`` frames in ``seq`` order, exactly
the execution's events in the log, then ``event: end``; resumable with ``Last-Event-ID`` (or
``?after=``); the API's authentication, token scopes and authorization. On the embedded default
the live part comes through the database relay, with ``REDIS_URL`` through channels-redis.
"""

import asyncio
import http.client
import json
import time
from urllib.parse import urlparse

import pytest

TIMEOUT = 30.0


def token_of(user, scopes=None) -> str:
    from accounts.models import ApiToken, TokenScope

    _, raw = ApiToken.issue(user, name="sse-test", scopes=scopes or TokenScope.values)
    return raw


class Stream:
    """One SSE response read incrementally off the socket."""

    def __init__(self, server, path: str, token: str | None, last_event_id: str | None = None, cookie: str | None = None):
        url = urlparse(server.url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=TIMEOUT)
        headers = {"Accept": "text/event-stream"}
        if cookie:
            headers["Cookie"] = cookie
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self.conn.request("GET", path, headers=headers)
        self.response = self.conn.getresponse()
        self.comments: list[str] = []

    @property
    def status(self) -> int:
        return self.response.status

    def json(self) -> dict:
        return json.loads(self.response.read())

    def next_frame(self) -> dict | None:
        """The next event frame ({"id", "event", "data"}), or None when the server closed."""
        frame: dict = {}
        while True:
            line = self.response.readline()
            if not line:
                return None
            line = line.decode().rstrip("\n")
            if line == "":
                if frame:
                    return frame
                continue
            if line.startswith(":"):
                self.comments.append(line)
                continue
            field, _, value = line.partition(": ")
            assert field in ("id", "event", "data") and field not in frame, line
            frame[field] = value

    def frames_until_end(self) -> list[dict]:
        frames = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            frame = self.next_frame()
            assert frame is not None, f"the stream closed without 'end' after {frames}"
            frames.append(frame)
            if frame["event"] == "end":
                assert self.next_frame() is None, "the stream goes on after 'end'"
                return frames
        raise AssertionError(f"no 'end' within {TIMEOUT}s: {frames}")

    def close(self):
        self.conn.close()


def events_of(frames: list[dict]) -> list[dict]:
    """The wires of the event frames (not 'end'), checking each frame's id and type against its data."""
    wires = []
    for f in frames[:-1]:
        wire = json.loads(f["data"])
        assert f["id"] == str(wire["seq"]) and f["event"] == wire["type"], f
        wires.append(wire)
    return wires


def job_log(api, sid, execution_id) -> list[dict]:
    r = api.get(f"/api/sessions/{sid}/events")
    assert r.status_code == 200, r.content
    return [e for e in r.json()["events"] if e["payload"].get("job") == execution_id]


@pytest.mark.slow
def test_a_turn_streams_live_in_seq_order_then_end_and_resumes(team, scripted_session, server, worker):
    """A scripted turn (a tool call, then a slow answer) streams its status
    changes, its tool call and tool result, its answer and ``job.succeeded``, then ``end``, in
    seq order — exactly the execution's events in the log, no gaps, no repeats — and the stream
    was open (the job not finished) before the answer existed: the tail came live. A stream
    resumed with ``Last-Event-ID`` (or ``?after=``) gets exactly the rest; a bad one is a 400."""
    api, sid = scripted_session(team.member, [
        {"tool_calls": [{"name": "list_agents", "arguments": {}}]},
        {"sleep_ms": 3000},
        {"text": "echo: {{prompt}}"},
    ])
    token = token_of(team.member)
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"})
    assert r.status_code == 202, r.content
    execution_id = r.json()["execution_id"]

    stream = Stream(server, f"/api/executions/{execution_id}/stream", token)
    try:
        assert stream.status == 200
        assert stream.response.getheader("Content-Type").startswith("text/event-stream")
        assert stream.response.getheader("Cache-Control") == "no-cache"
        assert stream.response.getheader("X-Accel-Buffering") == "no"
        status_at_open = api.get(f"/api/executions/{execution_id}").json()["status"]
        frames = []
        while not frames or json.loads(frames[-1]["data"])["payload"].get("role") != "tool":
            frame = stream.next_frame()
            assert frame is not None and frame["event"] != "end", frames
            frames.append(frame)
        # the tool result came while the job still sat in its 3 s model call: frames are
        # delivered as they happen, not when the response ends
        status_at_tool_result = api.get(f"/api/executions/{execution_id}").json()["status"]
        frames += stream.frames_until_end()
    finally:
        stream.close()
    # live through the channel layer / relay, not the heartbeat's safety-net read (15 s)
    assert stream.comments == []
    assert status_at_open in ("queued", "running"), "the job ended before the stream opened: nothing came live"
    assert status_at_tool_result == "running"

    wires = events_of(frames)
    assert wires == job_log(api, sid, execution_id)  # exactly the execution's events, in seq order
    seqs = [w["seq"] for w in wires]
    assert seqs == sorted(set(seqs))
    types = [w["type"] for w in wires]
    assert types[:2] == ["message.created", "job.queued"] and types[-1] == "job.succeeded", types
    assert "job.running" in types
    messages = [w["payload"] for w in wires if w["type"] == "message.created"]
    assert messages[0]["role"] == "user" and messages[0]["text"] == "hi"  # the turn's prompt
    assert [m["tool_calls"][0]["name"] for m in messages if m.get("tool_calls")] == ["list_agents"]
    assert any(m["role"] == "tool" for m in messages)
    assert messages[-1]["role"] == "assistant" and messages[-1]["text"] == "echo: hi"
    assert frames[-1]["event"] == "end" and "id" not in frames[-1]
    assert json.loads(frames[-1]["data"]) == {"execution_id": execution_id, "status": "succeeded"}

    # resumed after job.running: exactly the rest, whether by Last-Event-ID or ?after=
    cut = types.index("job.running")
    resumed = Stream(server, f"/api/executions/{execution_id}/stream", token, last_event_id=str(seqs[cut]))
    try:
        assert resumed.status == 200
        rest = resumed.frames_until_end()
    finally:
        resumed.close()
    assert events_of(rest) == wires[cut + 1:] and rest[-1] == frames[-1]

    by_query = Stream(server, f"/api/executions/{execution_id}/stream?after={seqs[-2]}", token)
    try:
        assert events_of(by_query.frames_until_end()) == wires[-1:]
    finally:
        by_query.close()

    # after the terminal event: nothing left but 'end'
    done = Stream(server, f"/api/executions/{execution_id}/stream", token, last_event_id=str(seqs[-1]))
    try:
        assert done.frames_until_end() == frames[-1:]
    finally:
        done.close()

    for bad in ("abc", "-1", "1.5"):
        refused = Stream(server, f"/api/executions/{execution_id}/stream", token, last_event_id=bad)
        try:
            assert refused.status == 400, bad
            assert refused.json()["code"] == "invalid_last_event_id"
        finally:
            refused.close()


@pytest.mark.slow
def test_stream_has_the_apis_auth_scopes_and_authorization(team, scripted_session, server):
    """An outsider's stream of a job they may not see is a 404
    identical to a missing id's; a token without the ``read`` scope gets the API's 403
    (``token_scope``); no credentials is a 401; a browser's session cookie opens it (GET: no
    CSRF token), for the member, not for the outsider."""
    from django.conf import settings
    from django.test import Client

    from accounts.models import TokenScope

    api, sid = scripted_session(team.member, [{"text": "ok"}])
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"})
    assert r.status_code == 202, r.content
    execution_id = r.json()["execution_id"]

    def answer(path, token):
        s = Stream(server, path, token)
        try:
            return s.status, s.json()
        finally:
            s.close()

    outsider = answer(f"/api/executions/{execution_id}/stream", token_of(team.outsider))
    missing = answer("/api/executions/j_doesnotexist/stream", token_of(team.outsider))
    assert outsider == missing and outsider[0] == 404

    status, body = answer(f"/api/executions/{execution_id}/stream", token_of(team.member, [TokenScope.WRITE]))
    assert status == 403 and body["code"] == "token_scope"
    api_status = api.get(f"/api/executions/{execution_id}").status_code  # the API agrees with the stream
    assert api_status == 200

    status, body = answer(f"/api/executions/{execution_id}/stream", None)
    assert status == 401 and body["code"] == "unauthenticated"

    def cookie_of(user) -> str:
        browser = Client()
        browser.force_login(user)
        return f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"

    s = Stream(server, f"/api/executions/{execution_id}/stream", None, cookie=cookie_of(team.member))
    try:
        assert s.status == 200
        first = s.next_frame()
        assert first["event"] == "message.created" and json.loads(first["data"])["payload"]["text"] == "hi"
    finally:
        s.close()
    s = Stream(server, f"/api/executions/{execution_id}/stream", None, cookie=cookie_of(team.outsider))
    try:
        assert (s.status, s.json()) == missing
    finally:
        s.close()


@pytest.mark.slow
def test_keep_alive_and_a_revoked_token_ends_the_stream(team, scripted_session, worker, monkeypatch):
    """The stream body itself (the async iterator daphne drains), heartbeat
    shortened: while the job sits in a long model call, a ``: keep-alive`` comment each
    heartbeat; once the token it was opened with is revoked, the next heartbeat ends the stream (no
    ``end``: the execution has not ended)."""
    from asgiref.sync import async_to_sync, sync_to_async
    from django.utils import timezone

    from accounts.models import ApiToken
    from collab import streams
    from collab.models import Job

    api, sid = scripted_session(team.member, [{"sleep_ms": 30000}, {"text": "late"}])
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"})
    assert r.status_code == 202, r.content
    job = Job.objects.get(pk=r.json()["execution_id"])
    token, _ = ApiToken.issue(team.member, name="sse-test")
    monkeypatch.setattr(streams, "SSE_HEARTBEAT_SECONDS", 0.3)
    revoke = sync_to_async(lambda: ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now()))

    async def body():
        frames = streams._frames(team.member, token.pk, job.pk, job.session_id, 0)
        before = []
        while not before or before[-1] != ": keep-alive\n\n":
            before.append(await asyncio.wait_for(frames.__anext__(), 10))
        await revoke()
        after = [chunk async for chunk in frames]
        return before, after

    before, after = async_to_sync(body)()
    assert [c.split("\n")[1] for c in before[:2]] == ["event: message.created", "event: job.queued"]
    # closed at the next heartbeat: no keep-alive after the revocation, and no 'end' (the job runs on)
    assert all(c.startswith("id: ") for c in after) and not any("event: end" in c for c in before + after)


def test_a_closed_stream_lets_go_of_its_subscription(transactional_db, team, scripted_session):
    """When the client goes away (daphne cancels the body; here: ``aclose``)
    the stream leaves the session's group and, on the embedded default, stops being watched by
    this process's database relay — nothing is left behind per stream."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from collab import streams
    from collab.realtime.relay import relay
    from collab.models import Job

    api, sid = scripted_session(team.member, [{"sleep_ms": 30000}, {"text": "late"}])
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"})
    assert r.status_code == 202, r.content
    job = Job.objects.get(pk=r.json()["execution_id"])

    async def body():
        layer = get_channel_layer()
        joined = []
        original = layer.group_add, layer.group_discard

        async def group_add(group, channel):
            joined.append((group, channel))
            await original[0](group, channel)

        async def group_discard(group, channel):
            joined.remove((group, channel))
            await original[1](group, channel)

        layer.group_add, layer.group_discard = group_add, group_discard
        try:
            frames = streams._frames(team.member, None, job.pk, job.session_id, 0)
            first = await asyncio.wait_for(frames.__anext__(), 10)
            watched = relay().watchers[sid] if relay() else None
            subscribed = list(joined)
            await frames.aclose()
            return first, watched, subscribed, list(joined), (relay().watchers.get(sid) if relay() else None)
        finally:
            layer.group_add, layer.group_discard = original

    first, watched, subscribed, left, watched_after = async_to_sync(body)()
    assert first.startswith("id: ") and "event: message.created" in first
    assert [g for g, _ in subscribed] == [f"session.{sid}"] and left == []
    from django.conf import settings

    assert watched == (1 if settings.TRELLIS_EVENT_POLL else None)  # embedded: watched while open
    assert watched_after is None
