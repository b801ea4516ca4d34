"""Malformed, deeply nested or oversized input to ``/mcp`` and to a session's WebSocket gets a
clear refusal for that message — a 4xx, an ``error`` frame — never a 500, a crash logged as
"Exception inside application", or a socket closed with 1011."""

import json
import logging

import httpx
import pytest
from asgiref.sync import sync_to_async

from tests.collab.test_live_events import ORIGIN, RECV_TIMEOUT, bearer, communicator, run, write_events
from tests.collab.test_mcp import INITIALIZE, head_address, token

DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.slow
def test_mcp_refuses_a_body_it_cannot_take_with_a_4xx_and_goes_on_serving(team, scripted_session, server):
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address, _ = head_address(api, sid)
    headers = {"Authorization": f"Bearer {token(team.member)}", "X-Trellis-Branch": address,
               "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    def post(body: bytes) -> httpx.Response:
        return httpx.post(f"{server.url}/mcp", content=body, headers=headers, timeout=30)

    for body, status, code in [
        (DEEP.encode(), 400, "invalid_json"),                      # nested 5,000 deep: was a 500
        (b'{"jsonrpc": "2.0", "id": 1, "method": ' + b'{"a":' * 100 + b"1" + b"}" * 100 + b"}", 400, "invalid_json"),
        (b"not json at all", 400, "invalid_json"),
        (b"\xff\xfe", 400, "invalid_json"),
        (b" " * (5 * 1024 * 1024), 413, "body_too_large"),
    ]:
        r = post(body)
        assert r.status_code == status, (body[:40], r.status_code, r.text[:300])
        assert r.json()["code"] == code and r.json()["detail"]
    ok = post(json.dumps(INITIALIZE).encode())
    assert ok.status_code == 200, ok.text[:300]
    assert "Exception inside application" not in server.log.read_text()


def test_a_socket_answers_a_frame_it_cannot_read_with_an_error_frame_and_stays_open(transactional_db, team,
                                                                                   scripted_session, caplog):
    _api, sid = scripted_session(team.member, [{"text": "ok"}])
    auth = bearer(team.member)

    async def body():
        comm = communicator(sid, None, [ORIGIN, auth])
        connected, _ = await comm.connect(timeout=RECV_TIMEOUT)
        assert connected
        try:
            await comm.receive_json_from(timeout=RECV_TIMEOUT)  # session.created, from the log
            answers = []
            for frame in ["not json", DEEP, "[1, 2]", json.dumps({"type": "catch_up", "pad": "x" * 5000})]:
                await comm.send_to(text_data=frame)
                answers.append(await comm.receive_json_from(timeout=RECV_TIMEOUT))
            await comm.send_to(bytes_data=b"\x00\x01")
            answers.append(await comm.receive_json_from(timeout=RECV_TIMEOUT))
            await comm.send_to(text_data=json.dumps({"type": "catch_up"}))  # understood: no answer
            [seq] = await sync_to_async(write_events)(sid, 1, "test.after")
            after = await comm.receive_json_from(timeout=RECV_TIMEOUT)  # still open, still streaming
            return answers, after, seq
        finally:
            await comm.disconnect()

    with caplog.at_level(logging.ERROR):
        answers, after, seq = run(body)
    assert [(a["type"], a["code"]) for a in answers] == [("error", "invalid_frame")] * 5
    assert all("seq" not in a for a in answers)  # not events: a page's script skips them
    assert (after["seq"], after["type"]) == (seq, "test.after")
    assert "Exception inside application" not in caplog.text
