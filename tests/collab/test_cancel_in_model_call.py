"""A cancel aborts the model call in flight, streaming or not, even when the model sends nothing.

A turn on the real worker process calls a local server speaking OpenAI's Chat Completions or
Anthropic's Messages API that stalls: streaming, it sends the first chunk and then nothing for
``STALL`` seconds; not streaming, it sends nothing at all for as long. While the request is in
flight the execution is cancelled through the API. The worker's stop watch sees the job
``stopping`` and aborts the call from its own thread — which only works if the abort wakes the
turn's thread blocked reading the socket (closing an HTTP client from another thread does not:
the read goes on, and no FIN is sent, until the model answers or the read times out) — so:

- the job ends ``cancelled`` within a few seconds of the cancel, long before the stall would
  have ended by itself (one stop-watch beat plus the completion, on a loaded machine);
- the server sees its client hang up (the TCP connection closed from the worker's side) as
  soon as that: the request was aborted, not left running on a thread the cancel forgot;
- the model is not called again (an aborted call is not a failure to retry) and the turn
  writes no answer.

The server (``StallingLLM``) watches each stalled connection for the client's end of it, which
``tests/collab/fake_llm.py``'s server only learns of when a write fails — and a stalled server
writes nothing.
"""

import json
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from collab.runtime.providers.mapping import TITLE_SYSTEM
from tests.collab.test_providers import KEY_ENV, operator_connection  # sets the key's variable before the worker starts
from tests.conftest import TERMINAL, cancel, execution, open_session, poll, turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

STALL = 30.0  # how long the server holds a request before it answers, unless released
PROMPT = 5.0  # what "at once" may take on a loaded machine (two suites on two cores)


@dataclass
class Call:
    path: str
    body: dict
    stream: bool
    received_at: float
    in_flight_at: float | None = None  # the first chunk sent (streaming) or the request read (not)
    disconnected_at: float | None = None  # the client closed the connection while the server held it
    answered_at: float | None = None  # the stall ended and the server answered (nobody hung up)


def _sse(event: str | None, data) -> bytes:
    return ((f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n").encode()


class OpenAIWire:
    """Chat Completions (``/v1/chat/completions``)."""

    name = "openai"

    @staticmethod
    def is_title(body: dict) -> bool:
        first = (body.get("messages") or [{}])[0]
        return first.get("role") == "system" and first.get("content") == TITLE_SYSTEM

    @staticmethod
    def chunk(delta: dict, finish=None) -> bytes:
        return _sse(None, {"id": "chatcmpl-stall", "object": "chat.completion.chunk", "created": 1, "model": "fake",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    @classmethod
    def first_chunk(cls) -> bytes:
        return cls.chunk({"role": "assistant", "content": "Let me think"})

    @classmethod
    def rest_of_stream(cls) -> bytes:
        return cls.chunk({"content": " ... done."}) + cls.chunk({}, "stop") + b"data: [DONE]\n\n"

    @staticmethod
    def completion(text: str) -> bytes:
        return json.dumps({
            "id": "chatcmpl-stall", "object": "chat.completion", "created": 1, "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }).encode()


class AnthropicWire:
    """The Messages API (``/v1/messages``)."""

    name = "anthropic"

    @staticmethod
    def is_title(body: dict) -> bool:
        return body.get("system") == TITLE_SYSTEM

    @staticmethod
    def first_chunk() -> bytes:
        return _sse("message_start", {"type": "message_start", "message": {
            "id": "msg_stall", "type": "message", "role": "assistant", "model": "fake", "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 11, "output_tokens": 1}}}) + _sse(
            "content_block_start", {"type": "content_block_start", "index": 0,
                                    "content_block": {"type": "text", "text": ""}}) + _sse(
            "content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": "Let me think"}})

    @staticmethod
    def rest_of_stream() -> bytes:
        return (_sse("content_block_stop", {"type": "content_block_stop", "index": 0})
                + _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                            "stop_sequence": None},
                                         "usage": {"output_tokens": 7}})
                + _sse("message_stop", {"type": "message_stop"}))

    @staticmethod
    def completion(text: str) -> bytes:
        return json.dumps({
            "id": "msg_stall", "type": "message", "role": "assistant", "model": "fake",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 7},
        }).encode()


class _StallingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "StallingLLM/1.0"

    def log_message(self, *args):
        pass

    def do_POST(self):
        fake: StallingLLM = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        wire = AnthropicWire if self.path.endswith("/messages") else OpenAIWire
        if wire.is_title(body):
            return self._send_json(wire.completion("A Title"))  # branch naming: answered at once
        call = Call(self.path, body, bool(body.get("stream")), time.monotonic())
        fake.record(call)
        try:
            if call.stream:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(wire.first_chunk())
                self.wfile.flush()
            fake.in_flight(call)
            if self._held(fake, call):
                return
            call.answered_at = time.monotonic()
            if call.stream:
                self.wfile.write(wire.rest_of_stream())
                self.wfile.flush()
                self.close_connection = True
            else:
                self._send_json(wire.completion("a late answer"))
        except OSError:  # the client hung up while we wrote
            fake.hung_up(call)
            self.close_connection = True

    def _send_json(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _held(self, fake, call) -> bool:
        """Send nothing until the stall ends or the server is released, watching the connection:
        True (and recorded) as soon as the client closes its end."""
        deadline = call.received_at + STALL
        sock = self.connection
        while time.monotonic() < deadline and not fake.released.is_set():
            readable, _, _ = select.select([sock], [], [], 0.05)
            if not readable:
                continue
            try:
                peeked = sock.recv(1, socket.MSG_PEEK)
            except OSError:
                peeked = b""
            if not peeked:  # end of stream: the client closed the connection
                fake.hung_up(call)
                self.close_connection = True
                return True
            time.sleep(0.05)  # bytes we do not expect (a next request on this connection): keep holding
        return False


class StallingLLM:
    """A local OpenAI-compatible server whose completions stall (see the module's docstring)."""

    def __init__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _StallingHandler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.calls: list[Call] = []
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="stalling-llm", daemon=True)

    def start(self) -> "StallingLLM":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset(self) -> None:
        with self.lock:
            self.calls = []
        self.released.clear()

    def release(self) -> None:
        """End every stall now (a test's cleanup: a turn the cancel did not abort is not left hanging)."""
        self.released.set()

    def record(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def in_flight(self, call: Call) -> None:
        call.in_flight_at = time.monotonic()

    def hung_up(self, call: Call) -> None:
        if call.disconnected_at is None:
            call.disconnected_at = time.monotonic()


@pytest.fixture(scope="module")
def stalling_server():
    server = StallingLLM().start()
    yield server
    server.stop()


@pytest.fixture
def stalling(stalling_server, worker):
    """The stalling server, fresh for this test; released before the worker is let go quiet."""
    stalling_server.reset()
    yield stalling_server
    stalling_server.release()


def _session_on_stalling_model(team, api_as, server, wire, stream: bool):
    base_url = server.url + "/v1" if wire is OpenAIWire else server.url  # as each SDK appends its path
    operator_connection(f"stalling-{wire.name}", wire.name, base_url, KEY_ENV[wire.name])
    agent_id = f"stalls-{wire.name}-{'stream' if stream else 'whole'}"
    r = api_as(team.owner).post("/api/projects/alpha/agent-specs", {
        "agent_id": agent_id, "provider": wire.name, "model": "fake-model", "connection": f"stalling-{wire.name}",
        # the SDK's own read timeout is far longer than the stall: only the cancel can end it early
        "limits": {"stream": stream, "timeout_seconds": 4 * STALL},
    })
    assert r.status_code == 201, r.content
    api = api_as(team.member)
    return api, open_session(api, agent_id, title="stalls")


@pytest.mark.parametrize("wire", [OpenAIWire, AnthropicWire], ids=["openai", "anthropic"])
@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not-streaming"])
def test_cancel_aborts_a_stalled_model_call_at_once(team, api_as, stalling, wire, stream):
    from collab.models import Message

    api, sid = _session_on_stalling_model(team, api_as, stalling, wire, stream)
    eid = turn(api, sid, "think about it")
    poll(lambda: stalling.calls and stalling.calls[0].in_flight_at, timeout=60,
         what="the model call to be in flight")
    call = stalling.calls[0]
    assert call.stream is stream
    assert execution(api, eid)["status"] == "running"
    time.sleep(0.3)  # the request is really parked in the worker's read, not on its way

    r = cancel(api, eid)
    assert r.status_code == 202, r.content
    cancelled_at = time.monotonic()

    def ended():
        body = execution(api, eid)
        return body if body["status"] in TERMINAL else None

    try:
        done = poll(ended, timeout=STALL - 5, interval=0.05, what="the cancelled turn to end")
    except AssertionError:
        pytest.fail(
            f"{wire.name} {'streaming' if stream else 'non-streaming'} call: the turn was still "
            f"{execution(api, eid)['status']!r} {time.monotonic() - cancelled_at:.1f}s after the cancel; the "
            f"server {'saw the client hang up after %.1fs' % (call.disconnected_at - cancelled_at) if call.disconnected_at else 'never saw the client hang up'}: "
            "the model call in flight was not aborted")
    took = time.monotonic() - cancelled_at
    assert done["status"] == "cancelled", done
    assert took < PROMPT, f"the turn ended {took:.1f}s after the cancel"

    stalling_server_saw = poll(lambda: call.disconnected_at or call.answered_at, timeout=PROMPT, interval=0.02,
                               what="the server to see the client hang up")
    assert call.disconnected_at is not None and call.answered_at is None, (
        "the server answered at the end of its stall: the request was left running")
    assert stalling_server_saw - cancelled_at < PROMPT, f"the connection closed {stalling_server_saw - cancelled_at:.1f}s after the cancel"
    print(f"{wire.name} {'streaming' if stream else 'non-streaming'}: cancelled after {took:.2f}s, "
          f"connection closed after {call.disconnected_at - cancelled_at:.2f}s")

    assert len(stalling.calls) == 1, [c.path for c in stalling.calls]  # an aborted call is not retried
    assert not Message.objects.filter(job_id=eid, role="assistant").exists()
