"""Trellis as an MCP server: the tool gateway over MCP's Streamable HTTP
transport at ``/mcp``, with the official ``mcp`` SDK in its stateless mode.

An outside agent (Claude Code, Codex, Cursor, …) connects with a Trellis API token
(``Authorization: Bearer``, the ``tools`` scope, as for ``POST /api/branches/{address}/tools/{tool}``)
and names the branch it acts as in ``X-Trellis-Branch`` (an address as the gateway takes it:
``SID:HEAD`` or a branch name). Every HTTP request is authenticated and authorized afresh — the
transport is stateless, so a revoked token or a lost membership binds at the next request —
and is refused before MCP sees it as the REST gateway refuses it: 401 ``unauthenticated``,
403 ``token_scope``, 404 ``not_found`` (a branch the token's user may not see, another
project's included), 403 ``forbidden`` (one they may not act as).

``tools/list`` is the acting branch's surface with each tool's JSON Schema and description from
the registry; ``tools/call`` is ``collab.gateway.call_tool_as`` — the same authorization, chain
budgets, per-user bound on blocking calls and thread pool as the REST route. A tool's error
result, and a call the gateway refuses before running it (429 ``too_many_blocking_calls`` on
the REST route), become an MCP result with ``isError: true``: the text is ``<code>: <detail>``
and ``structuredContent`` the details with their ``code``. Arguments are validated by the
registry (not by the SDK), so a bad one answers ``invalid_arguments`` as on the REST route.

Daphne implements no ASGI lifespan, where the SDK expects its session manager's ``run()`` to
be entered. ``McpApp`` enters it lazily: the first request starts one long-lived task on the
server's event loop that holds ``run()`` open for the life of the process (a new manager if
that task ever ended, or the loop is another one).

DNS-rebinding protection (the SDK's ``TransportSecuritySettings``) follows ``DJANGO_ALLOWED_HOSTS``:
see ``transport_security``.

**Elicitation** (docs/api.md#trellis-as-an-mcp-server): while a call that waits runs (``job_output``
with ``block``, ``wait_agent``, a foreground ``agent``), the ``ask_person`` questions of the acting
branch's session that the caller may answer are sent to the client as ``elicitation/create``
requests on that call's own response stream, and the client's answer decides the question through
``collab.services.asks.decide`` — once, racing the web inbox safely. The stateless transport
cannot do this alone, in two ways, so this module does:

- *Which clients.* The client declares ``elicitation`` in ``initialize``, a request of its own
  that no later request's transport sees. When it does (and its token has the ``holds`` scope a
  decision needs), the ``initialize`` answer carries an ``Mcp-Session-Id`` that is a signed note
  of it (``client_note``); clients send that header on every later request, and any web process
  can read it — nothing is stored.
- *Where the answer goes.* The client POSTs its answer as a JSON-RPC response — to any web
  process, whose fresh transport knows no request it answers (the SDK would drop it). Each
  elicitation's id names its question (``trellis-ask:<id>``), so ``McpApp`` takes such a
  response itself, before the SDK, and decides the question as that request's user. The
  elicitation is sent with ``ServerSession.send_message`` (the SDK's way to send a message of
  our own making, with that id) on the waiting call's stream (``related_request_id``).
"""

import asyncio
import json
import logging

from channels.db import database_sync_to_async
from django.conf import settings
from django.core import signing
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from accounts.models import TokenScope
from accounts.policy import token_for
from collab import access
from collab.errors import Conflict, DomainError, Forbidden, Invalid, NotFound
from collab.gateway import acting_branch, awaits_a_child, call_tool_as, is_blocking, surface_of
from collab.realtime.bounds import Slot, open_wait
from collab.realtime.push import pushed_wires
from collab.realtime.subscription import Subscription
from collab.selectors.waiting import open_questions
from collab.services.asks import decide
from collab.text import clean_text, loads_bounded
from collab.tools.registry import ToolResult

logger = logging.getLogger(__name__)

BRANCH_HEADER = "X-Trellis-Branch"
SESSION_HEADER = "mcp-session-id"  # the transport's header: here, the signed note of what the client declared
PATHS = ("/mcp", "/mcp/")
ELICIT_PREFIX = "trellis-ask:"  # an elicitation's JSON-RPC id: this, then the question's id
NOTE_SALT = "trellis.mcp.client"
# while a call waits, the questions are read again at each event of the session, and at least this often
ELICIT_REREAD_SECONDS = 30.0
DECLINED = "declined in the MCP client"

server: Server = Server(
    "trellis",
    version="1",
    instructions=(
        "Trellis multi-agent collaboration: you act as one branch (the X-Trellis-Branch header), "
        "with that branch's tools and its owner's permissions."
    ),
)


def transport_security() -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection, from ``ALLOWED_HOSTS``: a request's ``Host`` must be
    one of them (on any port) and a browser's ``Origin`` one of them over http or https (or one
    of ``CSRF_TRUSTED_ORIGINS``). ``*`` (allowed with ``DJANGO_DEBUG`` only) turns it off, as it
    turns off Django's host check. The SDK matches names exactly: ``.example.com`` admits
    ``example.com`` here, not its subdomains — name those explicitly to reach ``/mcp`` on them."""
    hosts = [h.lstrip(".") for h in settings.ALLOWED_HOSTS if h]
    if "*" in hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = [f"[{h}]" if ":" in h and not h.startswith("[") else h for h in hosts]  # IPv6 literals
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[variant for h in names for variant in (h, f"{h}:*")],
        allowed_origins=[f"{scheme}://{h}{port}" for h in names for scheme in ("http", "https") for port in ("", ":*")]
        + list(settings.CSRF_TRUSTED_ORIGINS),
    )


def _standing() -> tuple[object, str]:
    """(user, branch address) of the request being served, set by ``McpApp``."""
    scope = server.request_context.request.scope
    return scope["trellis.user"], scope["trellis.branch"]


# --- elicitation: ask_person questions put to the client's person ---------------------------------


def client_note(user) -> str:
    """The ``Mcp-Session-Id`` an ``initialize`` that declared ``elicitation`` is answered with: a
    signed note that this user's client takes elicitations (never a session kept anywhere)."""
    return signing.dumps({"u": user.pk, "elicitation": True}, salt=NOTE_SALT, compress=True)


def takes_elicitations(headers: dict, token) -> bool:
    """Whether the request comes from a client that declared ``elicitation`` to this user (its
    ``Mcp-Session-Id`` is ``client_note``'s, for the token's user) and its token may decide
    (the ``holds`` scope, as ``POST /api/inbox/{id}`` needs)."""
    note = headers.get(SESSION_HEADER, "")
    if not note or not token.allows(TokenScope.HOLDS):
        return False
    try:
        said = signing.loads(note, salt=NOTE_SALT)
    except signing.BadSignature:
        return False
    return isinstance(said, dict) and said.get("u") == token.user_id and said.get("elicitation") is True


def _declares_elicitation(message) -> bool:
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return False
    capabilities = (message.get("params") or {}).get("capabilities") if isinstance(message.get("params"), dict) else None
    return isinstance(capabilities, dict) and isinstance(capabilities.get("elicitation"), dict)


def waits(tool: str, arguments) -> bool:
    """Whether a call may wait on other turns (so a question may come up meanwhile)."""
    return tool != "bash" and (is_blocking(tool, arguments) or awaits_a_child(tool, arguments))


def elicitation_of(item: dict) -> types.JSONRPCMessage:
    """A question (an inbox item) as an ``elicitation/create`` request whose id names it. The
    answer is one text (one of the choices, when there are any)."""
    answer = {"type": "string", "title": "Answer", "minLength": 1}
    if item["choices"]:
        answer["enum"] = list(item["choices"])
    where = f"{item['session_title'] or item['session']} › {item['branch_name']}"
    params = types.ElicitRequestFormParams(
        message=f"{item['agent'] or 'An agent'} asks you ({where}):\n\n{item['question']}",
        requestedSchema={"type": "object", "properties": {"answer": answer}, "required": ["answer"]},
    )
    data = types.ElicitRequest(params=params).model_dump(by_alias=True, mode="json", exclude_none=True)
    return types.JSONRPCMessage(types.JSONRPCRequest(jsonrpc="2.0", id=f"{ELICIT_PREFIX}{item['id']}", **data))


def _asked(message: dict) -> bool:
    """Whether a message of the session's group may bring a new question (an event of one, or the
    relay's poke: something happened)."""
    return message.get("type") == "collab.poke" or any(
        wire.get("type") == "question.asked" for wire in pushed_wires(message))


async def put_questions(context, user, address: str) -> None:
    """Until cancelled (the waiting call answered): each question of the acting branch's session
    that ``user`` may answer, sent once as an elicitation on the call's own stream. Re-reads at
    each event of the session that may bring one (and every ``ELICIT_REREAD_SECONDS``)."""
    branch = await database_sync_to_async(acting_branch)(user, address)
    subscription = await Subscription.open(branch.session_id)
    put: set[str] = set()
    try:
        while True:
            for item in await database_sync_to_async(open_questions)(user, branch.session_id):
                if item["id"] not in put:
                    put.add(item["id"])
                    await context.session.send_message(SessionMessage(
                        elicitation_of(item), metadata=ServerMessageMetadata(related_request_id=context.request_id)))
            if not subscription.listening:
                return  # no channel layer to hear of later questions: the inbox has them
            message = None
            while message is None or not _asked(message):
                message = await subscription.next(ELICIT_REREAD_SECONDS)
                if message is None:
                    break
    finally:
        subscription.close_soon()


def answer_elicitation(token, message: dict) -> None:
    """A client's answer to one of our elicitations (``message``: its JSON-RPC response), as the
    token's user: ``accept`` answers the question, ``decline`` rejects it, ``cancel`` (or an
    error) leaves it waiting in the inbox. An answer that does not fit (empty, not one of the
    choices) and a question decided meanwhile (in the inbox, or by another answer) change
    nothing: the client hears 202 all the same — the SDK's client ends its session on any other
    answer to a response. ``NotFound`` for a question the user may not answer, ``Forbidden``
    for a token without the ``holds`` scope."""
    if not token.allows(TokenScope.HOLDS):
        raise Forbidden(f"answering a question needs a token with the '{TokenScope.HOLDS}' scope",
                        code="token_scope", scope=str(TokenScope.HOLDS))
    ask = access.access_ask(token.user, message["id"][len(ELICIT_PREFIX):])
    if ask.kind != "question":
        raise NotFound()
    result = message.get("result")
    if not isinstance(result, dict) or result.get("action") not in ("accept", "decline"):
        return  # cancelled, or the client could not ask: it still waits in the inbox
    content = result.get("content") if isinstance(result.get("content"), dict) else {}
    try:
        if result["action"] == "accept":
            decide(token.user, ask, "answer", answer=content.get("answer") if isinstance(content.get("answer"), str) else "")
        else:
            decide(token.user, ask, "reject", reason=DECLINED)
    except (Conflict, Invalid) as exc:
        logger.info("an MCP client's answer to question %s changed nothing: %s", ask.pk, exc.detail)


def _is_elicitation_answer(message) -> bool:
    return (isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)
            and isinstance(message.get("id"), str) and message["id"].startswith(ELICIT_PREFIX))


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    user, address = _standing()
    tools = await database_sync_to_async(surface_of)(user, address)
    return [types.Tool(name=t.name, description=t.description, inputSchema=t.json_schema()) for t in tools]


@server.call_tool(validate_input=False)  # the registry validates, answering with its own codes
async def call_tool(name: str, arguments: dict) -> types.CallToolResult:
    user, address = _standing()
    context = server.request_context
    asking = None
    if context.request.scope.get("trellis.elicits") and waits(name, arguments):
        asking = asyncio.ensure_future(put_questions(context, user, address))
    try:
        result = await call_tool_as(user, address, name, arguments)
    except DomainError as exc:  # refused before the tool ran (its bound, the acting branch gone)
        result = ToolResult.error(exc.code, exc.detail, tool=name, **exc.extra).as_dict()
    finally:
        if asking is not None:
            asking.cancel()
            asking.add_done_callback(_consume)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result["text"])],
        structuredContent=result["details"],
        isError=result["is_error"],
    )


def _consume(task: asyncio.Future) -> None:
    """The elicitations' task, ended: its failure is logged (the call it served answers anyway)."""
    if not task.cancelled() and task.exception() is not None:
        logger.warning("sending questions to an MCP client failed", exc_info=task.exception())


def _admit(raw_token: str, address: str):
    """The token, if it may call tools and its user may act as the branch at ``address``; else
    the refusal (a ``DomainError``, or None for an unknown token)."""
    token = token_for(raw_token)
    if token is None:
        return None
    if not token.allows(TokenScope.TOOLS):
        return Forbidden(f"this token lacks the '{TokenScope.TOOLS}' scope (it has: {', '.join(token.scopes) or 'none'})",
                         code="token_scope", scope=str(TokenScope.TOOLS))
    if not address:
        return Invalid(f"name the branch to act as in the {BRANCH_HEADER} header ('SID:HEAD' or a branch name)",
                       code="invalid_address")
    try:
        acting_branch(token.user, address)
    except DomainError as exc:
        return exc
    return token


async def _answer(send, status: int, detail: str, code: str, extra: dict | None = None, headers=()) -> None:
    body = json.dumps({**(extra or {}), "detail": detail, "code": code}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


# a JSON-RPC message (a tool call's arguments included) is read whole and checked before the SDK
# parses it: at most this large, nested at most ``collab.text.MAX_JSON_DEPTH`` deep
MAX_BODY_BYTES = 4 * 1024 * 1024


async def _read_body(receive, limit: int) -> bytes | None:
    """The request's whole body, or None once it exceeds ``limit`` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client left: the SDK sees the body so far and its end
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive):
    """``receive`` for the SDK: the body already read, then whatever comes after it (a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay():
        return pending.pop() if pending else await receive()

    return replay


def _noting(send, note: str):
    """``send`` for the SDK's answer to ``initialize``: with ``note`` as its ``Mcp-Session-Id``."""

    async def noted(message):
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != SESSION_HEADER.encode()]
            message = {**message, "headers": [*headers, (SESSION_HEADER.encode(), note.encode("ascii"))]}
        await send(message)

    return noted


class McpApp:
    """The ASGI app at ``/mcp``: authenticate, authorize the acting branch, then the SDK."""

    def __init__(self):
        self._manager: StreamableHTTPSessionManager | None = None
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Event | None = None
        self._loop = None

    async def _running_manager(self) -> StreamableHTTPSessionManager:
        """The session manager, inside its ``run()`` (started on first use: daphne sends no
        lifespan events). The check and the start run without an await between them, so two
        first requests on one loop start one task."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            manager = StreamableHTTPSessionManager(app=server, stateless=True, security_settings=transport_security())
            ready = asyncio.Event()
            self._manager, self._ready, self._loop = manager, ready, loop
            self._task = loop.create_task(self._hold_open(manager, ready), name="mcp-session-manager")
        task = self._task
        await self._ready.wait()
        if task.done():  # it could not start: this request fails, the next one tries again
            raise RuntimeError("the MCP session manager did not start") from (None if task.cancelled() else task.exception())
        return self._manager

    @staticmethod
    async def _hold_open(manager: StreamableHTTPSessionManager, ready: asyncio.Event) -> None:
        try:
            async with manager.run():
                ready.set()
                await asyncio.Event().wait()  # for the life of the process
        except Exception:
            logger.exception("the MCP session manager stopped (the next request starts another)")
            raise
        finally:
            ready.set()  # never leave a request waiting on a manager that is gone

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
        scheme, _, raw = headers.get("authorization", "").partition(" ")
        address = clean_text(headers.get(BRANCH_HEADER.lower(), "")).strip()
        admitted = None
        if scheme.lower() == "bearer" and raw.strip():
            admitted = await database_sync_to_async(_admit)(raw.strip(), address)
        if admitted is None:
            await _answer(send, 401, "authentication required: a Bearer token with the 'tools' scope", "unauthenticated",
                          headers=[(b"www-authenticate", b"Bearer")])
            return
        if isinstance(admitted, DomainError):
            await _answer(send, admitted.status, admitted.detail, admitted.code, admitted.extra)
            return
        token, user = admitted, admitted.user
        if scope.get("method") == "POST":
            body = await _read_body(receive, MAX_BODY_BYTES)
            if body is None:
                await _answer(send, 413, f"the request body is larger than {MAX_BODY_BYTES} bytes", "body_too_large")
                return
            try:
                message = loads_bounded(body, max_chars=MAX_BODY_BYTES)
            except (ValueError, RecursionError) as exc:
                await _answer(send, 400, f"the request body is not JSON Trellis accepts: {str(exc)[:200]}", "invalid_json")
                return
            if _is_elicitation_answer(message):  # no transport of the SDK knows the request it answers
                try:
                    await database_sync_to_async(answer_elicitation)(token, message)
                except DomainError as exc:
                    await _answer(send, exc.status, exc.detail, exc.code, exc.extra)
                    return
                await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"0")]})
                await send({"type": "http.response.body", "body": b""})
                return
            if _declares_elicitation(message) and token.allows(TokenScope.HOLDS):
                send = _noting(send, client_note(user))
            receive = _replaying(body, receive)
        stream = Slot()
        if scope.get("method") == "GET":  # the server's event stream: a long-lived connection
            try:
                stream = open_wait(user)
            except DomainError as exc:
                await _answer(send, exc.status, exc.detail, exc.code)
                return
        try:
            manager = await self._running_manager()
            await manager.handle_request({**scope, "trellis.user": user, "trellis.branch": address,
                                          "trellis.elicits": takes_elicitations(headers, token)}, receive, send)
        finally:
            stream.free()


mcp_app = McpApp()
