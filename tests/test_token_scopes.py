"""API tokens: expiry, scopes, minting and hold approval (docs/contract.md#authentication).

Every check goes through the public API with real bearer tokens: GETs need ``read``,
other calls ``write``, the tool gateway ``tools``, creating or revoking tokens ``tokens``,
deciding held deliveries ``holds`` (a person's browser session needs no scope)."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from accounts.models import ApiToken
from collab.models import Event, HeldDelivery, HoldStatus

from tests.conftest import ApiClient


def token(user, *scopes, **fields):
    token, raw = ApiToken.issue(user, name="scoped", scopes=list(scopes) if scopes else None, **fields)
    return token, ApiClient(Client(), raw)


def assert_refused(r, status, code):
    assert r.status_code == status, r.content
    assert r.json()["code"] == code, r.json()


def test_a_new_token_reads_writes_and_calls_tools_but_mints_and_approves_nothing(team):
    row, _ = token(team.member)
    assert row.scopes == ["read", "write", "tools"] and row.expires_at is None


def test_an_expired_token_is_refused_like_a_revoked_one(team):
    row, api = token(team.member, expires_at=timezone.now() + timedelta(hours=1))
    assert api.get("/api/projects").status_code == 200
    ApiToken.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))  # time passed
    assert_refused(api.get("/api/projects"), 401, "unauthenticated")
    assert_refused(api.post("/api/projects", {"slug": "gamma", "name": "G"}), 401, "unauthenticated")


def test_a_read_token_cannot_write_and_a_write_token_cannot_read(team, scripted_session):
    _, sid = scripted_session(team.member, [{"text": "x"}])
    _, reader = token(team.member, "read")
    assert reader.get(f"/api/sessions/{sid}").status_code == 200
    assert_refused(reader.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}), 403, "token_scope")
    assert_refused(reader.post("/api/projects", {"slug": "gamma", "name": "G"}), 403, "token_scope")
    _, writer = token(team.member, "write")
    assert_refused(writer.get(f"/api/sessions/{sid}"), 403, "token_scope")
    assert writer.post("/api/projects", {"slug": "gamma", "name": "G"}).status_code == 201


def test_the_tool_gateway_needs_the_tools_scope(team, scripted_session):
    _, sid = scripted_session(team.member, [{"text": "x"}])
    address = f"{sid}:nothing"
    _, no_tools = token(team.member, "read", "write")
    assert_refused(no_tools.post(f"/api/branches/{address}/tools/list_agents", {"arguments": {}}), 403, "token_scope")
    _, tools_only = token(team.member, "tools")
    # past the scope check: the address is then resolved (and not found)
    assert tools_only.post(f"/api/branches/{address}/tools/list_agents", {"arguments": {}}).status_code == 404


def test_a_token_without_the_tokens_scope_cannot_create_or_revoke_tokens(team):
    victim, _ = token(team.member)
    _, ordinary = token(team.member)
    before = ApiToken.objects.count()
    assert_refused(ordinary.post("/api/tokens", {"name": "more"}), 403, "token_scope")
    assert_refused(ordinary.delete(f"/api/tokens/{victim.pk}"), 403, "token_scope")
    assert ApiToken.objects.count() == before and ApiToken.objects.get(pk=victim.pk).revoked_at is None


def test_a_token_mints_only_narrower_shorter_lived_tokens_and_takes_them_down_with_it(team):
    """A token with ``tokens`` mints tokens no wider and no longer-lived than itself; revoking it
    revokes what it minted, so a stolen token does not survive its own revocation. Audited."""
    ends = timezone.now() + timedelta(days=1)
    parent, minter = token(team.member, "read", "write", "tokens", expires_at=ends)
    assert_refused(minter.post("/api/tokens", {"name": "wider", "scopes": ["read", "holds"]}), 403, "scope_escalation")
    assert_refused(minter.post("/api/tokens", {"name": "forever"}), 403, "expiry_escalation")
    assert_refused(minter.post("/api/tokens", {"name": "odd", "scopes": ["root"], "expires_at": ends.isoformat()}),
                   400, "invalid_scopes")
    r = minter.post("/api/tokens", {"name": "child", "scopes": ["read"], "expires_at": (ends - timedelta(hours=1)).isoformat()})
    assert r.status_code == 201, r.content
    child = r.json()
    assert child["scopes"] == ["read"] and child["expires_at"] and child["expired"] is False
    child_api = ApiClient(Client(), child["token"])
    assert child_api.get("/api/projects").status_code == 200

    _, person = token(team.member, "tokens")
    assert person.delete(f"/api/tokens/{parent.pk}").status_code == 204
    assert_refused(child_api.get("/api/projects"), 401, "unauthenticated")
    assert_refused(minter.get("/api/projects"), 401, "unauthenticated")

    created = Event.objects.filter(type="token.created", project=team.alpha, payload__token=child["id"])
    assert created.count() == 1 and created[0].actor == team.member
    revoked = set(Event.objects.filter(type="token.revoked", project=team.alpha).values_list("payload__token", flat=True))
    assert revoked == {parent.pk, child["id"]}
    assert child["token"] not in json.dumps(list(Event.objects.values_list("payload", flat=True)))


def test_create_api_token_takes_scopes_and_an_expiry(team):
    out = io.StringIO()
    call_command("create_api_token", "viewer", "--scopes", "read", "--expires-in-days", "3", stdout=out)
    row = ApiToken.objects.get(user=team.viewer)
    assert row.scopes == ["read"] and row.expires_at > timezone.now() + timedelta(days=2)
    api = ApiClient(Client(), out.getvalue().strip())
    assert api.get("/api/projects").status_code == 200
    assert_refused(api.post("/api/projects", {"slug": "gamma", "name": "G"}), 403, "token_scope")


def test_the_tokens_page_sets_scopes_and_expiry(team):
    client = Client()
    client.force_login(team.member)
    r = client.post("/account/tokens", {"name": "ci", "scopes": ["read", "tools"], "expires_in_days": "7"})
    assert r.status_code == 200
    row = ApiToken.objects.get(user=team.member, name="ci")
    assert row.scopes == ["read", "tools"] and row.expires_at is not None
    assert client.post("/account/tokens", {"name": "x", "expires_in_days": "99999"}).status_code == 400


@pytest.fixture
def held(team, api_as, scripted_session, run_queued):
    """A delivery of the member's agent held by the watch policy, all through the API: a turn
    (its prompt node gives the branch an address), a foreground child as the target (a queued
    job the gateway waits for; ``run_queued`` is its worker), then ``send_message`` to it under ``confirm_deliveries``."""
    api, sid = scripted_session(team.member, [{"text": "x"}])
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).status_code == 202
    main = api.get(f"/api/sessions/{sid}/branches").json()[0]["address"]
    r = api.post(f"/api/branches/{main}/tools/agent", {"arguments": {"prompt": "be the target", "description": "target"}})
    assert r.json()["is_error"] is False, r.json()
    assert api_as(team.owner).patch("/api/projects/alpha", {"watch_policy": "confirm_deliveries"}).status_code == 200
    r = api.post(f"/api/branches/{main}/tools/send_message", {"arguments": {"to": "target", "message": "ping"}})
    assert r.json()["details"]["held"] is True, r.json()
    return HeldDelivery.objects.get(pk=r.json()["details"]["hold_id"])


def test_approving_a_hold_needs_a_person_or_a_token_scoped_for_holds(team, held):
    """An agent given its starter's ordinary token cannot approve its own held delivery; a
    holds-scoped token can reject one, the person's browser session approve one."""
    _, ordinary = token(team.member)
    assert_refused(ordinary.post(f"/api/holds/{held.pk}/approve"), 403, "token_scope")
    assert_refused(ordinary.post(f"/api/holds/{held.pk}/reject"), 403, "token_scope")
    assert HeldDelivery.objects.get(pk=held.pk).status == HoldStatus.PENDING

    browser = Client()
    browser.force_login(team.member)
    r = browser.post(f"/api/holds/{held.pk}/approve", content_type="application/json")
    assert r.status_code == 200 and r.json()["status"] == "approved", r.content


def test_a_holds_scoped_token_decides_a_hold(team, held):
    _, decider = token(team.member, "holds")
    r = decider.post(f"/api/holds/{held.pk}/reject")
    assert r.status_code == 200 and r.json()["status"] == "rejected", r.content


def audit_types(client, slug="alpha") -> str:
    """The project's audit page as an owner reads it (the event types it lists)."""
    r = client.get(f"/p/{slug}/audit")
    assert r.status_code == 200, r.status_code
    return r.content.decode()


def test_tokens_made_and_revoked_through_the_api_are_audited(team):
    """``POST /api/tokens`` and ``DELETE /api/tokens/{id}`` write ``token.created``
    and ``token.revoked`` (by whom, which token — never its value) in the owner's projects, and the
    audit page shows them. Someone else's token is "not found" and stays as it was."""
    _, api = token(team.member, "read", "tokens")
    r = api.post("/api/tokens", {"name": "deploy", "scopes": ["read"]})
    assert r.status_code == 201, r.content
    made = r.json()
    created = Event.objects.get(type="token.created", project=team.alpha, payload__token=made["id"])
    assert created.actor == team.member and created.payload["name"] == "deploy"
    assert made["token"] not in json.dumps(created.payload)

    theirs, _ = ApiToken.issue(team.owner, name="owner's")
    assert_refused(api.delete(f"/api/tokens/{theirs.pk}"), 404, "not_found")
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is None
    assert not Event.objects.filter(type="token.revoked").exists()

    assert api.delete(f"/api/tokens/{made['id']}").status_code == 204
    revoked = Event.objects.get(type="token.revoked", project=team.alpha, payload__token=made["id"])
    assert revoked.actor == team.member
    owner = Client()
    owner.force_login(team.owner)
    page = audit_types(owner)
    assert "token.created" in page and "token.revoked" in page


def test_tokens_made_and_revoked_on_the_tokens_page_are_audited(team):
    """The tokens page makes and revokes through the same audited service as the
    API, with the same ownership rule (another person's token: 404, untouched)."""
    client = Client()
    client.force_login(team.member)
    assert client.post("/account/tokens", {"name": "laptop", "expires_in_days": ""}).status_code == 200
    row = ApiToken.objects.get(user=team.member, name="laptop")
    assert Event.objects.filter(type="token.created", project=team.alpha, payload__token=row.pk,
                                actor=team.member).exists()

    theirs, _ = ApiToken.issue(team.owner, name="owner's")
    assert client.post(f"/account/tokens/{theirs.pk}/revoke").status_code == 404
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is None

    assert client.post(f"/account/tokens/{row.pk}/revoke").status_code == 302
    assert ApiToken.objects.get(pk=row.pk).revoked_at is not None
    assert Event.objects.filter(type="token.revoked", project=team.alpha, payload__token=row.pk,
                                actor=team.member).exists()
    listed = client.get("/account/tokens").content.decode()
    assert "laptop" in listed and "owner&#x27;s" not in listed and "owner's" not in listed


def test_an_expiry_past_the_calendar_in_utc_is_refused_not_stored(team, api_as):
    """An ``expires_at`` the schema accepts but that leaves the calendar once in UTC (year 9999 at
    a negative offset; PostgreSQL would store it and fail to read it back) is a 400, never a 500."""
    api = api_as(team.member)
    for value in ("9999-12-31T23:59:59-23:59", "9999-12-31T20:00:00-05:00"):
        r = api.post("/api/tokens", {"name": "far", "expires_at": value})
        assert r.status_code == 400 and r.json()["code"] == "invalid_expiry", (value, r.content)
    assert api.get("/api/tokens").status_code == 200  # and the listing still reads
    r = api.post("/api/tokens", {"name": "near", "expires_at": "2100-01-01T00:00:00+02:00"})
    assert r.status_code == 201, r.content
