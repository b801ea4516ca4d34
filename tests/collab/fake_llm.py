"""A local HTTP server that speaks OpenAI Chat Completions and the Anthropic Messages API.

It runs in a thread of the test process on 127.0.0.1 (so a worker subprocess
reaches it too), records every request it receives (path, headers, JSON body)
and answers each with a ``Reply``: a JSON body with a status, or a stream of
server-sent events, optionally slow. Replies come from a FIFO queue
(``server.add(...)``) or, when that is empty, from ``server.responder(request)``
(default: a plain text answer in the request's dialect).

``OpenAIDialect`` and ``AnthropicDialect`` build the replies, so one test can
run against both providers.
"""

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from collections.abc import Callable


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict = field(default_factory=dict)
    events: list | None = None  # SSE: [(event name or None, data str)]
    delay: float = 0.0  # before the response (non-streaming) or between events (streaming)


@dataclass
class Request:
    path: str
    headers: dict
    body: dict
    received_at: float
    method: str = "POST"


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeLLM/1.0"

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        fake: FakeLLM = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode(errors="replace")}
        request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic(), self.command)
        reply = fake.reply_for(request)
        fake.record(request)
        try:
            self._send(fake, reply)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            fake.disconnected(request)

    # every request is recorded, whatever its method (a followed 302 arrives as a GET)
    do_GET = do_PUT = do_PATCH = do_DELETE = do_POST

    def _send(self, fake, reply: Reply):
        if reply.events is None:
            if reply.delay:
                time.sleep(reply.delay)
            data = json.dumps(reply.body if reply.body is not None else {}).encode()
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(reply.status)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.close_connection = True
        for n, (event, data) in enumerate(reply.events):
            if n and reply.delay:
                time.sleep(reply.delay)
            frame = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
            self.wfile.write(frame.encode())
            self.wfile.flush()
            fake.chunk_sent()


class FakeLLM:
    def __init__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-llm", daemon=True)
        self.reset()

    def start(self) -> "FakeLLM":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset(self) -> None:
        with self.lock:
            self.requests: list[Request] = []
            self.queue: deque = deque()
            self.responder: Callable[[Request], Reply] | None = None
            self.chunks = 0
            self.disconnects: list[tuple[Request, float]] = []

    # --- scripting -------------------------------------------------------------------------

    def add(self, *replies: Reply) -> None:
        with self.lock:
            self.queue.extend(replies)

    def reply_for(self, request: Request) -> Reply:
        with self.lock:
            if self.queue:
                return self.queue.popleft()
            responder = self.responder
        if responder is not None:
            return responder(request)
        dialect = AnthropicDialect if request.path.endswith("/messages") else OpenAIDialect
        return dialect.text("ok", stream=bool(request.body.get("stream")))

    # --- observations ----------------------------------------------------------------------

    def record(self, request: Request) -> None:
        with self.lock:
            self.requests.append(request)

    def chunk_sent(self) -> None:
        with self.lock:
            self.chunks += 1

    def disconnected(self, request: Request) -> None:
        with self.lock:
            self.disconnects.append((request, time.monotonic()))

    def wait(self, condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"fake LLM: {what} not reached after {timeout}s ({len(self.requests)} requests)")
            time.sleep(0.02)


def _split(text: str, pieces: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // pieces))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _args_text(arguments) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class _Shorthands:
    """``text`` and ``tools`` replies, in terms of each dialect's ``answer``."""

    @classmethod
    def text(cls, text: str, *, stream: bool = False, usage=(11, 7), delay: float = 0.0, pieces: int = 3) -> Reply:
        return cls.answer(text=text, stream=stream, usage=usage, delay=delay, pieces=pieces)

    @classmethod
    def tools(cls, calls, *, text: str = "", stream: bool = False, usage=(11, 7)) -> Reply:
        return cls.answer(text=text, calls=calls, stream=stream, usage=usage)


class OpenAIDialect(_Shorthands):
    """Chat Completions replies. Tool calls are ``(id, name, arguments)``; arguments are a
    dict, or a string sent verbatim (for malformed JSON)."""

    name = "openai"
    path = "/v1/chat/completions"

    @staticmethod
    def base_url(server: FakeLLM) -> str:
        return server.url + "/v1"

    @staticmethod
    def answer(text="", calls=(), *, stream=False, usage=(11, 7), delay=0.0, pieces=3) -> Reply:
        finish = "tool_calls" if calls else "stop"
        if not stream:
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": _args_text(args)}}
                    for cid, name, args in calls
                ]
            return Reply(body={
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": "fake",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
            }, delay=delay)

        def chunk(delta, finish_reason=None, **extra):
            return json.dumps({
                "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra,
            })

        events = [(None, chunk({"role": "assistant", "content": ""}))]
        events += [(None, chunk({"content": piece})) for piece in _split(text, pieces)]
        for i, (cid, name, args) in enumerate(calls):
            events.append((None, chunk({"tool_calls": [
                {"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}]})))
            for fragment in _split(_args_text(args), 3):
                events.append((None, chunk({"tool_calls": [{"index": i, "function": {"arguments": fragment}}]})))
        events.append((None, chunk({}, finish)))
        events.append((None, json.dumps({
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake", "choices": [],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        })))
        events.append((None, "[DONE]"))
        return Reply(events=events, delay=delay)

    @staticmethod
    def error(status: int, message: str, headers=None) -> Reply:
        return Reply(status=status, body={"error": {"message": message, "type": "fake_error", "code": None}},
                     headers=headers or {})

    # --- reading requests ---

    @staticmethod
    def messages(request: Request) -> list[dict]:
        return request.body.get("messages", [])

    @staticmethod
    def tool_names(request: Request) -> list[str]:
        return [t["function"]["name"] for t in request.body.get("tools", [])]

    @staticmethod
    def tool_schema(request: Request, name: str) -> dict:
        return next(t["function"]["parameters"] for t in request.body["tools"] if t["function"]["name"] == name)

    @staticmethod
    def system(request: Request) -> str:
        first = OpenAIDialect.messages(request)[:1]
        return first[0]["content"] if first and first[0]["role"] == "system" else ""

    @staticmethod
    def user_texts(request: Request) -> list[str]:
        return [m["content"] for m in OpenAIDialect.messages(request) if m["role"] == "user"]

    @staticmethod
    def ends_with_tool_result(request: Request) -> bool:
        return OpenAIDialect.messages(request)[-1]["role"] == "tool"

    @staticmethod
    def last_role(request: Request) -> str:
        return OpenAIDialect.messages(request)[-1]["role"]

    @staticmethod
    def key(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        return auth.removeprefix("Bearer ")

    @staticmethod
    def flat(request: Request) -> list[tuple]:
        """The conversation as (role, what) pairs: ("user", text), ("assistant", text),
        ("call", name), ("result", call id)."""
        out = []
        for m in OpenAIDialect.messages(request):
            if m["role"] == "system":
                continue
            if m["role"] == "tool":
                out.append(("result", m["tool_call_id"]))
                continue
            if m.get("content"):
                out.append((m["role"], m["content"]))
            for call in m.get("tool_calls") or []:
                out.append(("call", call["function"]["name"]))
        return out

    @staticmethod
    def results(request: Request) -> dict:
        return {m["tool_call_id"]: m["content"] for m in OpenAIDialect.messages(request) if m["role"] == "tool"}


class AnthropicDialect(_Shorthands):
    """Messages API replies. Tool uses are ``(id, name, input)``; a string input is streamed
    verbatim as ``partial_json`` (for malformed JSON)."""

    name = "anthropic"
    path = "/v1/messages"

    @staticmethod
    def base_url(server: FakeLLM) -> str:
        return server.url

    @staticmethod
    def answer(text="", calls=(), *, stream=False, usage=(11, 7), delay=0.0, pieces=3) -> Reply:
        stop = "tool_use" if calls else "end_turn"
        if not stream:
            content = [{"type": "text", "text": text}] if text else []
            content += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls]
            return Reply(body={
                "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake", "content": content,
                "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
            }, delay=delay)
        ev = lambda kind, **data: (kind, json.dumps({"type": kind, **data}))  # noqa: E731
        events = [ev("message_start", message={
            "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake", "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": usage[0], "output_tokens": 1},
        })]
        index = 0
        if text:
            events.append(ev("content_block_start", index=index, content_block={"type": "text", "text": ""}))
            events.append(ev("ping"))
            events += [ev("content_block_delta", index=index, delta={"type": "text_delta", "text": p})
                       for p in _split(text, pieces)]
            events.append(ev("content_block_stop", index=index))
            index += 1
        for cid, name, args in calls:
            events.append(ev("content_block_start", index=index,
                             content_block={"type": "tool_use", "id": cid, "name": name, "input": {}}))
            events += [ev("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": f})
                       for f in _split(_args_text(args), 3)]
            events.append(ev("content_block_stop", index=index))
            index += 1
        events.append(ev("message_delta", delta={"stop_reason": stop, "stop_sequence": None},
                         usage={"output_tokens": usage[1]}))
        events.append(ev("message_stop"))
        return Reply(events=events, delay=delay)

    @staticmethod
    def error(status: int, message: str, headers=None) -> Reply:
        kind = {401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
        return Reply(status=status, body={"type": "error", "error": {"type": kind, "message": message}},
                     headers=headers or {})

    # --- reading requests ---

    @staticmethod
    def messages(request: Request) -> list[dict]:
        return request.body.get("messages", [])

    @staticmethod
    def tool_names(request: Request) -> list[str]:
        return [t["name"] for t in request.body.get("tools", [])]

    @staticmethod
    def tool_schema(request: Request, name: str) -> dict:
        return next(t["input_schema"] for t in request.body["tools"] if t["name"] == name)

    @staticmethod
    def system(request: Request) -> str:
        return request.body.get("system", "")

    @staticmethod
    def _blocks(message) -> list[dict]:
        content = message["content"]
        return [{"type": "text", "text": content}] if isinstance(content, str) else content

    @staticmethod
    def user_texts(request: Request) -> list[str]:
        return ["\n\n".join(b["text"] for b in AnthropicDialect._blocks(m) if b["type"] == "text")
                for m in AnthropicDialect.messages(request)
                if m["role"] == "user" and any(b["type"] == "text" for b in AnthropicDialect._blocks(m))]

    @staticmethod
    def ends_with_tool_result(request: Request) -> bool:
        last = AnthropicDialect.messages(request)[-1]
        return last["role"] == "user" and AnthropicDialect._blocks(last)[-1]["type"] == "tool_result"

    @staticmethod
    def last_role(request: Request) -> str:
        return AnthropicDialect.messages(request)[-1]["role"]

    @staticmethod
    def key(request: Request) -> str:
        # the Messages API takes the key as x-api-key; SDK 2.x sends it as a bearer token
        return request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")

    @staticmethod
    def flat(request: Request) -> list[tuple]:
        out = []
        for m in AnthropicDialect.messages(request):
            for b in AnthropicDialect._blocks(m):
                if b["type"] == "text":
                    out.append((m["role"], b["text"]))
                elif b["type"] == "tool_use":
                    out.append(("call", b["name"]))
                elif b["type"] == "tool_result":
                    out.append(("result", b["tool_use_id"]))
        return out

    @staticmethod
    def results(request: Request) -> dict:
        return {b["tool_use_id"]: b["content"] for m in AnthropicDialect.messages(request)
                for b in AnthropicDialect._blocks(m) if b["type"] == "tool_result"}


DIALECTS = {"openai": OpenAIDialect, "anthropic": AnthropicDialect}
