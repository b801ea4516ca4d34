"""Open waits are bounded per user (P-SEC-4): a ``?wait=`` request or an SSE
stream parks on the event loop holding no thread, but it holds a socket and a channel-layer
subscription, so one user (or a leaked token) may keep at most
``TRELLIS_MAX_OPEN_WAITS_PER_USER`` open per web process. Past it: 429 ``too_many_open_waits``
— before anything is admitted — and other people are not affected. In-process, through the API."""

import pytest

from tests.collab.test_web_never_stalls import http
from tests.conftest import turn


@pytest.fixture
def one_wait_each(settings, monkeypatch):
    """A bound of one, counted afresh: the process-wide counts start empty for this test (user
    ids repeat across tests on a flushed database)."""
    from collab.realtime import bounds

    settings.TRELLIS_MAX_OPEN_WAITS_PER_USER = 1
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
        assert r.json()["code"] == "too_many_open_waits" and "TRELLIS_MAX_OPEN_WAITS_PER_USER" in r.json()["detail"]
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
        for n in range(settings.TRELLIS_MAX_OPEN_WAITS_PER_USER + 1):
            r = client.get(f"/api/executions/{eid}?wait=0.05")
            assert r.status_code == 200 and r.json()["waited"] is True, (n, r.text)
        r = client.post(f"/api/sessions/{sid}/turns?wait=0.05", json={"prompt": ""})  # refused after its slot
        assert r.status_code == 400, r.text
        r = client.post(f"/api/sessions/{sid}/turns?wait=0.05", json={"prompt": "and wait a little"})
        assert r.status_code == 202 and r.json()["waited"] is True, r.text
