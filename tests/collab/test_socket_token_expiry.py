"""A socket opened with a token closes when the token expires (4401), as it does when the token
is revoked: what a token opened ends with it. It closes (4403) when its person is deactivated or
deleted, as when they lose the membership."""

from datetime import timedelta

from django.utils import timezone

from accounts.models import ApiToken, TokenScope
from tests.collab.test_live_events import ORIGIN, RECV_TIMEOUT, communicator, run


def test_a_socket_opened_with_a_token_closes_when_the_token_expires(transactional_db, team, scripted_session):
    _api, sid = scripted_session(team.member, [{"text": "ok"}])
    _token, raw = ApiToken.issue(team.member, name="short", scopes=[TokenScope.READ],
                                 expires_at=timezone.now() + timedelta(seconds=2))
    forever = ApiToken.issue(team.member, name="long", scopes=[TokenScope.READ])[1]

    async def body():
        short = communicator(sid, None, [ORIGIN, (b"authorization", f"Bearer {raw}".encode())])
        kept = communicator(sid, None, [ORIGIN, (b"authorization", f"Bearer {forever}".encode())])
        for comm in (short, kept):
            connected, _ = await comm.connect(timeout=RECV_TIMEOUT)
            assert connected
            await comm.receive_json_from(timeout=RECV_TIMEOUT)  # session.created, from the log
        try:
            closed = await short.receive_output(timeout=5)  # expires 2 s after it was issued
            still_open = await kept.receive_nothing(timeout=0.5)
            return closed, still_open
        finally:
            await kept.disconnect()

    closed, still_open = run(body)
    assert closed == {"type": "websocket.close", "code": 4401}
    assert still_open


def test_a_socket_closes_when_its_person_is_deactivated_or_deleted(transactional_db, team, make_user,
                                                                   scripted_session):
    """Deactivating a person (the admin's user form saves ``is_active`` off) closes their sockets
    with 4403 within 5 s, as losing the membership does; so does deleting them. A colleague's
    socket on the same session stays open."""
    from asgiref.sync import sync_to_async

    from accounts.models import Membership

    _api, sid = scripted_session(team.member, [{"text": "ok"}])
    leaving = make_user("leaving")
    deleted = make_user("deleted")
    for person in (leaving, deleted):
        Membership.objects.create(user=person, project=team.alpha, role="member")
    tokens = {who.username: ApiToken.issue(who, name="socket", scopes=[TokenScope.READ])[1]
              for who in (leaving, deleted, team.member)}

    def deactivate():
        leaving.is_active = False
        leaving.save()
        deleted.delete()

    async def body():
        comms = {who: communicator(sid, None, [ORIGIN, (b"authorization", f"Bearer {raw}".encode())])
                 for who, raw in tokens.items()}
        for comm in comms.values():
            connected, _ = await comm.connect(timeout=RECV_TIMEOUT)
            assert connected
            await comm.receive_json_from(timeout=RECV_TIMEOUT)  # session.created, from the log
        await sync_to_async(deactivate)()
        try:
            closed = [await comms[who].receive_output(timeout=5) for who in ("leaving", "deleted")]
            still_open = await comms[team.member.username].receive_nothing(timeout=0.5)
            return closed, still_open
        finally:
            await comms[team.member.username].disconnect()

    closed, still_open = run(body)
    assert closed == [{"type": "websocket.close", "code": 4403}] * 2
    assert still_open
