"""A socket opened with a token closes when the token expires (4401), as it does when the token
is revoked: what a token opened ends with it."""

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
