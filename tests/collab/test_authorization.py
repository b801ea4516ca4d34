"""Authorization at every entry point (docs/contract.md#authorization-and-visibility).

Part 1 is a cross-tenant matrix *generated from the registries*: every API route
of ``config.api.api``, every parameterised page of ``collab.urls``, every tool of
``collab.tools.registry`` and the WebSocket route are called by a principal of
project ``beta`` (``outsider``) against project ``alpha``'s rows, and each answer
must be exactly the answer for a row that does not exist (same status, same body
once the probed ids themselves are masked), and never a success. A new route,
page, parameter or tool that the matrix has no value for fails the test and
names itself: the matrix cannot silently fall behind the code. Every probe has a
positive control — an alpha principal gets a success with the very same values —
so a probe can never pass merely because its ids were wrong.

Then: capabilities by role, membership removal revoking access at once (open
sockets close), API tokens, CSRF / Origin / ALLOWED_HOSTS, the audit view, and
the admin actions.
"""

import asyncio
import dataclasses
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import InMemoryChannelLayer
from django.apps import apps
from django.core import serializers
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import Client, override_settings
from django.urls import reverse
from django.urls.resolvers import RoutePattern

from accounts.models import ApiToken, Membership, Project, TokenScope, hash_token
from collab.models import (
    AgentSpec,
    Artifact,
    Branch,
    Event,
    ExecutionCommand,
    HeldDelivery,
    InboxEntry,
    Job,
    Message,
    Session,
    Todo,
    Webhook,
    WebhookDelivery,
)
from collab.models.ids import new_id
from collab.conf.webhook_hosts import parse_webhook_hosts
from tests.conftest import SharedWorld, api_client_of, copy_of_team, make_team, scripted_sessions

PASSWORD = "pw-secret-123"
ROOT = Path(__file__).resolve().parents[2]
ORIGIN = (b"origin", b"http://127.0.0.1")
ROW_MODELS = (
    Project, Membership, ApiToken, AgentSpec, Session, Branch, Message, Job, Event,
    InboxEntry, Todo, Artifact, ExecutionCommand, HeldDelivery, Webhook, WebhookDelivery,
)
SECRET_BITS = ("alpha secret", "alpha-secret-plans", "alpha_secret", "Alpha")


def row_counts() -> dict:
    return {model.__name__: model.objects.count() for model in ROW_MODELS}


def bearer_token(user) -> str:
    """A token with every scope: these tests are about roles (scopes: tests/test_token_scopes.py)."""
    _, raw = ApiToken.issue(user, name="authz-test", scopes=TokenScope.values)
    return raw


def call_api(token: str | None, method: str, url: str, body=None, client=None, **headers):
    """One JSON request over the real URL stack."""
    client = client or Client()
    if token:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    if method == "GET":
        return client.get(url, **headers)
    data = json.dumps(body) if body is not None else ""
    return client.generic(method, url, data, content_type="application/json", **headers)


def masked(response, values: dict) -> tuple:
    """(status, content type, body) with every probed id replaced by its parameter name, so
    "no agent at <address>" for a hidden row compares equal to the same for a missing one."""
    body = response.content.decode("utf-8", errors="replace")
    for value, name in sorted(values.items(), key=lambda kv: -len(kv[0])):
        body = body.replace(value, f"<{name}>")
    return response.status_code, response.get("Content-Type", ""), body


# --- two tenants -------------------------------------------------------------------------


@dataclass
class Alpha:
    """Project alpha's rows, each made through a public entry point where one exists."""

    sid: str
    head: str  # the member's prompt node on branch main
    address: str  # SID:HEAD of main
    name: str  # a uniquely named branch of the same session
    named_address: str
    job_id: str
    job_version: int
    named_job_id: str
    todo_id: int
    artifact_id: str
    hold_id: int
    token_id: int  # one of member's API tokens
    task_name: str  # a sub-agent of alpha's OpenWork session
    workspace_file: str  # a file in alpha's workspace
    invitation_id: int  # a pending invitation to alpha, addressed to ``team.invitee``
    branch_id: str  # the uniquely named branch (``name``), by id
    ow_sid: str  # alpha's OpenWork session
    child_sid: str  # its sub-agent's session (``task_name``)
    webhook_id: str  # alpha's webhook (its URL holds a secret bit)


def openwork_branch(api, sid) -> str:
    """A turn on an OpenWork session (its first node), returning the branch address."""
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "openwork prompt"}).status_code == 202
    return f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"


def give_workspace(slug: str, root) -> None:
    from django.core.management import call_command

    root.mkdir(parents=True, exist_ok=True)
    call_command("workspace", slug, str(root), stdout=StringIO())


def build_alpha(team, api_as, scripted_session, root, make_user) -> Alpha:
    """Project alpha's rows (``root``: where its workspace goes); the webhook hosts must allow
    ``127.0.0.1:*``. Sets ``team.invitee``."""
    secret_file = root / "alpha-ws" / "alpha-secret-notes.txt"
    give_workspace("alpha", secret_file.parent)
    secret_file.write_text("alpha secret workspace text\n")
    ow_api, ow_sid = scripted_session(team.member, [], agent_id="alpha-ow", toolset="openwork")
    ow_address = openwork_branch(ow_api, ow_sid)
    r = ow_api.post(f"/api/branches/{ow_address}/tools/spawn_agent",
                    {"arguments": {"task_name": "alpha_secret_child", "message": "alpha secret child task"}})
    assert r.status_code == 200 and not r.json()["is_error"], r.content
    member_api, sid = scripted_session(team.member, [{"text": "alpha secret answer"}])
    owner_api = api_as(team.owner)
    turn = member_api.post(f"/api/sessions/{sid}/turns", {"prompt": "alpha secret prompt"})
    assert turn.status_code == 202, turn.content
    turn = turn.json()
    head = member_api.get(f"/api/sessions/{sid}").json()["head"]
    address = f"{sid}:{head}"

    def tool(name, **arguments):
        r = member_api.post(f"/api/branches/{address}/tools/{name}", {"arguments": arguments})
        assert r.status_code == 200 and not r.json()["is_error"], r.content
        return r.json()["details"]

    named = tool("agent", prompt="alpha secret task", description="alpha-secret-plans", run_in_background=True)
    todo = tool("todo_create", subject="alpha secret todo")
    # a truncated result's full text (written the way the runtime writes it)
    from collab.services.artifacts import store_result

    _, artifact = store_result(Job.objects.get(pk=turn["execution_id"]), "alpha secret artifact. " * 3000)
    # a delivery held by the watch policy
    assert owner_api.patch("/api/projects/alpha", {"watch_policy": "confirm_deliveries"}).status_code == 200
    held = tool("send_message", to=named["address"], message="alpha secret held message")
    assert owner_api.patch("/api/projects/alpha", {"watch_policy": "off"}).status_code == 200
    token, _ = ApiToken.issue(team.member, name="alpha member's laptop")
    hook = owner_api.post("/api/projects/alpha/webhooks", {"url": "http://127.0.0.1:9/alpha_secret_hook"})
    assert hook.status_code == 201, hook.content
    team.invitee = make_user("invitee")
    invited = owner_api.post("/api/projects/alpha/members", {"username": "invitee", "role": "viewer"})
    assert invited.status_code == 201 and invited.json()["status"] == "pending", invited.content
    return Alpha(
        sid=sid, head=head, address=address, name="alpha-secret-plans", named_address=named["address"],
        job_id=turn["execution_id"], job_version=turn["version"], named_job_id=named["execution_id"],
        todo_id=todo["todo_id"], artifact_id=artifact.pk, hold_id=held["hold_id"], token_id=token.pk,
        task_name="alpha_secret_child", workspace_file=str(secret_file),
        invitation_id=Membership.objects.get(user=team.invitee).pk,
        branch_id=Branch.objects.get(session_id=sid, name="alpha-secret-plans").pk,
        ow_sid=ow_sid, child_sid=Session.objects.get(parent_session_id=ow_sid).pk,
        webhook_id=hook.json()["id"],
    )


@dataclass
class Beta:
    sid: str
    address: str
    token: str  # outsider's bearer token
    openwork_address: str  # a branch of beta's OpenWork session (beta has a workspace too)

    def branch_of(self, toolset: str) -> str:
        return self.openwork_address if toolset == "openwork" else self.address


def build_beta(team, scripted_session, root) -> Beta:
    """Project beta's rows (``root``: where its workspace goes)."""
    outsider_api, sid = scripted_session(team.outsider, [{"text": "beta answer"}], project="beta", agent_id="beta-bot")
    assert outsider_api.post(f"/api/sessions/{sid}/turns", {"prompt": "beta prompt"}).status_code == 202
    head = outsider_api.get(f"/api/sessions/{sid}").json()["head"]
    give_workspace("beta", root / "beta-ws")
    (root / "beta-ws" / "beta-notes.txt").write_text("beta's own notes\n")
    ow_api, ow_sid = scripted_session(team.outsider, [], project="beta", agent_id="beta-ow", toolset="openwork")
    return Beta(sid=sid, address=f"{sid}:{head}", token=bearer_token(team.outsider),
                openwork_address=openwork_branch(ow_api, ow_sid))


# --- the world of alpha and beta, built once per module ----------------------------------


def reads_alpha_world(item) -> bool:
    """The tests that share one ``team`` + ``alpha`` + ``beta`` (``ALPHA_WORLD``): those that ask
    for ``alpha`` and commit nothing. A test that commits (``transactional_db``: sockets, workers,
    servers) or asks for ``alpha`` only later (``request.getfixturevalue``) builds its own."""
    return "alpha" in item.fixturenames and "transactional_db" not in item.fixturenames


def make_user(username, password=PASSWORD):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username=username, password=password)


def build_alpha_world(request) -> SimpleNamespace:
    root = request.getfixturevalue("tmp_path_factory").mktemp("alpha-world")
    team = make_team(make_user)
    scripted_session = scripted_sessions(api_client_of, team)
    with override_settings(TRELLIS_WEBHOOK_HOSTS=parse_webhook_hosts("127.0.0.1:*")):
        alpha_rows = build_alpha(team, api_client_of, scripted_session, root, make_user)
    return SimpleNamespace(team=team, alpha=alpha_rows, beta=build_beta(team, scripted_session, root))


ALPHA_WORLD = SharedWorld(reads_alpha_world, build_alpha_world)


@pytest.fixture
def alpha_world(request):
    """The shared world (built by the first test of a run that reads it), or None for a test
    that builds its own rows. Set up before ``db``: ``team``, ``alpha`` and ``beta`` ask for it first."""
    return ALPHA_WORLD.get(request) if reads_alpha_world(request.node) else None


@pytest.fixture
def team(alpha_world, db, make_user):
    """conftest's ``team``; for a test of the shared world, a copy of the world's (its own
    model instances: a test may change them)."""
    if alpha_world is None:
        return make_team(make_user)
    return copy_of_team(alpha_world.team)


@pytest.fixture
def alpha(alpha_world, team, api_as, scripted_session, tmp_path, make_user, settings) -> Alpha:
    settings.TRELLIS_WEBHOOK_HOSTS = parse_webhook_hosts("127.0.0.1:*")
    if alpha_world is not None:
        return dataclasses.replace(alpha_world.alpha)
    return build_alpha(team, api_as, scripted_session, tmp_path, make_user)


@pytest.fixture
def beta(alpha_world, team, api_as, scripted_session, tmp_path) -> Beta:
    if alpha_world is not None:
        return dataclasses.replace(alpha_world.beta)
    return build_beta(team, scripted_session, tmp_path)


# --- 1a. the API matrix, generated from config.api.api ------------------------------------

# A parameter that names a row: (value in project alpha, a value of the same kind that
# names nothing). Several pairs = several ways of naming the row (an address is
# "SID:HEAD" or a branch name).
ROW_PARAMS = {
    "slug": lambda a: [("alpha", "no-such-project")],
    "sid": lambda a: [(a.sid, new_id())],
    "session": lambda a: [(a.sid, new_id())],  # GET /api/executions?session=
    "project": lambda a: [("alpha", "no-such-project")],  # GET /api/search?project=
    "execution_id": lambda a: [(a.job_id, new_id())],
    "job_id": lambda a: [(a.job_id, new_id())],
    "address": lambda a: [(a.address, f"{new_id()}:{new_id()}"), (a.name, "no-such-agent-here")],
    "mid": lambda a: [(a.head, new_id())],
    "artifact_id": lambda a: [(a.artifact_id, new_id())],
    "username": lambda a: [("member", "nobody-by-that-name")],
    "token_id": lambda a: [(str(a.token_id), str(a.token_id + 100_000))],
    "hold_id": lambda a: [(str(a.hold_id), str(a.hold_id + 100_000))],
    "item_id": lambda a: [(f"hold-{a.hold_id}", f"hold-{a.hold_id + 100_000}")],  # an inbox item: the held delivery
    "invitation_id": lambda a: [(str(a.invitation_id), str(a.invitation_id + 100_000))],
    "branch_id": lambda a: [(a.branch_id, new_id())],
    "agent_id": lambda a: [("bot", "no-such-spec")],  # the spec alpha's session runs
    "webhook_id": lambda a: [(a.webhook_id, new_id())],
}
# Pages whose rows must belong together: their parameters' values, overriding ROW_PARAMS.
PAGE_ROW_PARAMS = {
    "agent_row": {"sid": lambda a: [(a.ow_sid, new_id())], "child_sid": lambda a: [(a.child_sid, new_id())]},
}
# Parameters that do not name a row: one fixed value.
FIXED_PARAMS = {"tool": "list_agents", "q": "probe"}

# Request bodies, per route. A routed body a probe could not fill would be refused
# before authorization is even reached, proving nothing.
API_BODIES = {
    ("POST", "/api/projects/{slug}/agent-specs"): lambda a: {"agent_id": "probe"},
    ("POST", "/api/projects/{slug}/sessions"): lambda a: {"title": "probe"},
    ("POST", "/api/sessions/{sid}/turns"): lambda a: {"prompt": "probe"},
    ("POST", "/api/executions/{execution_id}/commands"): lambda a: {
        "command_id": "probe-command", "action": "execution.cancel", "expected_version": a.job_version, "payload": {}},
    ("POST", "/api/branches/{address}/archive"): lambda a: {"reason": "probe"},
    ("POST", "/api/branches/{address}/tools/{tool}"): lambda a: {"arguments": {}},
    ("PATCH", "/api/branches/{address}"): lambda a: {"internal": True},
    ("PATCH", "/api/projects/{slug}/limits"): lambda a: {"max_messages": 3},
    # outsiders trying to make themselves owners of alpha
    ("POST", "/api/projects/{slug}/members"): lambda a: {"username": "outsider", "role": "owner"},
    ("PATCH", "/api/projects/{slug}/members/{username}"): lambda a: {"role": "owner"},
    ("PATCH", "/api/projects/{slug}"): lambda a: {"name": "Taken over"},
    # who sees alpha's session (a share names a member of its project)
    ("PATCH", "/api/sessions/{sid}"): lambda a: {"visibility": "private"},
    ("PUT", "/api/sessions/{sid}/shares"): lambda a: [{"username": "viewer", "role": "viewer"}],
    ("POST", "/api/sessions/{sid}/shares"): lambda a: {"username": "viewer", "role": "viewer"},
    # alpha's webhooks: an outsider registers or redirects one
    ("POST", "/api/projects/{slug}/webhooks"): lambda a: {"url": "http://127.0.0.1:9/probe"},
    ("PATCH", "/api/webhooks/{webhook_id}"): lambda a: {"url": "http://127.0.0.1:9/probe"},
    ("POST", "/api/inbox/{item_id}"): lambda a: {"decision": "approve"},
}
# Who in alpha may do it (the positive control); default: the owner.
API_AUTHORIZED = {
    ("DELETE", "/api/tokens/{token_id}"): "member",
    ("POST", "/api/invitations/{invitation_id}/accept"): "invitee",
    ("POST", "/api/invitations/{invitation_id}/decline"): "invitee",
}
# Routes without a row parameter act on the caller alone.
CALLER_SCOPED_ROUTES = {("GET", "/api/projects"), ("POST", "/api/projects"), ("GET", "/api/tokens"), ("POST", "/api/tokens"),
                        ("GET", "/api/invitations"), ("GET", "/api/inbox")}


def api_routes() -> list[tuple[str, str, dict]]:
    """Every (method, path, OpenAPI operation) the API serves, from the ninja registry."""
    from config.api import api

    registered = set()
    for prefix, router in api._routers:
        for path, path_view in router.path_operations.items():
            for operation in path_view.operations:
                for method in operation.methods:
                    registered.add((method, "/api/" + (prefix.strip("/") + "/" + path).strip("/")))
    doc = api.get_openapi_schema()
    routes = []
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            routes.append((method.upper(), path, operation))
    documented = {(m, p) for m, p, _ in routes}
    assert registered == documented, f"routes missing from the OpenAPI document: {registered ^ documented}"
    return sorted(routes, key=lambda r: (r[1], r[0]))


ROUTES = api_routes()


@dataclass
class Probe:
    """One request shape: a URL template filled with hidden, missing or mixed values."""

    method: str
    template: str
    path_params: list[str]
    query_params: list[str]
    body: object

    def url(self, values: dict) -> str:
        url = self.template
        for name in self.path_params:
            url = url.replace("{" + name + "}", values[name])
        query = {name: values[name] for name in self.query_params}
        return url + (f"?{urlencode(query)}" if query else "")


def value_sets(where: str, names: list[str], alpha_rows: Alpha, overrides: dict | None = None):
    """(hidden values, [missing variants], mask) for the parameters; fails naming any the
    matrix has no value for."""
    pairs = {}
    row_params = {**ROW_PARAMS, **(overrides or {})}
    for name in names:
        if name in row_params:
            pairs[name] = row_params[name](alpha_rows)
        elif name not in FIXED_PARAMS:
            pytest.fail(
                f"{where}: the authorization matrix has no value for parameter {name!r}. Add it to ROW_PARAMS "
                f"(a row of project alpha and a missing row of the same kind) or FIXED_PARAMS in {__file__}"
            )
    fixed = {name: FIXED_PARAMS[name] for name in names if name in FIXED_PARAMS}
    variants = max((len(p) for p in pairs.values()), default=1)
    for v in range(variants):
        hidden = {**fixed, **{n: p[min(v, len(p) - 1)][0] for n, p in pairs.items()}}
        missing_all = {**fixed, **{n: p[min(v, len(p) - 1)][1] for n, p in pairs.items()}}
        # every row parameter missing at once, and each one alone
        missing = [missing_all] + ([{**hidden, n: missing_all[n]} for n in pairs] if len(pairs) > 1 else [])
        mask = {}
        for n, p in pairs.items():
            for h, m in p:
                mask[h], mask[m] = n, n
        yield hidden, missing, mask


def api_probe(method: str, path: str, operation: dict, alpha_rows: Alpha) -> Probe:
    where = f"{method} {path}"
    params = operation.get("parameters", [])
    path_params = [p["name"] for p in params if p["in"] == "path"]
    # required query parameters must be given; a row id among the optional ones is probed too
    query_params = [p["name"] for p in params if p["in"] == "query" and (p.get("required") or p["name"] in ROW_PARAMS)]
    body = None
    if "requestBody" in operation and (method, path) not in CALLER_SCOPED_ROUTES:
        if (method, path) not in API_BODIES:
            pytest.fail(f"{where}: the authorization matrix has no request body for this route; add one to API_BODIES")
        body = API_BODIES[(method, path)](alpha_rows)
    return Probe(method, path, path_params, query_params, body)


@pytest.mark.parametrize("method,path,operation", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_api_route_answers_an_outsider_exactly_like_a_missing_row(
    team, alpha, beta, method, path, operation
):
    """Beta's owner calls every API route with alpha's rows;
    the answer equals the answer for rows that do not exist — same status, same body once
    the probed ids are masked — and is never a success. Nothing is written. Then an alpha
    principal gets a success with the same values (the probe targets real rows)."""
    probe = api_probe(method, path, operation, alpha)
    row_names = [n for n in probe.path_params + probe.query_params if n in ROW_PARAMS]
    if not row_names:
        assert (method, path) in CALLER_SCOPED_ROUTES, (
            f"{method} {path} names no row, so the matrix cannot probe it: if it acts on the caller alone, "
            "add it to CALLER_SCOPED_ROUTES; if it reads or changes a row, give it a row parameter"
        )
        return

    for hidden, missing_variants, mask in value_sets(f"{method} {path}", probe.path_params + probe.query_params, alpha):
        before = row_counts()
        seen = call_api(beta.token, method, probe.url(hidden), probe.body)
        assert not 200 <= seen.status_code < 400, (probe.url(hidden), seen.status_code, seen.content)
        assert seen.status_code == 404, (probe.url(hidden), seen.status_code, seen.content)
        for missing in missing_variants:
            unseen = call_api(beta.token, method, probe.url(missing), probe.body)
            assert masked(seen, mask) == masked(unseen, mask), (probe.url(hidden), probe.url(missing))
        assert row_counts() == before, f"{method} {path} wrote rows for an outsider"
        body = masked(seen, mask)[2]  # the caller's own words echoed back are no leak
        for bit in SECRET_BITS:
            assert bit not in body

    # the positive control: the same request by an alpha principal who may do it succeeds
    authorized = getattr(team, API_AUTHORIZED.get((method, path), "owner"))
    hidden = next(value_sets(method, probe.path_params + probe.query_params, alpha))[0]
    ok = call_api(bearer_token(authorized), method, probe.url(hidden), probe.body)
    assert 200 <= ok.status_code < 300, (f"positive control {method} {probe.url(hidden)}", ok.status_code, ok.content)


def test_the_matrix_fails_and_names_a_route_it_has_no_value_for(alpha):
    """The generated matrix cannot fall behind: an unknown row parameter or body fails by name."""
    operation = {"parameters": [{"in": "path", "name": "widget_id", "required": True}]}
    with pytest.raises(pytest.fail.Exception, match=r"GET /api/widgets/\{widget_id\}.*'widget_id'"):
        probe = api_probe("GET", "/api/widgets/{widget_id}", operation, alpha)
        list(value_sets("GET /api/widgets/{widget_id}", probe.path_params, alpha))
    with pytest.raises(pytest.fail.Exception, match=r"POST /api/widgets.*request body"):
        api_probe("POST", "/api/widgets", {"requestBody": {}}, alpha)


def test_caller_scoped_routes_show_an_outsider_nothing_of_alpha(team, alpha, beta):
    """The routes without a row parameter list only the caller's own things."""
    for method, path in sorted(CALLER_SCOPED_ROUTES):
        if method != "GET":
            continue
        r = call_api(beta.token, method, path)
        assert r.status_code == 200, (path, r.content)
        body = r.content.decode()
        assert '"alpha"' not in body and "alpha member's laptop" not in body, (path, body)
    assert [p["slug"] for p in call_api(beta.token, "GET", "/api/projects").json()] == ["beta"]


def test_an_artifact_is_served_as_inert_text(team, api_as, alpha):
    """The full text of a result (agent-written) is served as text/plain
    with nosniff to those who may read its execution, never as a page of the app's origin."""
    r = api_as(team.viewer).get(f"/api/artifacts/{alpha.artifact_id}")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain")
    assert r["X-Content-Type-Options"] == "nosniff"
    assert r.content.decode().startswith("alpha secret artifact.")


# --- 1b. the page matrix, generated from collab.urls ---------------------------------------

# How each page is used: ("GET", None) or ("POST", form data). A page missing here fails.
PAGES = {
    "project": ("GET", None),
    "audit": ("GET", None),
    "session": ("GET", None),
    "session_transcript": ("GET", None),
    "session_jobs": ("GET", None),
    "session_branches": ("GET", None),
    "session_activity": ("GET", None),
    "session_agents": ("GET", None),
    "session_stats": ("GET", None),
    "new_session": ("POST", lambda a: {"title": "probe"}),
    "project_limits": ("POST", lambda a: {"max_messages": "3"}),
    "project_members": ("POST", lambda a: {"action": "add", "username": "outsider", "role": "owner"}),
    "project_settings": ("POST", lambda a: {"watch_policy": "confirm_deliveries"}),
    "project_webhooks": ("POST", lambda a: {"action": "add", "url": "http://127.0.0.1:9/probe"}),
    "decide_hold": ("POST", lambda a: {"decision": "approve"}),
    "decide_item": ("POST", lambda a: {"decision": "approve"}),
    "revoke_token": ("POST", lambda a: {}),
    "post_turn": ("POST", lambda a: {"prompt": "probe"}),
    "fork": ("POST", lambda a: {"prompt": "probe"}),
    "cancel_job": ("POST", lambda a: {"version": str(a.job_version)}),
    "accept_invitation": ("POST", lambda a: {}),
    "decline_invitation": ("POST", lambda a: {}),
    "session_visibility": ("POST", lambda a: {"visibility": "shared", "shares": "viewer viewer"}),
    "specs": ("GET", None),
    "spec": ("GET", None),
    "archive_branch": ("POST", lambda a: {"reason": "probe"}),
    "session_rows": ("GET", None),
    "session_dag": ("GET", None),
    "session_running": ("GET", None),
    "message_row": ("GET", None),
    "job_row": ("GET", None),
    "branch_row": ("GET", None),
    "agent_row": ("GET", None),
}
PAGES_AUTHORIZED = {"revoke_token": "member", "accept_invitation": "invitee", "decline_invitation": "invitee"}
# new_project: GET shows the projects page; search: the caller's own projects (its ?project= is
# probed in tests/collab/test_search.py)
CALLER_SCOPED_PAGES = {"projects", "new_project", "tokens", "search", "inbox", "needs_you"}


def page_patterns() -> list[tuple[str, list[str]]]:
    from collab import urls

    found = []
    for pattern in urls.urlpatterns:
        assert isinstance(pattern.pattern, RoutePattern), f"{pattern}: only path() patterns are probed"
        assert pattern.name, f"{pattern.pattern}: an unnamed page cannot be probed"
        found.append((pattern.name, list(pattern.pattern.converters)))
    return found


PAGE_PATTERNS = page_patterns()


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("name,params", PAGE_PATTERNS, ids=[n for n, _ in PAGE_PATTERNS])
def test_every_page_answers_an_outsider_exactly_like_a_missing_row(team, alpha, name, params):
    """Beta's owner, logged in, opens every page of collab.urls with alpha's
    rows, by GET and by POST: the answer is the answer for missing rows (404 for the
    method the page takes; the other method is refused the same way for both), never a
    success or a redirect; nothing is written. An alpha principal succeeds with the same URL."""
    if not params:
        assert name in CALLER_SCOPED_PAGES, f"page {name!r} names no row: add it to CALLER_SCOPED_PAGES or probe it"
        return
    if name not in PAGES:
        pytest.fail(f"page {name!r}: the authorization matrix does not know how it is used; add it to PAGES in {__file__}")
    accepted, data = PAGES[name]
    data = data(alpha) if data else {}
    outsider = logged_in(team.outsider)

    def fetch(client, method, values):
        url = reverse(f"collab:{name}", kwargs=values)
        return client.get(url) if method == "GET" else client.post(url, data)

    for hidden, missing_variants, mask in value_sets(f"page {name}", params, alpha, PAGE_ROW_PARAMS.get(name)):
        for method in ("GET", "POST"):
            before = row_counts()
            seen = fetch(outsider, method, hidden)
            assert seen.status_code >= 400, (name, method, seen.status_code)
            if method == accepted:
                assert seen.status_code == 404, (name, method, seen.status_code)
            for missing in missing_variants:
                assert masked(seen, mask) == masked(fetch(outsider, method, missing), mask), (name, method, missing)
            assert row_counts() == before, f"page {name} ({method}) wrote rows for an outsider"
            for bit in SECRET_BITS:
                assert bit not in masked(seen, mask)[2]

    authorized = logged_in(getattr(team, PAGES_AUTHORIZED.get(name, "owner")))
    hidden = next(value_sets(name, params, alpha, PAGE_ROW_PARAMS.get(name)))[0]
    ok = fetch(authorized, accepted, hidden)
    assert ok.status_code < 400, (f"positive control {accepted} {name}", ok.status_code, ok.content[:500])


def test_caller_scoped_pages_show_an_outsider_nothing_of_alpha(team, alpha):
    """The pages without a row parameter (projects, tokens) show an outsider
    nothing of alpha."""
    outsider = logged_in(team.outsider)
    for name in sorted(CALLER_SCOPED_PAGES):
        r = outsider.get(reverse(f"collab:{name}"))
        assert r.status_code == 200
        body = r.content.decode()
        assert "/p/alpha/" not in body and "alpha member's laptop" not in body, name
        for bit in SECRET_BITS:
            assert bit not in body, name


# --- 1c. every tool of the registry, run through the gateway as a beta branch -----------------

# Per tool, the ways it can name another tenant's rows: label -> arguments built from
# targets (alpha's or missing ones). A tool with no target argument is listed with [] and
# is checked by the differential test below. A tool missing here fails.
COLLAB_PROBES = {
    "agent": {
        "to-address": lambda t: {"prompt": "p", "to": t["address"]},
        "to-name": lambda t: {"prompt": "p", "to": t["name"]},
        "fork-alpha-history": lambda t: {"prompt": "p", "start_from": f"{t['sid']}:{t['mid']}", "run_in_background": True},
        "fork-alpha-history-foreground": lambda t: {"prompt": "p", "start_from": f"{t['sid']}:{t['mid']}"},
    },
    "send_message": {
        "to-address": lambda t: {"message": "m", "to": t["address"]},
        "to-name": lambda t: {"message": "m", "to": t["name"]},
    },
    "archive_agent": {
        "to-address": lambda t: {"to": t["address"], "reason": "r"},
        "to-name": lambda t: {"to": t["name"], "reason": "r"},
    },
    "read_conversation": {
        "session-id": lambda t: {"session_id": t["sid"]},
        "address": lambda t: {"session_id": t["address"]},
        "name": lambda t: {"session_id": t["name"]},
    },
    "job_output": {
        "job": lambda t: {"job_id": t["job_id"], "block": False},
        "named-job": lambda t: {"job_id": t["named_job_id"], "block": False},
    },
    "todo_update": {
        "todo": lambda t: {"todo_id": t["todo_id"], "status": "completed"},
        "blocked-by": lambda t: {"todo_id": t["own_todo_id"], "blocked_by": [t["todo_id"]]},
    },
    "todo_create": {"blocked-by": lambda t: {"subject": "s", "blocked_by": [t["todo_id"]]}},
    "list_agents": {},
    "list_jobs": {},
    "todo_list": {},
    # through the gateway it pauses nothing (``not_in_a_turn``); in a turn its ``to`` must be a
    # member who may answer in the caller's session: another project's person reads like a
    # missing one (tests/collab/test_people_in_the_loop.py)
    "ask_person": {},
}
# OpenWork: a task_name is looked up among the caller's own children only; paths must stay
# inside the caller's project's workspace (alpha's file is outside beta's).
OPENWORK_PROBES = {
    "followup_task": {"alpha-child": lambda t: {"task_name": t["task_name"], "message": "m"}},
    "interrupt_agent": {"alpha-child": lambda t: {"task_name": t["task_name"]}},
    "read": {"alpha-file": lambda t: {"path": t["workspace_file"]}},
    "list": {"alpha-dir": lambda t: {"path": t["workspace_dir"]}},
    "glob": {"alpha-dir": lambda t: {"pattern": "*", "path": t["workspace_dir"]}},
    "grep": {"alpha-dir": lambda t: {"pattern": "secret", "path": t["workspace_dir"]}},
    "bash": {"alpha-file": lambda t: {"command": f"cat {t['workspace_file']}"}},
    "todo_update": COLLAB_PROBES["todo_update"],
    "todo_create": COLLAB_PROBES["todo_create"],
    # no target: a new name is the caller's own (names are per parent); waiting
    # and listing see only the caller's children (the differential test below)
    "spawn_agent": {},
    "wait_agent": {},
    "list_agents": {},
    "todo_list": {},
}
TOOL_PROBES = {"collab": COLLAB_PROBES, "openwork": OPENWORK_PROBES}
NO_TARGET_CALLS = {
    ("collab", "list_agents"): [{"scope": "session"}, {"scope": "all"}, {"scope": "archived"}],
    ("collab", "list_jobs"): [{}],
    ("collab", "todo_list"): [{}],
    ("openwork", "list_agents"): [{}],
    ("openwork", "todo_list"): [{}],
    ("openwork", "glob"): [{"pattern": "**/*"}],
    ("openwork", "grep"): [{"pattern": "notes|secret"}],
}
# Answers that mean "no such thing here", by code.
NOT_FOUND_CODES = ("not_found", "unknown_todo", "unknown_agent", "path_outside_workspace")


def registered_tools() -> list[tuple[str, str]]:
    from collab.tools.registry import REGISTRY, _load_builtin_tools

    _load_builtin_tools()
    return sorted(REGISTRY)


TOOLS = registered_tools()


def tool_targets(a: Alpha, missing: bool) -> dict:
    if missing:
        gone = f"/nonexistent-{new_id()}"
        return {"address": f"{new_id()}:{new_id()}", "name": "no-such-agent-here", "sid": new_id(), "mid": new_id(),
                "job_id": new_id(), "named_job_id": new_id(), "todo_id": a.todo_id + 100_000,
                "task_name": "no_such_child_here", "workspace_file": f"{gone}/notes.txt", "workspace_dir": gone}
    return {"address": a.address, "name": a.name, "sid": a.sid, "mid": a.head, "job_id": a.job_id,
            "named_job_id": a.named_job_id, "todo_id": a.todo_id, "task_name": a.task_name,
            "workspace_file": a.workspace_file, "workspace_dir": str(Path(a.workspace_file).parent)}


def run_gateway(token, address, tool, arguments):
    r = call_api(token, "POST", f"/api/branches/{address}/tools/{tool}", {"arguments": arguments})
    assert r.status_code == 200, (tool, arguments, r.status_code, r.content)
    return r


@pytest.mark.parametrize("toolset,tool", TOOLS)
def test_every_tool_answers_a_beta_agent_about_alpha_exactly_like_about_nothing(team, alpha, beta, toolset, tool):
    """A beta branch runs every registered tool through the
    gateway against alpha's addresses, names, session ids, job ids and todo ids. Each
    answer is the answer for a target that does not exist ("not found" wording, no title,
    preview or count), and nothing is written anywhere."""
    if tool not in TOOL_PROBES.get(toolset, ()):
        pytest.fail(f"tool {toolset}:{tool}: the authorization matrix has no probe for it; add it to TOOL_PROBES in {__file__}")
    address = beta.branch_of(toolset)
    own_todo = run_gateway(beta.token, address, "todo_create", {"subject": "beta's own"}).json()["details"]["todo_id"]
    hidden, missing = tool_targets(alpha, False), tool_targets(alpha, True)
    hidden["own_todo_id"] = missing["own_todo_id"] = own_todo
    mask = {str(hidden[k]): k for k in hidden if k != "own_todo_id"} | {str(missing[k]): k for k in missing if k != "own_todo_id"}
    for label, build in TOOL_PROBES[toolset][tool].items():
        before = row_counts()
        seen = run_gateway(beta.token, address, tool, build(hidden))
        body = seen.json()
        assert body["is_error"], (tool, label, body)
        text = body["text"].lower()
        assert "not found" in text or "no such file" in text or body["details"].get("code") in NOT_FOUND_CODES, body
        unseen = run_gateway(beta.token, address, tool, build(missing))
        assert masked(seen, mask) == masked(unseen, mask), (tool, label)
        assert row_counts() == before, f"{tool} ({label}) wrote rows for a beta agent aimed at alpha"
        for bit in SECRET_BITS + ("turns", "chars"):
            assert bit not in masked(seen, mask)[2], (tool, label, bit)


@pytest.mark.parametrize("toolset,tool", sorted(NO_TARGET_CALLS))
def test_tools_without_a_target_answer_a_beta_agent_as_if_alpha_did_not_exist(team, beta, request, toolset, tool):
    """Listing tools run as a beta branch answer the same before and after all of
    alpha's sessions, branches, jobs, todos, holds, sub-agents and workspace files exist."""
    calls = NO_TARGET_CALLS[(toolset, tool)]
    address = beta.branch_of(toolset)
    # beta has something of its own to list
    run_gateway(beta.token, address, "todo_create", {"subject": "beta's plan"})
    if toolset == "collab":
        run_gateway(beta.token, address, "agent", {"prompt": "beta task", "description": "beta-helper", "run_in_background": True})
    else:
        run_gateway(beta.token, address, "spawn_agent", {"task_name": "beta_helper", "message": "beta task"})
    first = [run_gateway(beta.token, address, tool, args).json() for args in calls]
    alpha_rows = request.getfixturevalue("alpha")
    then = [run_gateway(beta.token, address, tool, args).json() for args in calls]
    assert then == first
    assert "beta" in json.dumps(first)
    text = json.dumps(then)
    for secret in SECRET_BITS + (alpha_rows.sid, alpha_rows.job_id):
        assert secret not in text


# --- 1d. the WebSocket route -----------------------------------------------------------------

WS_TIMEOUT = 15.0


def socket_to(sid: str, headers: list, after: int | None = None):
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    return WebsocketCommunicator(application, f"/ws/sessions/{sid}/" + ("" if after is None else f"?after={after}"), headers=headers)


def auth_header(token: str) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {token}".encode())


async def safe_disconnect(comm) -> None:
    try:
        await comm.disconnect()
    except (TimeoutError, asyncio.CancelledError):  # the server already closed it
        pass


async def handshake(sid: str, headers: list):
    """(accepted, close code); an accepted socket is closed again at once."""
    comm = socket_to(sid, headers)
    connected, code = await comm.connect(timeout=WS_TIMEOUT)
    if connected:
        await comm.disconnect()
    return connected, code


async def until_closed(comm, timeout=WS_TIMEOUT) -> int | None:
    """Read frames until the server closes the socket; its close code."""
    while True:
        try:
            out = await comm.receive_output(timeout=timeout)
        except TimeoutError:
            raise AssertionError(f"the socket was not closed within {timeout}s") from None
        if out["type"] == "websocket.close":
            return out.get("code")


def _mark(sid: str, text: str) -> int:
    """Append a ``todo.created`` event naming ``text`` to the session's log: its seq."""
    from collab.events import send_event_on_commit

    with transaction.atomic():
        return send_event_on_commit(sid, "todo.created", {"todo": 0, "subject": text}).seq


async def still_live(comm, sid: str) -> bool:
    """The socket still delivers: a fresh event written now reaches it (frames before it are
    read past); False if the server closes it first. Proves "open" by a delivery, not by a
    quiet interval."""
    seq = await sync_to_async(_mark)(sid, f"still live {id(comm)}")
    while True:
        out = await comm.receive_output(timeout=WS_TIMEOUT)
        if out["type"] == "websocket.close":
            return False
        if out["type"] == "websocket.send" and json.loads(out["text"]).get("seq") == seq:
            return True


def test_the_socket_refuses_an_outsider_exactly_like_a_missing_session(transactional_db, team, scripted_session):
    """Beta's owner is refused the handshake for alpha's session
    exactly as for a session that does not exist; alpha's viewer is accepted (control)."""
    _, sid = scripted_session(team.member, [{"text": "alpha secret answer"}])
    outsider = [ORIGIN, auth_header(bearer_token(team.outsider))]
    viewer = [ORIGIN, auth_header(bearer_token(team.viewer))]

    async def body():
        return (await handshake(sid, outsider), await handshake(new_id(), outsider),
                await handshake(sid, viewer), await handshake(new_id(), viewer))

    hidden, missing, viewer_hidden, viewer_missing = async_to_sync(body)()
    assert hidden == missing
    assert hidden[0] is False
    assert viewer_missing == missing  # a member hears the same refusal for a missing session
    assert viewer_hidden[0] is True


# --- 2. capabilities by role (docs/contract.md#roles-and-capabilities) -------------------------


def test_a_viewer_cannot_post_turns_send_or_archive(team, api_as, alpha):
    """Viewer — read only. Turns, sends (gateway tools) and archive answer 403."""
    viewer = api_as(team.viewer)
    before = row_counts()
    r = viewer.post(f"/api/sessions/{alpha.sid}/turns", {"prompt": "hi"})
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    for tool, arguments in [("send_message", {"to": alpha.named_address, "message": "hi"}),
                            ("agent", {"prompt": "hi", "to": alpha.named_address}),
                            ("archive_agent", {"to": alpha.named_address})]:
        r = viewer.post(f"/api/branches/{alpha.address}/tools/{tool}", {"arguments": arguments})
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), (tool, r.content)
    r = viewer.post(f"/api/branches/{alpha.named_address}/archive", {"reason": "no"})
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    assert row_counts() == before
    # …but reads everything
    assert viewer.get(f"/api/branches/{alpha.address}/transcript").status_code == 200
    assert viewer.get(f"/api/executions/{alpha.job_id}").status_code == 200
    client = logged_in(team.viewer)
    assert client.post(reverse("collab:post_turn", args=[alpha.sid]), {"prompt": "hi"}).status_code == 403


def invite_and_accept(owner_api, invitee_api, username: str, role: str) -> None:
    """Membership is an invitation: the owner invites, the person accepts."""
    r = owner_api.post("/api/projects/alpha/members", {"username": username, "role": role})
    assert r.status_code == 201 and r.json()["status"] == "pending", r.content
    (invitation,) = invitee_api.get("/api/invitations").json()
    assert invitee_api.post(f"/api/invitations/{invitation['id']}/accept").status_code == 200


def test_a_member_archives_their_own_branch_but_not_another_members(team, api_as, make_user, scripted_session):
    """Member — archive own branches; another member's branch is 403 (API and tool)."""
    owner = api_as(team.owner)
    invite_and_accept(owner, api_as(make_user("member2")), "member2", "member")
    member, own_sid = scripted_session(team.member, [{"text": "mine"}])
    from django.contrib.auth import get_user_model

    other_api, other_sid = scripted_session(get_user_model().objects.get(username="member2"), [{"text": "theirs"}], agent_id="bot2")
    for api, sid in ((member, own_sid), (other_api, other_sid)):
        assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).status_code == 202
    own = f"{own_sid}:{member.get(f'/api/sessions/{own_sid}').json()['head']}"
    theirs = f"{other_sid}:{member.get(f'/api/sessions/{other_sid}').json()['head']}"

    r = member.post(f"/api/branches/{theirs}/archive", {"reason": "not mine"})
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    r = member.post(f"/api/branches/{own}/tools/archive_agent", {"arguments": {"to": theirs}})
    assert r.status_code == 200 and r.json()["is_error"] and r.json()["details"]["code"] == "forbidden", r.content
    assert member.get(f"/api/sessions/{other_sid}/branches").json()[0]["archived"] is False

    r = member.post(f"/api/branches/{own}/archive", {"reason": "done"})
    assert r.status_code == 200 and r.json()["archived"] is True, r.content


def test_a_maintainer_archives_any_branch_and_cancels_any_execution(team, api_as, alpha):
    """Maintainer — archive any branch, cancel any execution (runtime.control)."""
    maintainer = api_as(team.maintainer)
    r = maintainer.post(f"/api/branches/{alpha.address}/archive", {"reason": "tidy"})  # the member's branch
    assert r.status_code == 200 and r.json()["archived"] is True, r.content
    r = maintainer.post(f"/api/executions/{alpha.job_id}/commands",
                        {"command_id": "m-1", "action": "execution.cancel", "expected_version": alpha.job_version, "payload": {}})
    assert r.status_code == 202, r.content
    assert maintainer.get(f"/api/executions/{alpha.job_id}").json()["status"] == "cancelled"


def cancel(api, job_id, command_id):
    version = api.get(f"/api/executions/{job_id}").json()["version"]
    return api.post(f"/api/executions/{job_id}/commands",
                    {"command_id": command_id, "action": "execution.cancel", "expected_version": version, "payload": {}})


def test_a_member_cancels_only_executions_they_started(team, api_as, scripted_session):
    """Knowing an execution id grants no control. A member cancels
    their own execution; the maintainer's is 403 and stays queued; a viewer cancels nothing."""
    member, member_sid = scripted_session(team.member, [{"text": "m"}])
    maintainer, maintainer_sid = scripted_session(team.maintainer, [{"text": "x"}], agent_id="bot2")
    mine = member.post(f"/api/sessions/{member_sid}/turns", {"prompt": "mine"}).json()["execution_id"]
    theirs = maintainer.post(f"/api/sessions/{maintainer_sid}/turns", {"prompt": "theirs"}).json()["execution_id"]

    r = cancel(member, theirs, "c-theirs")
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    assert member.get(f"/api/executions/{theirs}").json()["status"] == "queued"
    assert not ExecutionCommand.objects.filter(pk="c-theirs").exists()
    r = cancel(api_as(team.viewer), mine, "c-viewer")
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")

    r = cancel(member, mine, "c-mine")
    assert r.status_code == 202, r.content
    assert member.get(f"/api/executions/{mine}").json()["status"] == "cancelled"
    # the page's cancel button follows the same rule
    client = logged_in(team.member)
    r = client.post(reverse("collab:cancel_job", args=[maintainer_sid, theirs]), {})
    assert r.status_code == 403
    assert member.get(f"/api/executions/{theirs}").json()["status"] == "queued"


def test_repeating_a_command_id_does_not_skip_the_capability_check(team, api_as, alpha, make_user):
    """Knowing an execution id grants no control — nor does knowing
    a command id. The replay of a cancel command answers its first answer only to someone
    who may issue it; a viewer, or a member who did not start the execution, gets 403."""
    maintainer = api_as(team.maintainer)
    command = {"command_id": "replayed", "action": "execution.cancel", "expected_version": alpha.job_version, "payload": {}}
    first = maintainer.post(f"/api/executions/{alpha.named_job_id}/commands", command)
    assert first.status_code == 202, first.content
    invite_and_accept(api_as(team.owner), api_as(make_user("member2")), "member2", "member")
    for person in (team.viewer, Membership.objects.get(user__username="member2").user):
        r = api_as(person).post(f"/api/executions/{alpha.named_job_id}/commands", command)
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), (person.username, r.content)
    again = maintainer.post(f"/api/executions/{alpha.named_job_id}/commands", command)
    assert (again.status_code, again.json()) == (202, first.json())


@pytest.mark.parametrize("role", ["viewer", "member", "maintainer"])
def test_only_owners_manage_members_and_limits(team, api_as, role):
    """Owner — members and settings. Every lower role gets 403 on the member and
    limits writes (API and pages); limits and the member list stay readable (as on the project page)."""
    api = api_as(getattr(team, role))
    before = row_counts()
    limits = api.get("/api/projects/alpha/limits")
    assert limits.status_code == 200
    assert api.get("/api/projects/alpha/members").status_code == 200
    for method, path, body in [
        ("POST", "/api/projects/alpha/members", {"username": "outsider", "role": "viewer"}),
        ("PATCH", "/api/projects/alpha/members/viewer", {"role": "owner"}),
        ("DELETE", "/api/projects/alpha/members/viewer", None),
        ("PATCH", "/api/projects/alpha/limits", {"max_messages": 1}),
        ("PATCH", "/api/projects/alpha", {"watch_policy": "confirm_deliveries"}),
    ]:
        r = call_api(api.headers["HTTP_AUTHORIZATION"].split()[1], method, path, body)
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), (method, path, r.content)
    client = logged_in(getattr(team, role))
    assert client.post("/p/alpha/members", {"action": "add", "username": "outsider", "role": "owner"}).status_code == 403
    assert client.post("/p/alpha/limits", {"max_messages": "1"}).status_code == 403
    assert row_counts() == before
    assert api.get("/api/projects/alpha/limits").json() == limits.json()
    assert Membership.objects.get(project__slug="alpha", user=team.viewer).role == "viewer"

    owner = api_as(team.owner)
    assert owner.patch("/api/projects/alpha/limits", {"max_messages": 1}).status_code == 200
    assert owner.patch("/api/projects/alpha/members/viewer", {"role": "member"}).status_code == 200
    assert [m["username"] for m in owner.get("/api/projects/alpha/members").json()] == ["maintainer", "member", "owner", "viewer"]


def test_a_project_always_keeps_an_owner(team, api_as):
    """Removing or demoting the last owner is 409 last_owner (API and page);
    with a second owner, the first may step down, and then the second is the last."""
    owner = api_as(team.owner)
    r = owner.delete("/api/projects/alpha/members/owner")
    assert (r.status_code, r.json()["code"]) == (409, "last_owner")
    r = owner.patch("/api/projects/alpha/members/owner", {"role": "maintainer"})
    assert (r.status_code, r.json()["code"]) == (409, "last_owner")
    page = logged_in(team.owner).post("/p/alpha/members", {"action": "remove", "username": "owner"})
    assert page.status_code == 409
    assert Membership.objects.get(project__slug="alpha", user=team.owner).role == "owner"

    assert owner.patch("/api/projects/alpha/members/maintainer", {"role": "owner"}).status_code == 200
    assert owner.patch("/api/projects/alpha/members/owner", {"role": "member"}).status_code == 200
    new_owner = api_as(team.maintainer)
    r = new_owner.delete("/api/projects/alpha/members/maintainer")
    assert (r.status_code, r.json()["code"]) == (409, "last_owner")
    # the demoted owner no longer manages members
    assert owner.get("/api/projects/alpha/members").status_code == 200
    assert owner.post("/api/projects/alpha/members", {"username": "outsider", "role": "viewer"}).status_code == 403
    assert list(Membership.objects.filter(project__slug="alpha", role="owner").values_list("user__username", flat=True)) == ["maintainer"]


# --- 3. removal revokes access at once ---------------------------------------------------------


def test_removing_a_member_closes_their_open_socket_and_their_token_finds_nothing(transactional_db, team, api_as, scripted_session):
    """The owner removes the member through the API while the member watches
    alpha's session: the member's open socket is closed at once (no reconnect needed),
    other members' sockets stay open (a role change only re-checks them), and the
    member's token then gets the 404 of a missing session, on the API and the socket."""
    member_api, sid = scripted_session(team.member, [{"text": "x"}])
    owner = api_as(team.owner)
    member_token, viewer_token = bearer_token(team.member), bearer_token(team.viewer)

    async def body():
        member_ws = socket_to(sid, [ORIGIN, auth_header(member_token)], after=0)
        viewer_ws = socket_to(sid, [ORIGIN, auth_header(viewer_token)], after=0)
        assert (await member_ws.connect(timeout=WS_TIMEOUT))[0]
        assert (await viewer_ws.connect(timeout=WS_TIMEOUT))[0]
        try:
            assert await still_live(member_ws, sid) and await still_live(viewer_ws, sid)
            # a role change re-checks the socket and keeps it: a viewer may still read
            r = await sync_to_async(owner.patch)("/api/projects/alpha/members/viewer", {"role": "viewer"})
            assert r.status_code == 200, r.content
            r = await sync_to_async(owner.delete)("/api/projects/alpha/members/member")
            assert r.status_code == 204, r.content
            code = await until_closed(member_ws)
            assert await still_live(viewer_ws, sid)
            refused = await handshake(sid, [ORIGIN, auth_header(member_token)])
            missing = await handshake(new_id(), [ORIGIN, auth_header(member_token)])
            return code, refused, missing
        finally:
            await safe_disconnect(member_ws)
            await safe_disconnect(viewer_ws)

    code, refused, missing = async_to_sync(body)()
    assert code == 4403
    assert refused == missing and refused[0] is False
    hidden = member_api.get(f"/api/sessions/{sid}")
    assert hidden.status_code == 404
    assert masked(hidden, {sid: "sid"}) == masked(member_api.get(f"/api/sessions/{new_id()}"), {})
    assert member_api.get("/api/projects").json() == []


# --- 4. API tokens -------------------------------------------------------------------------------


def assert_nowhere_in_the_database(secret: str) -> None:
    """Every row of every model, serialized: the secret appears in none."""
    for model in apps.get_models():
        dump = serializers.serialize("json", model._base_manager.all())
        assert secret not in dump, f"{model.__name__} stores the raw token"


def test_an_api_token_is_shown_once_stored_hashed_listed_by_hint_and_revoked_at_once(team, api_as):
    """POST /api/tokens answers the value once; only its SHA-256 is
    stored; the list shows a hint, never the value; last use is recorded; DELETE revokes
    and the very next request with it is 401."""
    api = api_as(team.member)
    r = api.post("/api/tokens", {"name": "ci runner"})
    assert r.status_code == 201, r.content
    created = r.json()
    raw = created["token"]
    assert raw.startswith("trl_") and len(raw) > 30
    assert created["hint"] == raw[:10] and created["name"] == "ci runner" and created["last_used_at"] is None
    assert ApiToken.objects.get(pk=created["id"]).key_hash == hash_token(raw)
    assert_nowhere_in_the_database(raw)

    listing = api.get("/api/tokens")
    assert raw not in listing.content.decode()
    row = next(t for t in listing.json() if t["id"] == created["id"])
    assert "token" not in row and row["hint"] == raw[:10] and row["last_used_at"] is None

    assert [p["slug"] for p in call_api(raw, "GET", "/api/projects").json()] == ["alpha"]
    row = next(t for t in api.get("/api/tokens").json() if t["id"] == created["id"])
    assert row["last_used_at"] is not None and row["revoked_at"] is None

    assert api.delete(f"/api/tokens/{created['id']}").status_code == 204
    r = call_api(raw, "GET", "/api/projects")
    assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")
    r = call_api(raw, "POST", "/api/projects", {"slug": "gamma"})
    assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")
    assert next(t for t in api.get("/api/tokens").json() if t["id"] == created["id"])["revoked_at"] is not None
    # someone else cannot revoke (or see) it
    other = api_as(team.viewer)
    assert created["id"] not in [t["id"] for t in other.get("/api/tokens").json()]
    live = ApiToken.objects.active().filter(user=team.member).first()
    assert other.delete(f"/api/tokens/{live.pk}").status_code == 404
    assert ApiToken.objects.get(pk=live.pk).revoked_at is None


def test_the_tokens_page_shows_a_new_token_once_and_revokes_it(team):
    """The tokens page shows a new token once (then only its hint), stores only its
    hash, and its revoke button makes the token useless at once."""
    client = logged_in(team.member)
    r = client.post(reverse("collab:tokens"), {"name": "from the page"})
    assert r.status_code == 200
    raw = re.search(r"trl_[A-Za-z0-9_\-]{20,}", r.content.decode()).group(0)
    assert call_api(raw, "GET", "/api/projects").status_code == 200
    listing = client.get(reverse("collab:tokens")).content.decode()
    assert raw not in listing and raw[:10] in listing
    assert_nowhere_in_the_database(raw)
    token = ApiToken.objects.get(key_hash=hash_token(raw))
    assert client.post(reverse("collab:revoke_token", args=[token.pk])).status_code == 302
    assert call_api(raw, "GET", "/api/projects").status_code == 401


def test_create_api_token_prints_a_working_token(team):
    """``manage.py create_api_token USERNAME`` prints a new token (once)."""
    out = StringIO()
    call_command("create_api_token", "viewer", stdout=out)
    raw = out.getvalue().strip()
    assert raw.startswith("trl_")
    assert [(p["slug"], p["role"]) for p in call_api(raw, "GET", "/api/projects").json()] == [("alpha", "viewer")]
    assert_nowhere_in_the_database(raw)
    with pytest.raises(CommandError):
        call_command("create_api_token", "nobody-by-that-name", stdout=StringIO())


# --- 5. CSRF, Origin, ALLOWED_HOSTS ---------------------------------------------------------------

CALLER_SCOPED_BODIES = {("POST", "/api/projects"): {"slug": "gamma", "name": "Gamma"}, ("POST", "/api/tokens"): {"name": "x"}}


def browser_login(user) -> Client:
    """A browser that logged in through the login form: session cookie, CSRF enforced."""
    client = Client(enforce_csrf_checks=True)
    client.get("/accounts/login/")
    r = client.post("/accounts/login/", {"username": user.username, "password": PASSWORD,
                                         "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    assert r.status_code == 302, r.content
    return client


UNSAFE_ROUTES = [(m, p, o) for m, p, o in ROUTES if m != "GET"]


@pytest.mark.parametrize("method,path,operation", UNSAFE_ROUTES, ids=[f"{m} {p}" for m, p, _ in UNSAFE_ROUTES])
def test_every_unsafe_api_route_refuses_a_session_request_without_csrf(team, alpha, method, path, operation):
    """Browser-session requests that change state need the CSRF token —
    every unsafe route of the registry, with the owner's session and alpha's real rows:
    403 csrf_failed, nothing written, nothing changed."""
    client = browser_login(team.owner)
    if (method, path) in CALLER_SCOPED_ROUTES:
        url, body = path, CALLER_SCOPED_BODIES[(method, path)]
    else:
        probe = api_probe(method, path, operation, alpha)
        hidden = next(value_sets(f"{method} {path}", probe.path_params + probe.query_params, alpha))[0]
        url, body = probe.url(hidden), probe.body
    before = row_counts()
    limits = call_api(None, "GET", "/api/projects/alpha/limits", client=client).json()
    for headers in ({}, {"HTTP_X_CSRFTOKEN": "x" * 64}):
        r = call_api(None, method, url, body, client=client, **headers)
        assert (r.status_code, r.json().get("code")) == (403, "csrf_failed"), (method, url, r.content)
    assert row_counts() == before
    assert call_api(None, "GET", "/api/projects/alpha/limits", client=client).json() == limits
    assert Project.objects.get(slug="alpha").name == "Alpha"


def test_a_session_request_with_the_csrf_token_goes_through(team):
    """Control for the CSRF matrix: with the token, the same browser session may write."""
    client = browser_login(team.owner)
    token = {"HTTP_X_CSRFTOKEN": client.cookies["csrftoken"].value}
    r = call_api(None, "PATCH", "/api/projects/alpha/limits", {"max_messages": 2}, client=client, **token)
    assert r.status_code == 200 and r.json()["max_messages"] == 2, r.content
    r = call_api(None, "DELETE", "/api/projects/alpha/members/viewer", client=client, **token)
    assert r.status_code == 204


@pytest.mark.parametrize("name,params", PAGE_PATTERNS, ids=[n for n, _ in PAGE_PATTERNS])
def test_every_page_post_needs_the_csrf_token(team, alpha, name, params):
    """A page POST without the CSRF token is 403 for every page of collab.urls (the
    owner, logged in, with alpha's real rows), and writes nothing."""
    client = browser_login(team.owner)
    hidden = next(value_sets(f"page {name}", params, alpha, PAGE_ROW_PARAMS.get(name)))[0] if params else {}
    data = PAGES[name][1](alpha) if PAGES.get(name, (None, None))[1] else {"name": "x"}
    before = row_counts()
    r = client.post(reverse(f"collab:{name}", kwargs=hidden), data)
    assert r.status_code == 403, (name, r.status_code)
    assert row_counts() == before


def test_a_page_post_with_the_csrf_token_goes_through_and_login_needs_it_too(team, alpha):
    """A page form with its CSRF token works (control); the login form needs one too."""
    client = browser_login(team.member)
    jobs = Job.objects.filter(session_id=alpha.sid).count()
    r = client.post(reverse("collab:post_turn", args=[alpha.sid]),
                    {"prompt": "with the token", "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    assert r.status_code == 302
    assert Job.objects.filter(session_id=alpha.sid).count() == jobs + 1
    anonymous = Client(enforce_csrf_checks=True)
    assert anonymous.post("/accounts/login/", {"username": "member", "password": PASSWORD}).status_code == 403


@pytest.mark.parametrize("origin,accepted", [
    (b"http://127.0.0.1", True),
    (b"http://localhost:8000", True),
    (b"http://evil.example", False),
    (b"http://127.0.0.1.evil.example", False),
    (b"null", False),
    (None, False),
])
@pytest.mark.parametrize("auth", ["bearer", "cookie"])
def test_the_socket_checks_the_origin(transactional_db, team, scripted_session, origin, accepted, auth):
    """WebSockets are origin-checked — with a bearer token and, the case
    cross-site WebSocket hijacking needs, with the browser's session cookie."""
    _, sid = scripted_session(team.member, [{"text": "x"}])
    if auth == "bearer":
        credentials = auth_header(bearer_token(team.viewer))
    else:
        credentials = (b"cookie", f"sessionid={browser_login(team.viewer).cookies['sessionid'].value}".encode())
    headers = [credentials] + ([(b"origin", origin)] if origin is not None else [])
    connected, _ = async_to_sync(handshake)(sid, headers)
    assert connected is accepted


class RecordingLayer(InMemoryChannelLayer):
    """The in-memory layer, counting the channels opened on it (what a refused handshake must not do)."""

    opened: list = []

    async def new_channel(self, prefix="specific."):
        name = await super().new_channel(prefix)
        RecordingLayer.opened.append(name)
        return name


@pytest.mark.parametrize("origin", [b"http://evil.example", None])
def test_a_refused_handshake_opens_nothing_on_the_channel_layer(transactional_db, team, scripted_session,
                                                                       settings, origin):
    """A socket refused for its Origin is closed without a channel of its own on
    the layer (channels' own denier opened one and waited on a receive there: a Redis connection
    per refusal, and a refusal that never ended when the layer's receive could not be served)."""
    _, sid = scripted_session(team.member, [{"text": "x"}])
    settings.CHANNEL_LAYERS = {**settings.CHANNEL_LAYERS,
                               "default": {"BACKEND": "tests.collab.test_authorization.RecordingLayer"}}
    RecordingLayer.opened = []
    headers = [auth_header(bearer_token(team.viewer))] + ([(b"origin", origin)] if origin is not None else [])
    connected, _ = async_to_sync(handshake)(sid, headers)
    assert connected is False
    assert RecordingLayer.opened == []


def settings_in_a_subprocess(tmp_path, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    environment.update(DJANGO_SETTINGS_MODULE="config.settings", DJANGO_SECRET_KEY="x", TRELLIS_VAR_DIR=str(tmp_path), **env)
    code = "import django; django.setup(); from django.conf import settings; print(settings.ALLOWED_HOSTS)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("hosts", ["*", "trellis.example,*"])
def test_allowed_hosts_is_never_a_wildcard_outside_debug(tmp_path, hosts):
    """DJANGO_ALLOWED_HOSTS="*" with DJANGO_DEBUG=0 refuses to start (ImproperlyConfigured);
    with DEBUG on it is allowed; unset, only loopback names are served."""
    refused = settings_in_a_subprocess(tmp_path, DJANGO_ALLOWED_HOSTS=hosts, DJANGO_DEBUG="0")
    assert refused.returncode != 0
    assert "ImproperlyConfigured" in refused.stderr and "DJANGO_ALLOWED_HOSTS" in refused.stderr, refused.stderr[-2000:]
    debug = settings_in_a_subprocess(tmp_path, DJANGO_ALLOWED_HOSTS=hosts, DJANGO_DEBUG="1")
    assert debug.returncode == 0, debug.stderr[-2000:]
    default = settings_in_a_subprocess(tmp_path)
    assert default.returncode == 0, default.stderr[-2000:]
    assert default.stdout.strip() == "['localhost', '127.0.0.1']"


# --- 6. the audit view -------------------------------------------------------------------------------


def audit_lines(client, **filters) -> list[dict]:
    r = client.get(reverse("collab:audit", args=["alpha"]), {**filters, "format": "jsonl"})
    assert r.status_code == 200
    assert r["Content-Type"].startswith("application/x-ndjson")
    text = b"".join(r.streaming_content).decode()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def audit_rows(client, **params) -> list[str]:
    r = client.get(reverse("collab:audit", args=["alpha"]), params)
    assert r.status_code == 200
    return re.findall(r'data-event="(\d+)"', r.content.decode())


def test_maintainers_read_the_audit_log_filtered_paged_and_as_json_lines(team, api_as, alpha, beta, make_user):
    """A maintainer reads alpha's event log — filtered by type
    (exact or prefix), session and actor, 100 to a page, exportable as one JSON object per
    line. Membership and limits changes are there as project-level events (no session).
    Nothing of beta's is."""
    owner = api_as(team.owner)
    invite_and_accept(owner, api_as(make_user("newcomer")), "newcomer", "viewer")
    assert owner.patch("/api/projects/alpha/members/newcomer", {"role": "member"}).status_code == 200
    assert owner.delete("/api/projects/alpha/members/newcomer").status_code == 204
    assert owner.patch("/api/projects/alpha/limits", {"max_messages": 5}).status_code == 200
    from collab.events import send_event_on_commit

    with transaction.atomic():
        for i in range(105):
            send_event_on_commit(alpha.sid, "test.filler", {"n": i})

    client = logged_in(team.maintainer)
    everything = audit_lines(client)
    assert len(everything) == Event.objects.filter(project=team.alpha).count() > 110
    assert all({"id", "session", "seq", "type", "actor", "payload", "created_at"} <= set(e) for e in everything)
    assert beta.sid not in json.dumps(everything)
    project_level = [(e["type"], e["actor"], e["payload"]) for e in everything if e["session"] is None]
    for expected in [("member.invited", "owner", {"username": "newcomer", "role": "viewer"}),
                     ("member.accepted", "newcomer", {"username": "newcomer", "role": "viewer"}),
                     ("member.role_changed", "owner", {"username": "newcomer", "role": "member"}),
                     ("member.removed", "owner", {"username": "newcomer"})]:
        assert expected in project_level, project_level
    limits = next(p for t, _, p in project_level if t == "limits.changed")
    assert limits["changes"]["max_messages"]["to"] == 5

    assert {e["type"] for e in audit_lines(client, type="member.invited")} == {"member.invited"}
    assert {e["type"] for e in audit_lines(client, type="member.")} == {
        "member.invited", "member.accepted", "member.role_changed", "member.removed"}
    by_session = audit_lines(client, session=alpha.sid)
    assert by_session and {e["session"] for e in by_session} == {alpha.sid}
    assert {e["actor"] for e in audit_lines(client, actor="owner")} == {"owner"}
    assert audit_lines(client, session=beta.sid) == []

    # every event (the page shows what an admin audits unless asked for all: test_audit_sentences)
    page1, page2 = audit_rows(client, show="all"), audit_rows(client, show="all", page=2)
    assert len(page1) == 100 and len(page2) == len(everything) - 100
    assert page1 + page2 == [str(e["id"]) for e in everything]  # newest first, no overlap
    filtered = audit_rows(client, type="member.")
    assert len(filtered) == 5  # newcomer's four steps and the alpha fixture's pending invitation
    assert client.get(reverse("collab:audit", args=["alpha"]), {"since": "yesterday"}).status_code == 400


@pytest.mark.parametrize("role,status", [("member", 403), ("viewer", 403), ("outsider", 404)])
def test_the_audit_log_is_for_maintainers_only(team, role, status):
    """Members and viewers get 403; outsiders the 404 of a missing project."""
    client = logged_in(getattr(team, role))
    for params in ({}, {"format": "jsonl"}):
        r = client.get(reverse("collab:audit", args=["alpha"]), params)
        assert r.status_code == status
        if status == 404:
            missing = client.get(reverse("collab:audit", args=["no-such-project"]), params)
            assert (missing.status_code, missing.content) == (r.status_code, r.content)
    assert logged_in(team.owner).get(reverse("collab:audit", args=["alpha"])).status_code == 200


# --- 7. admin actions ---------------------------------------------------------------------------------


@pytest.fixture
def operator(django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.invalid", PASSWORD)
    client = Client()
    client.force_login(root)
    return root, client


def test_the_admin_archives_branches_with_a_reason_through_the_service(team, alpha, operator):
    """The admin's Branch "archive" action with a reason archives through the
    service — the branch is archived with that reason and a ``branch.archived`` Event is written."""
    root, client = operator
    branch = Branch.objects.get(session_id=alpha.sid, name="main")
    r = client.post("/admin/collab/branch/", {"action": "archive_branches", "_selected_action": [branch.pk],
                                               "reason": "operator cleanup", "index": 0})
    assert r.status_code == 302, r.content[:1000]
    branch.refresh_from_db()
    assert branch.archived and branch.archive_reason == "operator cleanup" and branch.archived_by == root
    event = Event.objects.get(session_id=alpha.sid, type="branch.archived")
    assert event.actor == root and event.payload["reason"] == "operator cleanup" and event.payload["branch"] == branch.pk
    # non-operators never reach the admin
    assert logged_in(team.owner).get("/admin/collab/branch/").status_code == 302


def test_the_admin_cancels_a_queued_job_and_writes_an_event(team, alpha, operator):
    """The admin's Job "cancel" action cancels a queued execution (it never starts)
    and writes ``execution.cancel_requested`` with the operator as actor."""
    root, client = operator
    r = client.post("/admin/collab/job/", {"action": "cancel_executions", "_selected_action": [alpha.job_id], "index": 0})
    assert r.status_code == 302, r.content[:1000]
    job = Job.objects.get(pk=alpha.job_id)
    assert job.status == "cancelled" and job.started_at is None
    event = Event.objects.get(session_id=alpha.sid, type="execution.cancel_requested")
    assert event.actor == root and event.payload["job"] == alpha.job_id and event.payload["via"] == "admin"


def test_revoking_a_token_closes_the_sockets_opened_with_it(transactional_db, team, api_as, scripted_session):
    """A revoked token is refused at once — including by the sockets it opened;
    a socket the same person opened with another token stays open."""
    from accounts.models import ApiToken

    _, sid = scripted_session(team.member, [{"text": "x"}])
    member = api_as(team.member)
    doomed = member.post("/api/tokens", {"name": "doomed"}).json()
    kept_token = bearer_token(team.member)

    async def body():
        doomed_ws = socket_to(sid, [ORIGIN, auth_header(doomed["token"])], after=0)
        kept_ws = socket_to(sid, [ORIGIN, auth_header(kept_token)], after=0)
        assert (await doomed_ws.connect(timeout=WS_TIMEOUT))[0]
        assert (await kept_ws.connect(timeout=WS_TIMEOUT))[0]
        try:
            assert await still_live(doomed_ws, sid) and await still_live(kept_ws, sid)
            r = await sync_to_async(member.delete)(f"/api/tokens/{doomed['id']}")
            assert r.status_code == 204, r.content
            code = await until_closed(doomed_ws)
            assert await still_live(kept_ws, sid)
            return code, await handshake(sid, [ORIGIN, auth_header(doomed["token"])])
        finally:
            await safe_disconnect(doomed_ws)
            await safe_disconnect(kept_ws)

    code, refused = async_to_sync(body)()
    assert code == 4401
    assert refused[0] is False
    assert ApiToken.objects.get(pk=doomed["id"]).revoked_at is not None
