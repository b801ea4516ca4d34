"""Open waits are bounded per user (docs/contract.md#http-api): a ``?wait=`` request or an SSE
stream parks on the event loop holding no thread, but it holds a socket and a channel-layer
subscription, so one user (or a leaked token) may keep at most
``TRELLIS_MAX_OPEN_STREAMS_PER_USER`` open per web process. Past it: 429 ``too_many_open_waits``
— before anything is admitted — and other people are not affected. In-process, through the API."""

import json

import pytest

from tests.collab.test_web_never_stalls import http
from tests.conftest import turn


@pytest.fixture
def one_wait_each(settings, monkeypatch):
    """A bound of one, counted afresh: the process-wide counts start empty for this test (user
    ids repeat across tests on a flushed database)."""
    from collab.realtime import bounds

    settings.TRELLIS_MAX_OPEN_STREAMS_PER_USER = 1
    monkeypatch.setattr(bounds, "OPEN_WAITS", bounds.InFlight(bounds._too_many_open_waits))


def test_a_user_at_the_open_wait_bound_is_refused_before_anything_starts(team, scripted_session, one_wait_each):
    from collab.realtime.bounds import open_wait
    from collab.models import Job

    api, sid = scripted_session(team.member, [{"text": "hi"}])
    eid = turn(api, sid, "queued, no worker here")
    held = open_wait(team.member)  # the member's one wait, held elsewhere (another request)
    try:
        r = api.post(f"/api/sessions/{sid}/turns?wait=5", {"prompt": "and wait"})
        assert r.status_code == 429, r.content
        assert r.json()["code"] == "too_many_open_waits" and "TRELLIS_MAX_OPEN_STREAMS_PER_USER" in r.json()["detail"]
        assert Job.objects.filter(session_id=sid).count() == 1  # refused before admission: nothing started
        r = api.get(f"/api/executions/{eid}", wait=5)
        assert (r.status_code, r.json()["code"]) == (429, "too_many_open_waits")
        r = api.get(f"/api/executions/{eid}/stream")
        assert (r.status_code, r.json()["code"]) == (429, "too_many_open_waits")
        # without ?wait= nothing is held, so nothing is refused; another person has their own bound
        assert api.get(f"/api/executions/{eid}").status_code == 200
        open_wait(team.owner).free()
    finally:
        held.free()


@pytest.mark.slow
def test_a_finished_wait_gives_its_slot_back(team, scripted_session, server):
    """Through a real daphne process (default bound: 32 per user): more waits than the bound, one
    after another, all answer — each ended wait (a refused one too) freed its slot."""
    from django.conf import settings

    api, sid = scripted_session(team.member, [{"sleep_ms": 600_000}, {"text": "never"}])
    with http(server, team.member) as client:
        eid = client.post(f"/api/sessions/{sid}/turns", json={"prompt": "no worker takes it"}).json()["execution_id"]
        for n in range(settings.TRELLIS_MAX_OPEN_STREAMS_PER_USER + 1):
            r = client.get(f"/api/executions/{eid}?wait=0.05")
            assert r.status_code == 200 and r.json()["waited"] is True, (n, r.text)
        r = client.post(f"/api/sessions/{sid}/turns?wait=0.05", json={"prompt": ""})  # refused after its slot
        assert r.status_code == 400, r.text
        r = client.post(f"/api/sessions/{sid}/turns?wait=0.05", json={"prompt": "and wait a little"})
        assert r.status_code == 202 and r.json()["waited"] is True, r.text


def test_a_socket_past_its_users_bound_is_closed_with_4429_and_others_are_not(transactional_db, team, scripted_session,
                                                                              one_wait_each):
    """Sockets are long-lived connections too: with a bound of one, a member's second socket is
    accepted and closed at once with 4429 (the client sees why); another member's socket opens;
    once the first socket closes, its slot serves a new one."""
    from tests.collab.test_live_events import ORIGIN, RECV_TIMEOUT, bearer, communicator, run

    _api, sid = scripted_session(team.member, [{"text": "ok"}])
    mine, theirs = bearer(team.member), bearer(team.owner)

    async def body():
        first = communicator(sid, None, [ORIGIN, mine])
        assert (await first.connect(timeout=RECV_TIMEOUT))[0]
        second = communicator(sid, None, [ORIGIN, mine])
        assert (await second.connect(timeout=RECV_TIMEOUT))[0]
        refused = await second.receive_output(timeout=RECV_TIMEOUT)
        other = communicator(sid, None, [ORIGIN, theirs])
        assert (await other.connect(timeout=RECV_TIMEOUT))[0]
        other_first = await other.receive_json_from(timeout=RECV_TIMEOUT)
        await first.disconnect()
        again = communicator(sid, None, [ORIGIN, mine])
        assert (await again.connect(timeout=RECV_TIMEOUT))[0]
        again_first = await again.receive_json_from(timeout=RECV_TIMEOUT)
        await other.disconnect()
        await again.disconnect()
        return refused, other_first, again_first

    refused, other_first, again_first = run(body)
    assert refused == {"type": "websocket.close", "code": 4429}
    assert other_first["type"] == again_first["type"] == "session.created"


def test_past_the_process_bound_every_user_is_refused_until_a_connection_ends(team, scripted_session, settings,
                                                                               monkeypatch):
    from collab.realtime import bounds

    settings.TRELLIS_MAX_OPEN_STREAMS_PER_USER, settings.TRELLIS_MAX_OPEN_STREAMS = 5, 3
    monkeypatch.setattr(bounds, "OPEN_WAITS", bounds.InFlight(bounds._too_many_open_waits))
    held = [bounds.open_wait(team.member), bounds.open_wait(team.member), bounds.open_wait(team.owner)]
    with pytest.raises(bounds.TooManyOpenStreams) as refused:
        bounds.open_wait(team.viewer)
    assert refused.value.status == 429 and "TRELLIS_MAX_OPEN_STREAMS" in refused.value.detail
    held.pop().free()
    bounds.open_wait(team.viewer).free()
    api, sid = scripted_session(team.member, [{"text": "hi"}])
    eid = turn(api, sid, "queued, no worker here")
    held.append(bounds.open_wait(team.owner))
    r = api.get(f"/api/executions/{eid}?wait=1")
    assert r.status_code == 429 and r.json()["code"] == "too_many_open_streams", r.content
    for slot in held:
        slot.free()


@pytest.mark.slow
def test_an_mcp_stream_past_its_users_bound_is_refused_with_a_429(team, scripted_session, server):
    """MCP's event stream (``GET /mcp``) is a long-lived connection like a ``?wait=``: with the
    member's slots of the server process held by parked waits, their MCP stream is a 429; once
    the waits have answered (the execution they wait for is cancelled), their slots serve again."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import httpx
    from django.conf import settings

    from tests.collab.test_mcp import head_address, token

    api, sid = scripted_session(team.member, [{"sleep_ms": 600_000}, {"text": "never"}])
    address, _ = head_address(api, sid)
    eid = turn(api, sid, "no worker takes it")
    mcp = {"Authorization": f"Bearer {token(team.member)}", "X-Trellis-Branch": address, "Accept": "text/event-stream"}
    waits = settings.TRELLIS_MAX_OPEN_STREAMS_PER_USER + 1  # one more than the bound: exactly one is refused
    with http(server, team.member) as client, ThreadPoolExecutor(waits) as pool:
        parked = [pool.submit(client.get, f"/api/executions/{eid}?wait=10") for _ in range(waits)]
        first = next(as_completed(parked, timeout=9)).result().status_code  # every wait has arrived
        with httpx.Client(timeout=10) as mcp_client, mcp_client.stream("GET", f"{server.url}/mcp", headers=mcp) as r:
            refused = (r.status_code, r.read() if r.status_code != 200 else b"")
        version = api.get(f"/api/executions/{eid}").json()["version"]  # end the waits: cancel what they wait for
        assert api.post(f"/api/executions/{eid}/commands", {"command_id": "end-waits", "action": "execution.cancel",
                                                            "expected_version": version, "payload": {}}).status_code == 202
        answered = sorted(f.result(timeout=60).status_code for f in parked)
        after = client.get(f"/api/executions/{eid}?wait=0.01").status_code
    assert first == 429 and answered == [200] * (waits - 1) + [429], (first, answered)
    assert refused[0] == 429 and json.loads(refused[1])["code"] == "too_many_open_waits", refused
    assert after == 200  # the slots came back once the waits answered
