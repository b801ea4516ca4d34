"""The live event stream: WebSocket ``/ws/sessions/{sid}/?after=SEQ`` (docs/contract.md#events).

First the logged events after ``SEQ``, then the same events live, as JSON text
frames ``{"seq","type","payload","created_at"}`` in ``seq`` order with no gaps
and no repeats; members only, Origin checked.

Two layers of proof:

* in-process, through ``config.asgi.application`` (the real ASGI stack: Origin
  validator, cookie/bearer auth, router, consumer, channel layer) with
  channels' ``WebsocketCommunicator``;
* cross-process, through a real daphne process and a real qcluster worker: the
  worker's events reach the socket live — through the database relay on the
  embedded default and through channels-redis when ``REDIS_URL`` is
  set (docs/contract.md#deployments).

Every wait is on a condition with a timeout, never a fixed sleep.
"""

import asyncio
import base64
import hashlib
import json
import os
import struct
from urllib.parse import urlparse

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction

RECV_TIMEOUT = 15.0  # seconds to wait for one frame
ORIGIN = (b"origin", b"http://127.0.0.1")


# --- helpers ----------------------------------------------------------------------------


def run(coro_fn, *args):
    """Drive an async test body to completion on a fresh event loop (asgiref)."""
    return async_to_sync(coro_fn)(*args)


def bearer(user) -> tuple[bytes, bytes]:
    from accounts.models import ApiToken

    _, raw = ApiToken.issue(user, name="ws-test")
    return (b"authorization", f"Bearer {raw}".encode())


def log_of(api, sid, after=0) -> list[dict]:
    """The session's event log through the public API."""
    r = api.get(f"/api/sessions/{sid}/events", after=after)
    assert r.status_code == 200, r.content
    return r.json()["events"]


def write_events(sid: str, count: int, type: str = "test.note") -> list[int]:
    """Append ``count`` events, one committed transaction each, the way collab code does."""
    from collab.events import send_event_on_commit

    seqs = []
    for i in range(count):
        with transaction.atomic():
            seqs.append(send_event_on_commit(sid, type, {"n": i}).seq)
    return seqs


def assert_contiguous(frames: list[dict], first: int) -> None:
    seqs = [f["seq"] for f in frames]
    assert seqs == list(range(first, first + len(frames))), f"gap or repeat in {seqs}"
    for f in frames:
        assert set(f) == {"seq", "type", "payload", "created_at"}, f
        assert isinstance(f["created_at"], str) and isinstance(f["payload"], dict)


def communicator(sid: str, after: int | None, headers: list[tuple[bytes, bytes]]):
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    path = f"/ws/sessions/{sid}/" + ("" if after is None else f"?after={after}")
    return WebsocketCommunicator(application, path, headers=headers)


async def _receive(comm, frames: list[dict], waiting_for: str) -> dict:
    try:
        return await comm.receive_json_from(timeout=RECV_TIMEOUT)
    except TimeoutError:
        got = [(f["seq"], f["type"]) for f in frames]
        raise AssertionError(f"no frame within {RECV_TIMEOUT}s waiting for {waiting_for}; got {got}") from None


async def frames_through(comm, seq: int) -> list[dict]:
    """Frames from an open communicator until (and including) the one with ``seq``."""
    frames = []
    while not frames or frames[-1]["seq"] < seq:
        frames.append(await _receive(comm, frames, f"seq {seq}"))
    return frames


async def frames_until_type(comm, type: str) -> list[dict]:
    frames = []
    while not frames or frames[-1]["type"] != type:
        frames.append(await _receive(comm, frames, repr(type)))
    return frames


@pytest.fixture
def session_of(scripted_session, team):
    """A session in project alpha opened by ``member``: ``(api client of member, sid)``."""
    return scripted_session(team.member, [{"text": "echo: {{prompt}}"}])


# --- in-process: the real ASGI application ---------------------------------------------------


def test_log_then_live_in_seq_order_after_seq(transactional_db, team, session_of):
    """``?after=SEQ`` first replays the
    logged events after SEQ — not before, not SEQ itself — then streams new ones, same
    shape as ``GET /api/sessions/{sid}/events``, in seq order with no gaps or repeats."""
    api, sid = session_of
    write_events(sid, 4)  # 1 = session.created, then 2..5
    assert [e["seq"] for e in log_of(api, sid)] == [1, 2, 3, 4, 5]
    auth = bearer(team.member)

    async def body():
        comm = communicator(sid, 2, [ORIGIN, auth])
        connected, _ = await comm.connect(timeout=RECV_TIMEOUT)
        assert connected
        try:
            replayed = await frames_through(comm, 5)
            assert_contiguous(replayed, 3)
            live_seqs = await sync_to_async(write_events)(sid, 3, "test.live")
            assert live_seqs == [6, 7, 8]
            live = await frames_through(comm, 8)
            assert_contiguous(live, 6)
            return replayed, live
        finally:
            await comm.disconnect()

    replayed, live = run(body)
    assert replayed + live == log_of(api, sid, after=2)  # byte for byte what the log says
    assert [f["type"] for f in live] == ["test.live"] * 3
    assert [f["payload"]["n"] for f in live] == [0, 1, 2]


def test_reconnect_with_after_gets_exactly_the_missed_events(transactional_db, team, session_of):
    """Resuming with ``?after=SEQ``: a client that drops and reconnects with the
    last seq it saw gets exactly the events it missed — none repeated, none skipped — and
    then the live ones."""
    api, sid = session_of
    write_events(sid, 2)  # 1..3 in the log
    auth = bearer(team.member)

    async def body():
        first = communicator(sid, 0, [ORIGIN, auth])
        assert (await first.connect(timeout=RECV_TIMEOUT))[0]
        try:
            seen = await frames_through(first, 3)
        finally:
            await first.disconnect()
        assert_contiguous(seen, 1)
        last_seen = seen[-1]["seq"]

        missed = await sync_to_async(write_events)(sid, 3, "test.missed")  # while disconnected
        assert missed == [4, 5, 6]

        second = communicator(sid, last_seen, [ORIGIN, auth])
        assert (await second.connect(timeout=RECV_TIMEOUT))[0]
        try:
            resumed = await frames_through(second, 6)
            # One more event written now: if anything were repeated it would show up
            # before it, if anything were skipped the seqs would not be contiguous.
            (live_seq,) = await sync_to_async(write_events)(sid, 1, "test.after-resume")
            resumed += await frames_through(second, live_seq)
        finally:
            await second.disconnect()
        return seen, resumed

    seen, resumed = run(body)
    assert_contiguous(resumed, 4)
    assert [f["seq"] for f in resumed] == [4, 5, 6, 7]
    assert [f["type"] for f in resumed] == ["test.missed"] * 3 + ["test.after-resume"]
    assert seen + resumed == log_of(api, sid)


def test_turn_posted_through_the_api_after_connecting_arrives_live(transactional_db, team, session_of):
    """A member watching the session sees the events of a turn posted
    through the REST API after the socket opened (the person's message and ``job.queued``),
    in order, identical to the log."""
    api, sid = session_of
    auth = bearer(team.viewer)  # read access is enough to watch

    async def body():
        comm = communicator(sid, 1, [ORIGIN, auth])  # the log holds only session.created
        assert (await comm.connect(timeout=RECV_TIMEOUT))[0]
        try:
            r = await sync_to_async(api.post)(f"/api/sessions/{sid}/turns", {"prompt": "hello live"})
            assert r.status_code == 202, r.content
            frames = await frames_until_type(comm, "job.queued")
        finally:
            await comm.disconnect()
        return r.json(), frames

    accepted, frames = run(body)
    assert_contiguous(frames, 2)
    assert [f["type"] for f in frames] == ["message.created", "job.queued"]
    prompt = frames[0]["payload"]
    assert prompt["role"] == "user" and prompt["text"] == "hello live"
    assert frames[1]["payload"]["job"] == accepted["execution_id"]
    assert frames == log_of(api, sid, after=1)[: len(frames)]


def test_browser_session_cookie_authenticates_the_socket(transactional_db, team, session_of):
    """The browser's session cookie (no bearer token) is accepted on the handshake."""
    from django.conf import settings
    from django.test import Client

    _, sid = session_of
    browser = Client()
    browser.force_login(team.member)
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"

    async def body():
        comm = communicator(sid, 0, [ORIGIN, (b"cookie", cookie.encode())])
        connected, _ = await comm.connect(timeout=RECV_TIMEOUT)
        assert connected
        try:
            return await comm.receive_json_from(timeout=RECV_TIMEOUT)
        finally:
            await comm.disconnect()

    first = run(body)
    assert first["seq"] == 1 and first["type"] == "session.created"


@pytest.mark.parametrize(
    "case",
    ["outsider", "anonymous", "bad_token", "evil_origin", "no_origin", "unknown_session"],
)
def test_handshake_is_refused_for_non_members_and_foreign_origins(transactional_db, team, session_of, case):
    """A non-member (an owner of another project), an anonymous
    client, a bad token, a foreign or missing Origin, and an unknown session id are all
    refused at the handshake; nothing of the log is sent. A viewer with the same headers
    otherwise is accepted (control)."""
    _, sid = session_of
    viewer = bearer(team.viewer)  # the lowest role that may watch
    headers = {
        "outsider": [ORIGIN, bearer(team.outsider)],
        "anonymous": [ORIGIN],
        "bad_token": [ORIGIN, (b"authorization", b"Bearer not-a-real-token")],
        "evil_origin": [(b"origin", b"http://evil.example"), viewer],
        "no_origin": [viewer],
        "unknown_session": [ORIGIN, viewer],
    }[case]
    target = "no-such-session" if case == "unknown_session" else sid

    async def body():
        control = communicator(sid, 0, [ORIGIN, viewer])
        assert (await control.connect(timeout=RECV_TIMEOUT))[0], "control connection must be accepted"
        await control.receive_json_from(timeout=RECV_TIMEOUT)
        await control.disconnect()

        comm = communicator(target, 0, headers)
        connected, _ = await comm.connect(timeout=RECV_TIMEOUT)
        if connected:  # pragma: no cover - the failure path; report what leaked
            leaked = await comm.receive_output(timeout=1)
            await comm.disconnect()
            return True, leaked
        return False, None

    connected, leaked = run(body)
    assert not connected, f"{case}: handshake accepted; first output {leaked}"


# --- cross-process: a real daphne and a real worker -----------------------------------------


class Refused(Exception):
    """The server answered the WebSocket handshake with something other than 101."""


class WsClient:
    """A minimal RFC 6455 client over asyncio streams: text frames in, close out.

    No WebSocket client library is installed; autobahn (daphne's dependency) cannot
    be used here because importing channels/daphne pins txaio to Twisted for this process.
    """

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, url: str, headers: dict[str, str], origin: str | None):
        parts = urlparse(url)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), RECV_TIMEOUT)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {parts.path}?{parts.query} HTTP/1.1",
            f"Host: {parts.hostname}:{parts.port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *([f"Origin: {origin}"] if origin else []),
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), RECV_TIMEOUT)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        if status != 101:
            writer.close()
            raise Refused(status)
        answer = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
        expected = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        assert answer.get("sec-websocket-accept") == expected.decode(), answer
        return cls(reader, writer)

    def _send(self, opcode: int, payload: bytes = b"") -> None:
        assert len(payload) < 126
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    async def _frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = await self.reader.readexactly(2)
        length = b1 & 0x7F
        if length == 126:
            length = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        mask = await self.reader.readexactly(4) if b1 & 0x80 else None
        payload = await self.reader.readexactly(length)
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return bool(b0 & 0x80), b0 & 0x0F, payload

    async def _message(self) -> dict:
        data = b""
        while True:
            fin, opcode, payload = await self._frame()
            if opcode == 0x8:
                raise AssertionError(f"server closed the socket: {payload!r}")
            if opcode == 0x9:  # ping
                self._send(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            assert opcode in (0x0, 0x1), f"unexpected opcode {opcode}"  # text or continuation, never binary
            data += payload
            if fin:
                return json.loads(data.decode("utf-8"))

    async def recv(self) -> dict:
        try:
            return await asyncio.wait_for(self._message(), RECV_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"no frame within {RECV_TIMEOUT}s") from None

    async def frames_until(self, type: str) -> list[dict]:
        frames = []
        while not frames or frames[-1]["type"] != type:
            try:
                frames.append(await self.recv())
            except AssertionError as exc:
                got = [(f["seq"], f["type"]) for f in frames]
                raise AssertionError(f"waiting for {type!r}: {exc}; got {got}") from None
        return frames

    async def close(self):
        try:
            self._send(0x8, struct.pack("!H", 1000))
            await self.writer.drain()
        except ConnectionError:
            pass
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), RECV_TIMEOUT)
        except (TimeoutError, ConnectionError):
            pass


def ws_url(server, sid, after) -> str:
    return server.url.replace("http://", "ws://", 1) + f"/ws/sessions/{sid}/?after={after}"


def auth_header(user) -> dict[str, str]:
    return {"Authorization": bearer(user)[1].decode()}


@pytest.mark.slow
def test_worker_events_reach_a_socket_on_the_server_live_and_in_order(team, scripted_session, server, worker):
    """On either deployment, a browser-like client on the real daphne
    process watches a session while a turn runs on the real worker process. The worker's
    events (``job.running``, the answer's ``message.created``, ``job.succeeded``) arrive live —
    ``job.running`` while the job is still running — in seq order with no gaps, identical to
    the log. Embedded: through the database relay; with REDIS_URL: through channels-redis.
    A reconnect with ``?after=`` resumes exactly where the client left off."""
    api, sid = scripted_session(team.member, [{"sleep_ms": 2000}, {"text": "echo: {{prompt}}"}])
    headers = auth_header(team.member)
    origin = server.url

    async def body():
        client = await WsClient.connect(ws_url(server, sid, 0), headers, origin)
        try:
            first = await client.recv()
            assert first["seq"] == 1 and first["type"] == "session.created"
            r = await sync_to_async(api.post)(f"/api/sessions/{sid}/turns", {"prompt": "hi"})
            assert r.status_code == 202, r.content
            execution_id = r.json()["execution_id"]

            frames = [first] + await client.frames_until("job.running")
            # Live, not replayed at the end: the job is still inside its 2 s model call.
            status = (await sync_to_async(api.get)(f"/api/executions/{execution_id}")).json()["status"]
            assert status == "running", f"job.running arrived only when the job was {status!r}"

            frames += await client.frames_until("job.succeeded")
        finally:
            await client.close()

        # Resume after the person's prompt: exactly the rest, then a second turn live.
        again = await WsClient.connect(ws_url(server, sid, 2), headers, origin)
        try:
            resumed = await again.frames_until("job.succeeded")
            r = await sync_to_async(api.post)(f"/api/sessions/{sid}/turns", {"prompt": "again"})
            assert r.status_code == 202, r.content
            resumed += await again.frames_until("job.succeeded")
        finally:
            await again.close()
        return execution_id, frames, resumed

    execution_id, frames, resumed = run(body)

    assert_contiguous(frames, 1)
    assert [f["type"] for f in frames] == [
        "session.created", "message.created", "job.queued", "job.running", "message.created", "job.succeeded",
    ]
    assert frames[1]["payload"]["text"] == "hi"
    answer = frames[4]["payload"]
    assert answer["role"] == "assistant" and answer["text"] == "echo: hi"
    assert frames[3]["payload"]["job"] == execution_id and frames[5]["payload"]["job"] == execution_id
    assert frames == log_of(api, sid)[:6]

    assert_contiguous(resumed, 3)
    assert [f["type"] for f in resumed] == [
        "job.queued", "job.running", "message.created", "job.succeeded",  # the rest of turn 1
        "message.created", "job.queued", "job.running", "message.created", "job.succeeded",  # turn 2, live
    ]
    assert resumed[-2]["payload"]["text"] == "echo: again"
    assert resumed == log_of(api, sid, after=2)


@pytest.mark.slow
def test_server_refuses_non_members_and_foreign_origins(team, session_of, server):
    """On the real daphne process the handshake of an outsider, of an
    anonymous client and of a foreign Origin is rejected (HTTP 403, no upgrade); a member
    is accepted."""
    _, sid = session_of
    url = ws_url(server, sid, 0)

    async def attempt(headers, origin):
        try:
            client = await WsClient.connect(url, headers, origin)
        except Refused as exc:
            return exc.args[0]
        try:
            return await client.recv()
        finally:
            await client.close()

    member, outsider = auth_header(team.member), auth_header(team.outsider)

    async def body():
        return {
            "member": await attempt(member, server.url),
            "outsider": await attempt(outsider, server.url),
            "anonymous": await attempt({}, server.url),
            "evil_origin": await attempt(member, "http://evil.example"),
        }

    results = run(body)
    assert isinstance(results["member"], dict) and results["member"]["seq"] == 1, results
    assert {case: results[case] for case in ("outsider", "anonymous", "evil_origin")} == {
        "outsider": 403, "anonymous": 403, "evil_origin": 403,
    }


def test_a_commits_events_travel_as_one_message_and_arrive_in_order(transactional_db, team, session_of):
    """The events one transaction commits for a session
    go to its listeners as one message of the channel layer (one ``group_send`` per commit, not
    one per event), carrying them in ``seq`` order with ``event`` the last of them (what a reader
    of single events takes; it reads the rest from the log); a socket gets every one of them,
    contiguous and identical to the log."""
    from channels.layers import get_channel_layer

    from collab.events import deferred_event, send_events_on_commit
    from collab.realtime.push import pushed_wires, session_group

    api, sid = session_of
    auth = bearer(team.member)
    layer = get_channel_layer()

    def commit_three():
        with transaction.atomic():
            return [e.seq for e in send_events_on_commit(sid, [deferred_event("test.batch", {"n": i}) for i in range(3)])]

    async def body():
        channel = await layer.new_channel()
        await layer.group_add(session_group(sid), channel)
        comm = communicator(sid, 1, [ORIGIN, auth])
        assert (await comm.connect(timeout=RECV_TIMEOUT))[0]
        try:
            seqs = await sync_to_async(commit_three)()
            frames = await frames_through(comm, seqs[-1])
            messages = []  # what the group got for that commit (the embedded relay's pokes aside)
            while True:
                try:
                    messages.append(await asyncio.wait_for(layer.receive(channel), 0.5))
                except TimeoutError:
                    break
            return seqs, [m for m in messages if m["type"] != "collab.poke"], frames
        finally:
            await comm.disconnect()
            await layer.group_discard(session_group(sid), channel)

    seqs, messages, frames = run(body)
    assert len(messages) == 1, messages
    message = messages[0]
    assert message["type"] == "collab.event" and message["event"]["seq"] == seqs[-1]
    assert [w["seq"] for w in pushed_wires(message)] == seqs == [2, 3, 4]
    assert [w["payload"]["n"] for w in pushed_wires(message)] == [0, 1, 2]
    assert_contiguous(frames, 2)
    assert frames == log_of(api, sid, after=1)
