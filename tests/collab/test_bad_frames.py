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


# what the API's bad-input suite sends every route (tests/collab/test_bad_input.py), as MCP tool calls
BAD_CALLS = [
    ('{"to": "main", "message": "a\\u0000b"}', "send_message"),             # NUL in a string
    ('{"to": "main", "message": "\\ud800"}', "send_message"),               # a lone surrogate
    ('{"to": "\\udfff\\udfff", "message": "x"}', "send_message"),
    ('{"todos": [{"content": "x", "priority": Infinity}]}', "todo_write"),  # non-finite numbers
    ('{"session_id": "x", "max_chars": 1e400}', "read_conversation"),
    ('{"session_id": "x", "max_chars": NaN}', "read_conversation"),
    ('{"prompt": "x", "description": "a\\u0000", "run_in_background": true}', "agent"),
    ('"not an object"', "list_agents"),
    ('{"job_id": ["nested", {"deep": [1, 2, 3]}]}', "job_output"),
]


@pytest.mark.slow
def test_mcp_tool_calls_with_bad_values_answer_a_clear_error_never_a_5xx(team, scripted_session, server):
    """Each probe of the API's bad-input suite — NUL, lone surrogates, non-finite numbers, wrong
    types — inside an MCP ``tools/call``: a 4xx refusal of the body, a tool result marked as an
    error, or (a NUL in a name) the call taken with U+FFFD in its place, as the API takes it;
    never a 5xx; the server goes on serving."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address, _ = head_address(api, sid)
    headers = {"Authorization": f"Bearer {token(team.member)}", "X-Trellis-Branch": address,
               "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    for arguments, tool in BAD_CALLS:
        body = ('{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "%s", "arguments": %s}}'
                % (tool, arguments))
        r = httpx.post(f"{server.url}/mcp", content=body.encode(), headers=headers, timeout=30)
        assert r.status_code < 500, (tool, arguments, r.status_code, r.text[:300])
        if r.status_code >= 400:
            assert r.json()["code"] and r.json()["detail"], r.text[:300]
            continue
        answer = _rpc_answer(r)
        if "error" in answer or answer["result"]["isError"]:
            continue
        # taken as the API takes it: the bad character is stored as U+FFFD, never as itself
        assert "\\u0000" not in r.text and "\\ud800" not in r.text and "\ufffd" in json.dumps(answer, ensure_ascii=False), answer
    ok = httpx.post(f"{server.url}/mcp", json=INITIALIZE, headers=headers, timeout=30)
    assert ok.status_code == 200, ok.text[:300]
    assert "Exception inside application" not in server.log.read_text()


def _rpc_answer(r: httpx.Response) -> dict:
    """The JSON-RPC answer of a POST, sent as JSON or as one server-sent event."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return r.json()


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
            for frame in ["not json", DEEP, "[1, 2]", json.dumps({"type": "catch_up", "pad": "x" * 5000}),
                          "NaN", '{"type": Infinity}', '"\\ud800"', "1e400", '{"type": 1e400}']:
                await comm.send_to(text_data=frame)
                answers.append(await comm.receive_json_from(timeout=RECV_TIMEOUT))
            await comm.send_to(bytes_data=b"\x00\x01")
            answers.append(await comm.receive_json_from(timeout=RECV_TIMEOUT))
            for odd in ['{"type": "catch_up\\u0000"}', '{"type": "\\ud800"}', '{}']:
                await comm.send_to(text_data=odd)  # objects, of no type it knows: nothing to answer
            await comm.send_to(text_data=json.dumps({"type": "catch_up"}))  # understood: no answer
            [seq] = await sync_to_async(write_events)(sid, 1, "test.after")
            after = await comm.receive_json_from(timeout=RECV_TIMEOUT)  # still open, still streaming
            return answers, after, seq
        finally:
            await comm.disconnect()

    with caplog.at_level(logging.ERROR):
        answers, after, seq = run(body)
    assert [(a["type"], a["code"]) for a in answers] == [("error", "invalid_frame")] * 10
    assert all("seq" not in a for a in answers)  # not events: a page's script skips them
    assert (after["seq"], after["type"]) == (seq, "test.after")
    assert "Exception inside application" not in caplog.text
