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
"""

import asyncio
import json
import logging

from channels.db import database_sync_to_async
from django.conf import settings
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from accounts.models import TokenScope
from accounts.policy import token_for
from collab.errors import DomainError, Forbidden, Invalid
from collab.gateway import acting_branch, call_tool_as, surface_of
from collab.realtime.bounds import Slot, open_wait
from collab.text import clean_text, loads_bounded
from collab.tools.registry import ToolResult

logger = logging.getLogger(__name__)

BRANCH_HEADER = "X-Trellis-Branch"
PATHS = ("/mcp", "/mcp/")

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


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    user, address = _standing()
    tools = await database_sync_to_async(surface_of)(user, address)
    return [types.Tool(name=t.name, description=t.description, inputSchema=t.json_schema()) for t in tools]


@server.call_tool(validate_input=False)  # the registry validates, answering with its own codes
async def call_tool(name: str, arguments: dict) -> types.CallToolResult:
    user, address = _standing()
    try:
        result = await call_tool_as(user, address, name, arguments)
    except DomainError as exc:  # refused before the tool ran (its bound, the acting branch gone)
        result = ToolResult.error(exc.code, exc.detail, tool=name, **exc.extra).as_dict()
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result["text"])],
        structuredContent=result["details"],
        isError=result["is_error"],
    )


def _admit(raw_token: str, address: str):
    """The token's user, if the token may call tools and its user may act as the branch at
    ``address``; else the refusal (a ``DomainError``, or None for an unknown token)."""
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
    return token.user


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
        if scope.get("method") == "POST":
            body = await _read_body(receive, MAX_BODY_BYTES)
            if body is None:
                await _answer(send, 413, f"the request body is larger than {MAX_BODY_BYTES} bytes", "body_too_large")
                return
            try:
                loads_bounded(body, max_chars=MAX_BODY_BYTES)
            except (ValueError, RecursionError) as exc:
                await _answer(send, 400, f"the request body is not JSON Trellis accepts: {str(exc)[:200]}", "invalid_json")
                return
            receive = _replaying(body, receive)
        stream = Slot()
        if scope.get("method") == "GET":  # the server's event stream: a long-lived connection
            try:
                stream = open_wait(admitted)
            except DomainError as exc:
                await _answer(send, exc.status, exc.detail, exc.code)
                return
        try:
            manager = await self._running_manager()
            await manager.handle_request({**scope, "trellis.user": admitted, "trellis.branch": address}, receive, send)
        finally:
            stream.free()


mcp_app = McpApp()
