"""Trellis as an MCP server at ``/mcp`` (``collab.mcp_server``).

Everything here goes through the official ``mcp`` SDK's own client (Streamable HTTP +
``ClientSession``) or plain HTTP against a real daphne process — which sends no ASGI lifespan
events, so every test also shows the SDK's session manager started without one. The answers
are compared with the REST tool gateway's for the same calls: one authorization, one set of
codes."""

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from accounts.models import ApiToken, TokenScope
from collab.models import Branch, Job
from collab.tools.registry import tools_for
from collab.tools.surface import branch_tools
from tests.conftest import ROOT, _stop, free_port, poll

pytestmark = pytest.mark.slow

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


def token(user, scopes=None) -> str:
    return ApiToken.issue(user, name="mcp-test", scopes=scopes or TokenScope.values)[1]


def head_address(api, sid, prompt="go") -> tuple[str, str]:
    """A user turn gives the session's main branch a head: (its address, the turn's execution id)."""
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    return f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}", r.json()["execution_id"]


@asynccontextmanager
async def mcp_session(server, raw_token: str, address: str):
    """The SDK's client on ``/mcp``, acting as the branch at ``address``."""
    headers = {"Authorization": f"Bearer {raw_token}", "X-Trellis-Branch": address}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60, read=120)) as http:
        async with streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def over_mcp(server, raw_token: str, address: str, work):
    """``await work(session)`` in a fresh event loop, on an initialized MCP session."""

    async def main():
        async with mcp_session(server, raw_token, address) as session:
            return await work(session)

    return asyncio.run(main())


def rest(server, raw_token: str, method: str, path: str, body=None) -> tuple[int, dict]:
    """One call to the same daphne's REST API: (status, JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {raw_token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def raw_mcp(server, headers: dict, body=INITIALIZE) -> httpx.Response:
    """One plain HTTP POST to ``/mcp`` (what any MCP client sends first)."""
    return httpx.post(f"{server.url}/mcp", json=body, headers={
        "Accept": "application/json, text/event-stream", **headers}, timeout=30)


def test_tools_are_listed_with_the_registrys_schemas_and_descriptions(team, scripted_session, server):
    """``tools/list`` is the acting branch's surface from the registry: a collab branch gets the
    whole collab toolset, an OpenWork branch its own; each tool with its JSON Schema and
    description. Calls answer like the REST gateway's, errors as ``isError`` with the code."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address, _ = head_address(api, sid)
    _, ow_sid = scripted_session(team.member, [{"text": "ok"}], agent_id="ow", toolset="openwork")
    ow_address, _ = head_address(api, ow_sid)
    raw = token(team.member)

    async def work(session):
        listed = (await session.list_tools()).tools
        ok = await session.call_tool("todo_list", {})
        bad = await session.call_tool("todo_list", {"bogus": 1})
        unknown = await session.call_tool("spawn_agent", {"prompt": "x"})  # an openwork tool
        return listed, ok, bad, unknown

    listed, ok, bad, unknown = over_mcp(server, raw, address, work)
    registry = tools_for("collab")
    assert [t.name for t in listed] == [t.name for t in registry]
    assert {t.name: (t.description, t.inputSchema) for t in listed} == {
        t.name: (t.description, t.json_schema()) for t in registry}

    for answer, arguments, tool in [(ok, {}, "todo_list"), (bad, {"bogus": 1}, "todo_list"),
                                    (unknown, {"prompt": "x"}, "spawn_agent")]:
        status, gateway = rest(server, raw, "POST", f"/api/branches/{address}/tools/{tool}", {"arguments": arguments})
        assert status == 200
        assert (answer.isError, answer.content[0].text, answer.structuredContent) == (
            gateway["is_error"], gateway["text"], gateway["details"])
    assert bad.isError and bad.structuredContent["code"] == "invalid_arguments"
    assert bad.content[0].text.startswith("invalid_arguments: ")
    assert unknown.isError and unknown.structuredContent["code"] == "unknown_tool"

    ow_listed = over_mcp(server, raw, ow_address, lambda s: s.list_tools())
    surface = branch_tools(Branch.objects.get(session_id=ow_sid, parent_branch=None))
    assert {"spawn_agent", "wait_agent"} <= {t.name for t in surface}
    assert [(t.name, t.description, t.inputSchema) for t in ow_listed.tools] == [
        (t.name, t.description, t.json_schema()) for t in surface]


def test_a_background_agent_spawned_over_mcp_returns_its_result(team, scripted_session, server, worker):
    """``agent(run_in_background=true)`` over MCP starts a child on a real worker; ``job_output``
    (blocking, on the gateway's pool) receives its final answer."""
    script = {"user": [{"text": "ready"}], "spawn": [{"text": "scout report: {{prompt}}"}],
              "followup": [{"text": "noted"}]}
    api, sid = scripted_session(team.member, script)
    address, first = head_address(api, sid)
    assert api.wait(first)["status"] == "succeeded"
    raw = token(team.member)

    async def work(session):
        spawned = await session.call_tool("agent", {"prompt": "count the files", "description": "scout",
                                                    "run_in_background": True})
        assert not spawned.isError, spawned
        job_id = spawned.structuredContent["execution_id"]
        output = await session.call_tool("job_output", {"job_id": job_id, "block": True, "timeout": 60_000})
        return spawned, output

    spawned, output = over_mcp(server, raw, address, work)
    assert spawned.structuredContent["status"] in ("queued", "running")
    assert not output.isError, output
    assert output.content[0].text == "scout report: count the files"
    assert output.structuredContent["status"] == "succeeded"
    child = Job.objects.get(pk=spawned.structuredContent["execution_id"])
    assert (child.project_id, child.started_by_id) == (team.alpha.pk, team.member.pk)


def test_other_projects_are_refused_as_the_gateway_refuses_them(team, scripted_session, server):
    """Acting as another project's branch is refused before MCP answers (404 ``not_found``, the
    REST gateway's answer); from one's own branch, another project's job and branch are not
    found: ``isError`` with the gateway's code and text."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address, _ = head_address(api, sid)
    beta_api, beta_sid = scripted_session(team.outsider, [{"sleep_ms": 600_000}], project="beta")
    beta_address, beta_job = head_address(beta_api, beta_sid)
    raw = token(team.member)

    refused = raw_mcp(server, {"Authorization": f"Bearer {raw}", "X-Trellis-Branch": beta_address})
    status, gateway = rest(server, raw, "POST", f"/api/branches/{beta_address}/tools/todo_list", {"arguments": {}})
    assert (refused.status_code, refused.json()["code"]) == (status, gateway["code"]) == (404, "not_found")
    # the outsider may not act as the member's branch either, nor a viewer of the project
    for user, expected in [(team.outsider, (404, "not_found")), (team.viewer, (403, "forbidden"))]:
        r = raw_mcp(server, {"Authorization": f"Bearer {token(user)}", "X-Trellis-Branch": address})
        assert (r.status_code, r.json()["code"]) == expected, r.text

    calls = [("job_output", {"job_id": beta_job, "block": False}),
             ("send_message", {"to": beta_address, "message": "hello from alpha"}),
             ("read_conversation", {"session_id": beta_sid})]

    async def work(session):
        return [await session.call_tool(name, arguments) for name, arguments in calls]

    answers = over_mcp(server, raw, address, work)
    for (name, arguments), answer in zip(calls, answers):
        status, gateway = rest(server, raw, "POST", f"/api/branches/{address}/tools/{name}", {"arguments": arguments})
        assert status == 200 and gateway["is_error"], gateway
        assert answer.isError and answer.structuredContent["code"] == gateway["details"]["code"] == "not_found", answer
        assert answer.content[0].text == gateway["text"]


def test_foreign_hosts_and_origins_are_refused(team, scripted_session, server):
    """DNS-rebinding protection (the SDK's, fed from ALLOWED_HOSTS): with a valid token, a
    ``Host`` the deployment does not serve is 421 and a foreign browser ``Origin`` 403; the
    deployment's own host and origin are served."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address, _ = head_address(api, sid)
    headers = {"Authorization": f"Bearer {token(team.member)}", "X-Trellis-Branch": address}
    own = server.url.removeprefix("http://")

    assert raw_mcp(server, {**headers, "Host": "rebound.example"}).status_code == 421
    assert raw_mcp(server, {**headers, "Origin": "http://rebound.example"}).status_code == 403
    assert raw_mcp(server, {**headers, "Host": own, "Origin": server.url}).status_code == 200


def test_transport_security_follows_allowed_hosts(settings):
    """Each allowed host on any port, its http(s) origins and the trusted origins; ``*`` turns
    the check off; ``.example.com`` admits the bare name; an IPv6 literal is bracketed."""
    from collab.mcp_server import transport_security

    settings.ALLOWED_HOSTS = ["trellis.example.com", ".example.org", "::1"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://proxy.example.net"]
    got = transport_security()
    assert got.enable_dns_rebinding_protection
    assert got.allowed_hosts == ["trellis.example.com", "trellis.example.com:*", "example.org", "example.org:*",
                                 "[::1]", "[::1]:*"]
    assert {"https://trellis.example.com", "http://trellis.example.com:*", "https://example.org:*",
            "http://[::1]", "https://proxy.example.net"} <= set(got.allowed_origins)
    assert "https://rebound.example" not in got.allowed_origins

    settings.ALLOWED_HOSTS = ["*"]
    assert not transport_security().enable_dns_rebinding_protection


def test_a_bad_missing_revoked_or_narrow_token_is_refused(team, scripted_session, server):
    """No MCP session without a valid token that has the ``tools`` scope: 401 ``unauthenticated``
    (missing, unknown, revoked — with ``WWW-Authenticate: Bearer``), 403 ``token_scope``; a
    token without a branch to act as: 400 ``invalid_address``. The SDK's client fails too."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address, _ = head_address(api, sid)
    revoked, revoked_raw = ApiToken.issue(team.member, name="gone")
    assert api.delete(f"/api/tokens/{revoked.pk}").status_code == 204
    branch = {"X-Trellis-Branch": address}

    for headers in [branch, {**branch, "Authorization": "Bearer trl_not-a-token"},
                    {**branch, "Authorization": f"Bearer {revoked_raw}"},
                    {**branch, "Authorization": f"Basic {token(team.member)}"}]:
        r = raw_mcp(server, headers)
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated"), r.text
        assert r.headers["www-authenticate"] == "Bearer"
    narrow = raw_mcp(server, {**branch, "Authorization": f"Bearer {token(team.member, scopes=['read', 'write'])}"})
    assert (narrow.status_code, narrow.json()["code"]) == (403, "token_scope"), narrow.text
    nowhere = raw_mcp(server, {"Authorization": f"Bearer {token(team.member)}"})
    assert (nowhere.status_code, nowhere.json()["code"]) == (400, "invalid_address"), nowhere.text

    with pytest.raises(BaseException) as failed:  # noqa: B017 - the SDK raises a group around the HTTP error
        over_mcp(server, "trl_not-a-token", address, lambda s: s.list_tools())
    assert "401" in repr(failed.value) or any("401" in repr(e) for e in getattr(failed.value, "exceptions", ()))


def test_mcp_and_rest_share_the_users_bound_on_blocking_calls(team, scripted_session, server):
    """Blocking calls over MCP count against the same per-user bound as the REST gateway's (the
    one pool, TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER = 4): with four REST waits admitted, an MCP
    ``job_output(block=true)`` is refused at once (``isError``, ``too_many_blocking_calls``), a
    non-blocking MCP call still answers; cancelling the job releases the four."""
    api, sid = scripted_session(team.member, [{"sleep_ms": 600_000}, {"text": "ok"}])
    address, job_id = head_address(api, sid)
    raw = token(team.member)
    waiting_call = {"arguments": {"job_id": job_id, "block": True, "timeout": 600_000}}

    with ThreadPoolExecutor(4) as pool:
        waits = [pool.submit(rest, server, raw, "POST", f"/api/branches/{address}/tools/job_output", waiting_call)
                 for _ in range(4)]

        async def work(session):
            refused = await session.call_tool("job_output", {"job_id": job_id, "block": True, "timeout": 600_000})
            if not refused.isError:
                return refused, None
            return refused, await session.call_tool("job_output", {"job_id": job_id, "block": False})

        # the four REST waits are admitted in their own time: until then, an MCP wait may be admitted too
        def refused_over_mcp():
            refused, peek = over_mcp(server, raw, address, work)
            return (refused, peek) if refused.isError else None

        refused, peek = poll(refused_over_mcp, timeout=60, what="the bound to be full")
        assert refused.structuredContent["code"] == "too_many_blocking_calls"
        assert refused.content[0].text.startswith("too_many_blocking_calls: ")
        assert not peek.isError and peek.structuredContent["status"] in ("queued", "running")
        assert not any(w.done() for w in waits)

        version = api.get(f"/api/executions/{job_id}").json()["version"]
        r = api.post(f"/api/executions/{job_id}/commands", {
            "command_id": f"mcp-{job_id}", "action": "execution.cancel", "expected_version": version, "payload": {}})
        assert r.status_code == 202, r.content
        for w in waits:
            status, body = w.result()
            assert status == 200 and body["details"]["status"] == "cancelled", body


def test_first_requests_on_a_fresh_daphne_start_the_session_manager(transactional_db, team, scripted_session,
                                                                             process_env, tmp_path):
    """Daphne sends no ASGI lifespan events: on a freshly started daphne process, five clients
    whose first requests arrive together all get their tools (the manager starts once, lazily)."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address, _ = head_address(api, sid)
    raw = token(team.member)
    port = free_port()
    log = tmp_path / "daphne.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                 "config.asgi:application"], env=process_env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        fresh = type("Server", (), {"url": f"http://127.0.0.1:{port}"})

        def up():
            try:
                return httpx.get(f"{fresh.url}/healthz", timeout=2).status_code < 500
            except httpx.TransportError:
                assert proc.poll() is None, log.read_text()[-3000:]
                return False

        poll(up, timeout=60, interval=0.1, what="daphne to listen")

        async def five():
            async def one():
                async with mcp_session(fresh, raw, address) as session:
                    return [t.name for t in (await session.list_tools()).tools]

            return await asyncio.gather(*(one() for _ in range(5)))

        names = [t.name for t in tools_for("collab")]
        assert asyncio.run(five()) == [names] * 5
        assert log.read_text().count("StreamableHTTP session manager started") == 1  # the SDK's own line
    finally:
        _stop(proc)
