"""The ``openai`` and ``anthropic`` providers (docs/models.md#real-models) against a local server that speaks
their wire formats (tests/collab/fake_llm.py), through the official SDKs.

Agent specs are saved through ``POST /api/projects/alpha/agent-specs``. Most turns
run in this process exactly as a worker runs them (``run_job``); the full turn with
a background helper and its follow-up, and the cancel of a slow stream, run in the
real worker process. Every assertion about what a provider sent is made on the
requests the fake server received.
"""

import itertools
import json
import logging
import os
import subprocess
import sys
import time
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.db import connection

from accounts.models import Project
from collab.models import Branch, Job, Message, ModelConnection, Todo
from collab.runtime.providers.mapping import TITLE_SYSTEM, anthropic_messages, openai_messages
from collab.tools.registry import tools_for
from tests.collab.fake_llm import DIALECTS, AnthropicDialect, FakeLLM, OpenAIDialect, Reply
from tests.conftest import ROOT, free_port, poll

# The worker is a session-wide subprocess that copies os.environ when it starts, after
# collection: keys set while this module is imported are in its environment.
OPENAI_SECRET = "sk-trellis-test-OPENAI-5ecr3t-9f8e7d6c5b4a"
ANTHROPIC_SECRET = "sk-ant-trellis-test-ANTHROPIC-5ecr3t-1a2b3c4d"
os.environ["TRELLIS_TEST_OPENAI_KEY"] = OPENAI_SECRET
os.environ["TRELLIS_TEST_ANTHROPIC_KEY"] = ANTHROPIC_SECRET
SECRETS = {"openai": OPENAI_SECRET, "anthropic": ANTHROPIC_SECRET}
KEY_ENV = {"openai": "TRELLIS_TEST_OPENAI_KEY", "anthropic": "TRELLIS_TEST_ANTHROPIC_KEY"}

MODEL = "fake-model"
PRICES = {MODEL: (1000.0, 2000.0)}  # $/Mtok: 11 in + 7 out tokens cost $0.025
TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
_ids = itertools.count()


# --- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_server():
    server = FakeLLM().start()
    yield server
    server.stop()


@pytest.fixture
def fake(fake_server):
    fake_server.reset()
    yield fake_server
    fake_server.reset()


@pytest.fixture(params=["openai", "anthropic"])
def dialect(request):
    return DIALECTS[request.param]


@pytest.fixture
def fast(settings):
    """In-process turns: a known price for MODEL and near-zero retry backoff."""
    settings.TRELLIS_MODEL_PRICES = PRICES
    settings.TRELLIS_MODEL_RETRY_BASE_MS = 1
    return settings


def operator_connection(name: str, provider: str, base_url: str, key_env: str = "", *, projects=("alpha",),
                        **fields) -> ModelConnection:
    """What staff define in the admin: an endpoint and its key variable, bound to projects."""
    conn, _ = ModelConnection.objects.update_or_create(
        name=name, defaults={"provider": provider, "base_url": base_url, "key_env": key_env, **fields})
    conn.projects.set(Project.objects.filter(slug__in=projects))
    return conn


def connection_name(dialect) -> str:
    return f"fake-{dialect.name}"


def spec_body(dialect, fake, **over) -> dict:
    operator_connection(connection_name(dialect), dialect.name, dialect.base_url(fake), KEY_ENV[dialect.name])
    body = {
        "agent_id": f"llm{next(_ids)}",
        "provider": dialect.name,
        "model": MODEL,
        "connection": connection_name(dialect),
        "system_prompt": "You are a careful test agent.",
        "limits": {"stream": True},
    }
    limits = over.pop("limits", {})
    body.update(over)
    body["limits"] = {**body["limits"], **limits}
    return body


@pytest.fixture
def llm_session(team, api_as, fake):
    """``make(dialect, **spec)``: through the API, an owner saves an agent spec for the fake
    server and a member opens a session with it. Returns (member's api client, sid, spec answer)."""

    def make(dialect, **over):
        admin = api_as(team.owner)
        r = admin.post("/api/projects/alpha/agent-specs", spec_body(dialect, fake, **over))
        assert r.status_code == 201, r.content
        spec = r.json()
        api = api_as(team.member)
        r = api.post("/api/projects/alpha/sessions", {"title": "llm", "agent_id": spec["agent_id"]})
        assert r.status_code == 201, r.content
        return api, r.json()["id"], spec

    return make


def start_turn(api, sid, prompt="hi there") -> str:
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    return r.json()["execution_id"]


def run_inline(job_id: str) -> Job:
    """Run a queued job in this process, exactly as a worker runs it."""
    from collab.runtime.loop import run_job

    assert run_job(job_id) is not None
    return Job.objects.get(pk=job_id)


def turn(llm_session, dialect, prompt="hi there", **spec) -> tuple:
    api, sid, _ = llm_session(dialect, **spec)
    return api, sid, run_inline(start_turn(api, sid, prompt))


def events(api, sid, type=None) -> list[dict]:
    found, after = [], 0
    while True:
        page = api.get(f"/api/sessions/{sid}/events", after=after).json()["events"]
        if not page:
            return [e for e in found if type is None or e["type"] == type]
        found += page
        after = page[-1]["seq"]


def written(job) -> list[Message]:
    return list(Message.objects.filter(job=job).order_by("depth"))


def registry_tools() -> dict:
    return {t.name: t.json_schema() for t in tools_for("collab")}


# --- a plain answer ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_a_text_answer_ends_the_turn_with_tokens_and_cost_on_the_job(fast, fake, llm_session, dialect, stream):
    fake.add(dialect.text("Hello from the model.", stream=stream))
    api, sid, job = turn(llm_session, dialect, limits={"stream": stream})

    assert job.status == "succeeded", job.error_reason
    assert job.result == "Hello from the model."
    assert [(m.role, m.text) for m in written(job)] == [("user", "hi there"), ("assistant", "Hello from the model.")]
    assert (job.model_calls, job.tokens_in, job.tokens_out) == (1, 11, 7)
    assert job.cost == Decimal("0.025")
    shown = api.get(f"/api/executions/{job.pk}").json()
    assert shown["cost"] == "0.025000" and shown["tokens_in"] == 11 and shown["tokens_out"] == 7

    [request] = fake.requests
    assert request.path == dialect.path
    assert dialect.key(request) == SECRETS[dialect.name]
    assert request.body["model"] == MODEL
    assert dialect.system(request) == "You are a careful test agent."
    assert dialect.flat(request) == [("user", "hi there")]
    assert bool(request.body.get("stream")) is stream
    if dialect is OpenAIDialect and stream:
        assert request.body["stream_options"] == {"include_usage": True}
    if dialect is AnthropicDialect:
        assert request.headers.get("anthropic-version")
        assert request.body["max_tokens"] > 0


def test_model_calls_share_the_processs_verifying_tls_context(fast, fake, llm_session, dialect, monkeypatch):
    """A model call builds no TLS context of its own (loading the CA bundle costs ~20 ms of CPU a
    call): three calls in this process build at most the one they share, and it verifies
    certificates and host names as the SDK's own default does."""
    import ssl

    import httpx2

    from collab.runtime.providers import remote

    built = []
    stock = httpx2.create_ssl_context
    monkeypatch.setattr(httpx2, "create_ssl_context", lambda *a, **kw: built.append(1) or stock(*a, **kw))
    for n in range(3):
        fake.add(dialect.text(f"answer {n}", stream=True))
        _api, _sid, job = turn(llm_session, dialect, prompt=f"call {n}", limits={"stream": True})
        assert job.status == "succeeded" and job.result == f"answer {n}", job.error_reason
    assert len(built) <= 1
    context = remote.verified_tls()
    assert context is remote.verified_tls()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_tools_are_offered_with_the_registry_s_own_json_schema(fast, fake, llm_session, dialect):
    fake.add(dialect.text("fine", stream=True))
    turn(llm_session, dialect)
    [request] = fake.requests
    tools = registry_tools()
    assert dialect.tool_names(request) == sorted(tools)
    for name, schema in tools.items():
        assert dialect.tool_schema(request, name) == schema
    described = request.body["tools"][0]
    description = described["function"]["description"] if dialect is OpenAIDialect else described["description"]
    assert description == tools_for("collab")[0].description


def test_an_allow_list_narrows_the_tools_offered(fast, fake, llm_session, dialect):
    fake.add(dialect.text("fine", stream=True))
    turn(llm_session, dialect, tools=["todo_create", "todo_list"])
    assert dialect.tool_names(fake.requests[0]) == ["todo_create", "todo_list"]


# --- tool calls -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_parallel_tool_calls_run_in_order_and_their_results_go_back(fast, fake, llm_session, dialect, stream):
    calls = [("call_a", "todo_create", {"subject": "first"}), ("call_b", "todo_create", {"subject": "second"})]
    fake.add(dialect.tools(calls, text="Planning.", stream=stream), dialect.text("Two todos made.", stream=stream))
    api, sid, job = turn(llm_session, dialect, limits={"stream": stream})

    assert job.status == "succeeded", job.error_reason
    assert job.result == "Two todos made."
    assert (job.model_calls, job.tool_calls, job.tokens_in, job.tokens_out) == (2, 2, 22, 14)
    assert job.cost == Decimal("0.05")
    assert sorted(Todo.objects.filter(session_id=sid).values_list("subject", flat=True)) == ["first", "second"]
    nodes = written(job)
    assert [m.role for m in nodes] == ["user", "assistant", "tool", "tool", "assistant"]
    assert nodes[1].text == "Planning."
    assert nodes[1].tool_calls == [
        {"id": "call_a", "name": "todo_create", "arguments": {"subject": "first"}},
        {"id": "call_b", "name": "todo_create", "arguments": {"subject": "second"}},
    ]
    assert [(m.tool_call_id, m.metadata["tool"]) for m in nodes[2:4]] == [("call_a", "todo_create"), ("call_b", "todo_create")]

    first, second = fake.requests
    assert dialect.flat(second) == [
        ("user", "hi there"), ("assistant", "Planning."), ("call", "todo_create"), ("call", "todo_create"),
        ("result", "call_a"), ("result", "call_b"),
    ]
    assert dialect.results(second) == {"call_a": nodes[2].text, "call_b": nodes[3].text}
    assert dialect.ends_with_tool_result(second) and dialect.last_role(second) != "assistant"
    if dialect is OpenAIDialect:
        assert first.body["parallel_tool_calls"] is True
        sent = [m for m in second.body["messages"] if m["role"] == "assistant"][0]["tool_calls"]
        assert [json.loads(c["function"]["arguments"]) for c in sent] == [{"subject": "first"}, {"subject": "second"}]
    else:
        sent = [b for b in second.body["messages"][1]["content"] if b["type"] == "tool_use"]
        assert [b["input"] for b in sent] == [{"subject": "first"}, {"subject": "second"}]


def test_arguments_that_are_not_json_become_an_invalid_arguments_result_the_model_sees(fast, fake, llm_session, dialect):
    broken = '{"subject": "broken",'
    fake.add(dialect.tools([("call_x", "todo_create", broken)], stream=True), dialect.text("I see my mistake.", stream=True))
    api, sid, job = turn(llm_session, dialect)

    assert job.status == "succeeded", job.error_reason
    assert job.result == "I see my mistake."
    call, result = written(job)[1:3]
    assert call.tool_calls[0]["arguments"] == broken
    assert result.metadata["is_error"] is True
    assert result.text.startswith("invalid_arguments: arguments are not valid JSON")
    assert not Todo.objects.filter(session_id=sid).exists()

    second = fake.requests[1]
    assert dialect.results(second)["call_x"] == result.text
    if dialect is OpenAIDialect:
        replayed = [m for m in second.body["messages"] if m["role"] == "assistant"][0]["tool_calls"][0]
        assert replayed["function"]["arguments"] == broken
    else:
        replayed = [b for b in second.body["messages"][1]["content"] if b["type"] == "tool_use"][0]
        assert replayed["input"] == {"_invalid_json": broken}


def test_arguments_the_tool_schema_rejects_become_an_invalid_arguments_result(fast, fake, llm_session, dialect):
    fake.add(dialect.tools([("call_y", "todo_create", {"subject": "x", "bogus": 1})]), dialect.text("retrying later"))
    _, _, job = turn(llm_session, dialect, limits={"stream": False})
    assert job.status == "succeeded"
    result = written(job)[2]
    assert result.text.startswith("invalid_arguments:") and "bogus" in result.text
    assert "invalid_arguments" in dialect.results(fake.requests[1])["call_y"]


def test_an_unknown_tool_name_is_an_error_result_and_the_turn_goes_on(fast, fake, llm_session, dialect):
    fake.add(dialect.tools([("call_z", "no_such_tool", {})], stream=True), dialect.text("ok then", stream=True))
    _, _, job = turn(llm_session, dialect)
    assert job.status == "succeeded" and job.result == "ok then"
    assert written(job)[2].text.startswith("unknown_tool:")


# --- retries and errors -------------------------------------------------------------------------------


def test_a_429_is_retried_and_the_retry_is_an_event(fast, fake, llm_session, dialect):
    fake.add(dialect.error(429, "slow down", {"retry-after": "0"}), dialect.text("after the retry", stream=True))
    api, sid, job = turn(llm_session, dialect)

    assert job.status == "succeeded", job.error_reason
    assert job.result == "after the retry"
    assert len(fake.requests) == 2
    [retry] = events(api, sid, "model.retry")
    assert retry["payload"]["job"] == job.pk
    assert retry["payload"]["attempt"] == 1 and retry["payload"]["status"] == 429
    assert retry["payload"]["code"] == "provider_rate_limited"
    assert retry["payload"]["reason"] == f"connection {connection_name(dialect)!r} is rate limiting (HTTP 429)"
    assert "slow down" not in json.dumps(retry)  # no text of the remote host


@pytest.mark.parametrize(("status", "code"), [(500, "provider_error"), (429, "provider_rate_limited")])
def test_errors_until_the_retries_run_out_fail_the_job_with_a_readable_reason(fast, fake, llm_session, dialect, status, code):
    fake.add(*[dialect.error(status, "the backend is on fire") for _ in range(3)])
    api, sid, job = turn(llm_session, dialect, limits={"max_retries": 2})

    assert job.status == "failed" and job.is_error
    assert job.error_code == code
    assert f"HTTP {status}" in job.error_reason and "the backend is on fire" not in job.error_reason
    assert "gave up after 2 retries" in job.error_reason
    assert len(fake.requests) == 3
    assert [e["payload"]["attempt"] for e in events(api, sid, "model.retry")] == [1, 2]
    shown = api.get(f"/api/executions/{job.pk}").json()
    assert shown["status"] == "failed" and shown["error_code"] == code


def test_the_retry_count_comes_from_settings(fast, fake, llm_session, dialect):
    fast.TRELLIS_MODEL_RETRIES = 1
    fake.add(*[dialect.error(503, "unavailable") for _ in range(3)])
    _, _, job = turn(llm_session, dialect)
    assert job.status == "failed" and "gave up after 1 retry" in job.error_reason
    assert len(fake.requests) == 2


def test_a_rejected_key_fails_at_once_and_the_reason_never_shows_the_key(fast, fake, llm_session, dialect):
    fake.add(dialect.error(401, f"Incorrect API key provided: {SECRETS[dialect.name]}"))
    api, sid, job = turn(llm_session, dialect)

    assert job.status == "failed" and job.error_code == "provider_auth"
    assert "HTTP 401" in job.error_reason and KEY_ENV[dialect.name] in job.error_reason
    assert connection_name(dialect) in job.error_reason
    assert "Incorrect API key" not in job.error_reason and SECRETS[dialect.name] not in job.error_reason
    assert len(fake.requests) == 1
    assert not events(api, sid, "model.retry")


def test_a_missing_key_variable_fails_readably_without_calling_the_model(fast, fake, llm_session, dialect):
    operator_connection("no-key-set", dialect.name, dialect.base_url(fake), "TRELLIS_TEST_NO_SUCH_KEY")
    _, _, job = turn(llm_session, dialect, connection="no-key-set")
    assert job.status == "failed" and job.error_code == "provider_auth"
    assert "TRELLIS_TEST_NO_SUCH_KEY" in job.error_reason and "not set" in job.error_reason
    assert fake.requests == []


def test_an_unreachable_endpoint_is_retried_then_fails(fast, fake, llm_session, dialect):
    operator_connection("nobody-home", dialect.name, f"http://127.0.0.1:{free_port()}", KEY_ENV[dialect.name])
    api, sid, job = turn(llm_session, dialect, connection="nobody-home", limits={"max_retries": 1})
    assert job.status == "failed" and job.error_code == "provider_unreachable"
    assert job.error_reason == "could not reach connection 'nobody-home' (connection error) (gave up after 1 retry)"
    assert len(events(api, sid, "model.retry")) == 1


def test_a_model_that_does_not_answer_in_time_times_out(fast, fake, llm_session, dialect):
    fake.add(Reply(body={}, delay=3.0))  # answered at all, it would fail otherwise (an empty body)
    _, _, job = turn(llm_session, dialect, limits={"timeout_seconds": 0.5, "max_retries": 0, "stream": False})
    assert job.status == "failed" and job.error_code == "provider_timeout"
    assert "did not answer within 0.5 s" in job.error_reason


def test_a_bad_model_option_fails_the_turn_readably(fast, fake, llm_session, dialect):
    _, _, job = turn(llm_session, dialect, limits={"max_retries": "many"})
    assert job.status == "failed" and job.error_code == "provider_config"
    assert "limits.max_retries" in job.error_reason


def test_a_spec_for_a_real_provider_needs_a_model(team, api_as, fake, dialect):
    r = api_as(team.owner).post("/api/projects/alpha/agent-specs", spec_body(dialect, fake, model=""))
    assert r.status_code == 400 and r.json()["code"] == "invalid_model"


def test_the_cost_limit_ends_a_turn_that_costs_more(fast, fake, llm_session, dialect, team, api_as):
    r = api_as(team.owner).patch("/api/projects/alpha/limits", {"max_cost_per_job": "0.01"})
    assert r.status_code == 200, r.content
    fake.add(dialect.tools([("c1", "todo_list", {})], stream=True))
    _, _, job = turn(llm_session, dialect)
    assert job.status == "failed" and job.error_code == "quota.cost_exhausted"
    assert job.cost == Decimal("0.025")


def test_prices_match_the_longest_listed_model_prefix(settings):
    from collab.runtime.providers.remote import model_cost

    settings.TRELLIS_MODEL_PRICES = {"gpt-4o": (2.5, 10), "gpt-4o-mini": (0.15, 0.6)}
    assert model_cost("gpt-4o-2024-08-06", 1_000_000, 1_000_000) == Decimal("12.5")
    assert model_cost("gpt-4o-mini-2024-07-18", 2_000_000, 0) == Decimal("0.3")
    assert model_cost("unlisted", 10**9, 10**9) == 0


def test_the_operators_prices_add_to_and_override_the_built_in_table(settings):
    from collab.runtime.providers.remote import BUILTIN_PRICES, model_cost, price_table

    settings.TRELLIS_MODEL_PRICES = {"my-model": (1.0, 2.0), "gpt-4o": (9.0, 9.5)}
    table = price_table()
    assert table["my-model"] == (1.0, 2.0) and table["gpt-4o"] == (9.0, 9.5)
    assert table["claude-sonnet-4"] == BUILTIN_PRICES["claude-sonnet-4"]
    # one table: the longest listed prefix wins whichever list it came from
    assert model_cost("gpt-4o-mini-2024-07-18", 1_000_000, 0) == Decimal("0.15")


def _prices_from_env(tmp_path, value: str):
    code = "import config.settings as s; import json; print(json.dumps(s.TRELLIS_MODEL_PRICES))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TRELLIS_", "DATABASE_URL", "REDIS_URL"))}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "TRELLIS_VAR_DIR": str(tmp_path), "TRELLIS_MODEL_PRICES": value})


def test_the_price_table_is_overridable_by_env_json_and_a_bad_value_stops_the_process(tmp_path):
    r = _prices_from_env(tmp_path, '{"my-model": [1, 2], "gpt-4o": [9, 9.5]}')
    assert r.returncode == 0, r.stderr
    prices = json.loads(r.stdout)
    assert prices == {"my-model": [1, 2], "gpt-4o": [9, 9.5]}
    r = _prices_from_env(tmp_path, '{"my-model": [1]}')
    assert r.returncode != 0 and "ImproperlyConfigured" in r.stderr and "TRELLIS_MODEL_PRICES" in r.stderr


# --- history → request ----------------------------------------------------------------------------------


def test_history_goes_back_in_order_with_user_input_after_all_tool_results(fast, fake, llm_session, dialect):
    """The mailbox on the wire: a second turn sends the first turn's call, its result and
    answer, then the new prompt; no request ends with an assistant message."""
    fake.add(
        dialect.tools([("t1", "todo_create", {"subject": "plan"})], stream=True), dialect.text("made a plan", stream=True),
        dialect.text("second answer", stream=True),
    )
    api, sid, _ = llm_session(dialect)
    first = run_inline(start_turn(api, sid, "make a plan"))
    assert first.status == "succeeded"
    second = run_inline(start_turn(api, sid, "and now?"))
    assert second.status == "succeeded" and second.result == "second answer"

    last = fake.requests[-1]
    assert dialect.flat(last) == [
        ("user", "make a plan"), ("call", "todo_create"), ("result", "t1"), ("assistant", "made a plan"),
        ("user", "and now?"),
    ]
    assert all(dialect.last_role(r) != "assistant" for r in fake.requests)


def test_a_fork_sends_the_history_it_inherited(fast, fake, llm_session, dialect):
    fake.add(dialect.text("the parent's answer", stream=True), dialect.text("the fork's answer", stream=True))
    api, sid, _ = llm_session(dialect)
    parent = run_inline(start_turn(api, sid, "parent prompt"))
    address = f"{sid}:{Branch.objects.get(pk=parent.branch_id).tip_id}"
    r = api.post(f"/api/branches/{address}/tools/agent", {"arguments": {
        "prompt": "carry on from here", "description": "fork", "start_from": "inherit", "run_in_background": True}})
    assert r.status_code == 200 and not r.json()["is_error"], r.content
    child = run_inline(r.json()["details"]["execution_id"])
    assert child.status == "succeeded" and child.result == "the fork's answer"

    flat = dialect.flat(fake.requests[-1])
    assert flat[:2] == [("user", "parent prompt"), ("assistant", "the parent's answer")]
    assert flat[2][0] == "user" and flat[2][1].startswith("[task from ") and flat[2][1].endswith("carry on from here")
    assert len(flat) == 3


def _node(role, text="", kind="normal", tool_calls=None, tool_call_id="", **metadata):
    return SimpleNamespace(role=role, text=text, kind=kind, tool_calls=tool_calls, tool_call_id=tool_call_id, metadata=metadata)


HISTORY = [
    _node("user", "[task from s:1]\n\ndo it", kind="task", header="[task from s:1]"),
    _node("assistant", "calling", tool_calls=[
        {"id": "call_0_0", "name": "todo_list", "arguments": {}},
        {"id": "call_0_1", "name": "agent", "arguments": {"prompt": "p"}},
    ]),
    _node("system", "", kind="attach", target="s2:9"),
    _node("tool", "no todos", tool_call_id="call_0_0", tool="todo_list"),
    _node("tool", "spawned", tool_call_id="call_0_1", tool="agent"),
    _node("user", "[result from s2:9] 42", kind="agent_message"),
    _node("assistant", "done: 42"),
    _node("user", "again", kind="followup"),
    _node("user", "and a message", kind="message"),
    # a turn that ended between a call and its result, then the same scripted call id again
    _node("assistant", "", tool_calls=[{"id": "call_0_0", "name": "todo_list", "arguments": {}}]),
    _node("user", "new prompt"),
    _node("assistant", "", tool_calls=[{"id": "call_0_0", "name": "bad name!", "arguments": "{oops"}]),
    _node("tool", "invalid_arguments: …", tool_call_id="call_0_0", tool="bad name!", is_error=True),
]


def test_the_openai_mapping():
    messages = openai_messages(HISTORY, "system prompt")
    assert messages == [
        {"role": "system", "content": "system prompt"},
        {"role": "user", "content": "[task from s:1]\n\ndo it"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "call_0_0", "type": "function", "function": {"name": "todo_list", "arguments": "{}"}},
            {"id": "call_0_1", "type": "function", "function": {"name": "agent", "arguments": '{"prompt": "p"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": "no todos"},
        {"role": "tool", "tool_call_id": "call_0_1", "content": "spawned"},
        {"role": "user", "content": "[result from s2:9] 42"},
        {"role": "assistant", "content": "done: 42"},
        {"role": "user", "content": "again\n\nand a message"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "todo_list", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "error: no result (the turn ended before this tool call finished)"},
        {"role": "user", "content": "new prompt"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "bad_name_", "arguments": "{oops"}}]},
        {"role": "tool", "tool_call_id": "call_3", "content": "invalid_arguments: …"},
    ]


def test_the_anthropic_mapping():
    messages = anthropic_messages(HISTORY)
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_0_0", "content": "no todos"},
        {"type": "tool_result", "tool_use_id": "call_0_1", "content": "spawned"},
        {"type": "text", "text": "[result from s2:9] 42"},
    ]
    assert messages[4]["content"] == [{"type": "text", "text": "again\n\nand a message"}]
    assert messages[6]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_2", "is_error": True,
         "content": "error: no result (the turn ended before this tool call finished)"},
        {"type": "text", "text": "new prompt"},
    ]
    assert messages[7]["content"] == [{"type": "tool_use", "id": "call_3", "name": "bad_name_", "input": {"_invalid_json": "{oops"}}]
    assert messages[8]["content"] == [{"type": "tool_result", "tool_use_id": "call_3", "content": "invalid_arguments: …", "is_error": True}]


def test_a_request_never_starts_or_ends_with_an_assistant_message():
    history = [_node("assistant", "orphan answer")]
    assert [m["role"] for m in openai_messages(history, fallback_user_text="the prompt")] == ["user", "assistant", "user"]
    assert anthropic_messages(history, fallback_user_text="the prompt")[-1] == {
        "role": "user", "content": [{"type": "text", "text": "the prompt"}]}


# --- naming stage 2 ----------------------------------------------------------------------------------------


def test_title_asks_the_model_for_a_short_name(fast, fake, llm_session, dialect):
    from collab.runtime.naming import auto_name_branch

    fake.add(dialect.text("hello", stream=True))
    api, sid, first = turn(llm_session, dialect)
    address = f"{sid}:{Branch.objects.get(pk=first.branch_id).tip_id}"
    r = api.post(f"/api/branches/{address}/tools/agent", {"arguments": {
        "prompt": "Study the tides of the North Sea coast", "run_in_background": True}})
    assert r.status_code == 200 and not r.json()["is_error"], r.content
    child = Branch.objects.get(pk=Job.objects.get(pk=r.json()["details"]["execution_id"]).branch_id)

    fake.add(dialect.text('"Tidal Patterns Of The North Sea Coast Explained In Depth Today."'))
    renamed = auto_name_branch(child.pk)
    assert renamed.name == "Tidal Patterns Of The North Sea Coast Explained"
    request = fake.requests[-1]
    assert dialect.system(request) == TITLE_SYSTEM
    assert "tools" not in request.body and not request.body.get("stream")
    assert any("Study the tides of the North Sea coast" in t for t in dialect.user_texts(request))
    assert "[task from" not in " ".join(dialect.user_texts(request))

    fake.add(*[dialect.error(500, "down") for _ in range(4)])
    before = Branch.objects.get(pk=child.pk).name
    assert auto_name_branch(child.pk) is None  # a failing model leaves the name alone
    assert Branch.objects.get(pk=child.pk).name == before


# --- secrets -------------------------------------------------------------------------------------------------


def rows_containing(needle: str) -> list[str]:
    """Every table of the database whose rows mention ``needle`` anywhere."""
    hits = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                if any(needle in (v.decode(errors="replace") if isinstance(v, (bytes, memoryview)) else str(v))
                       for v in (bytes(x) if isinstance(x, memoryview) else x for x in row)):
                    hits.append(table)
                    break
    return hits


def test_no_key_ever_reaches_the_database_the_api_events_or_logs(fast, fake, llm_session, dialect, caplog):
    caplog.set_level(logging.DEBUG)
    secret = SECRETS[dialect.name]
    fake.add(
        dialect.error(429, f"slow down, {secret}"),
        dialect.tools([("k1", "todo_create", {"subject": "s"})], stream=True),
        dialect.text("done", stream=True),
        dialect.error(401, f"Incorrect API key provided: {secret}"),
    )
    api, sid, spec = llm_session(dialect)
    ok = run_inline(start_turn(api, sid, "go"))
    failed = run_inline(start_turn(api, sid, "again"))
    assert ok.status == "succeeded" and failed.error_code == "provider_auth"
    assert all(dialect.key(r) == secret for r in fake.requests)  # the key did go to the model …

    assert secret not in json.dumps(spec)  # … and nowhere else
    assert spec["api_key_env"] == KEY_ENV[dialect.name] and spec["connection"] == connection_name(dialect)
    assert rows_containing(secret) == []
    assert rows_containing(KEY_ENV[dialect.name])  # the scan does see text columns
    for path in (f"/api/sessions/{sid}/events", f"/api/executions/{ok.pk}", f"/api/executions/{failed.pk}",
                 f"/api/executions?session={sid}", f"/api/sessions/{sid}"):
        assert secret not in api.get(path).content.decode()
    assert events(api, sid, "model.retry")
    assert "slow down" in caplog.text  # provider text is logged, scrubbed
    assert secret not in caplog.text


# --- through the real worker ----------------------------------------------------------------------------------


def _last_user_text(dialect, request) -> str:
    texts = dialect.user_texts(request)
    return texts[-1] if texts else ""


def helper_responder(dialect):
    """The model of a main agent that delegates to a background helper and answers when the
    helper's result arrives (by mailbox or follow-up turn), and of the helper itself."""

    def respond(request):
        stream = bool(request.body.get("stream"))
        if dialect.system(request) == TITLE_SYSTEM:
            return dialect.text("A Title")
        texts = dialect.user_texts(request)
        if any(t.startswith("[task from") for t in texts):
            return dialect.text("the helper says 42", stream=stream)
        if "[result from" in _last_user_text(dialect, request):
            return dialect.text("final: the helper found 42", stream=stream)
        if dialect.ends_with_tool_result(request):
            return dialect.text("I asked a helper; waiting for it.", stream=stream)
        return dialect.tools([("spawn_1", "agent", {
            "prompt": "What is 6 times 7?", "description": "helper", "run_in_background": True})], stream=stream)

    return respond


@pytest.mark.slow
def test_a_full_turn_in_the_worker_spawns_a_helper_and_answers_after_its_follow_up(fake, llm_session, dialect, worker):
    """A background result with a real model API: the model calls ``agent`` in the background, the
    helper's result comes back, the final answer is stored; the requests show it all."""
    fake.responder = helper_responder(dialect)
    api, sid, _ = llm_session(dialect)
    first = api.wait(start_turn(api, sid, "Find out what 6 times 7 is."))
    assert first["status"] == "succeeded", first

    def final_job():
        jobs = api.get("/api/executions", session=sid).json()
        return next((j for j in jobs if j["result"].startswith("final:") and j["status"] == "succeeded"), None)

    final = poll(final_job, timeout=30.0, interval=0.1, what="the final answer")
    assert final["branch"] == first["branch"] and final["result"] == "final: the helper found 42"
    main = Branch.objects.get(pk=first["branch"])
    tip = Message.objects.get(pk=main.tip_id)
    assert (tip.role, tip.text, tip.job_id) == ("assistant", "final: the helper found 42", final["id"])
    transcript = api.get(f"/api/branches/{sid}:{tip.pk}/transcript").json()["text"]
    assert transcript.rstrip().endswith("final: the helper found 42")

    key = SECRETS[dialect.name]
    requests = [r for r in fake.requests if dialect.system(r) != TITLE_SYSTEM]
    assert all(r.path == dialect.path and dialect.key(r) == key for r in requests)
    assert all(dialect.last_role(r) != "assistant" for r in requests)
    opening = requests[0]
    assert dialect.flat(opening) == [("user", "Find out what 6 times 7 is.")]
    assert "agent" in dialect.tool_names(opening)
    assert dialect.tool_schema(opening, "agent") == registry_tools()["agent"]

    helper = [r for r in requests if any(t.startswith("[task from") for t in dialect.user_texts(r))]
    assert len(helper) == 1 and dialect.user_texts(helper[0])[0].endswith("What is 6 times 7?")
    closing = [r for r in requests if "[result from" in _last_user_text(dialect, r)]
    assert len(closing) == 1
    flat = dialect.flat(closing[0])
    assert flat[:3] == [("user", "Find out what 6 times 7 is."), ("call", "agent"), ("result", "spawn_1")]
    assert flat[-1][0] == "user" and flat[-1][1].startswith("[result from") and "the helper says 42" in flat[-1][1]
    assert key not in worker.log.read_text(errors="replace")


@pytest.mark.slow
def test_cancel_closes_a_slow_stream_promptly(fake, llm_session, dialect, worker):
    stream = dialect.text("word " * 200, stream=True, pieces=200, delay=0.1)  # ~20 s if nobody stops it
    fake.add(stream)
    api, sid, _ = llm_session(dialect)
    execution = start_turn(api, sid, "talk slowly")
    fake.wait(lambda: fake.chunks >= 5, what="the stream to start")

    version = api.get(f"/api/executions/{execution}").json()["version"]
    r = api.post(f"/api/executions/{execution}/commands",
                 {"command_id": f"stop-{execution}", "action": "execution.cancel", "expected_version": version, "payload": {}})
    assert r.status_code == 202, r.content
    done = api.wait(execution, timeout=10)
    assert done["status"] == "cancelled"
    fake.wait(lambda: fake.disconnects, timeout=5, what="the stream to be closed")
    assert fake.chunks < len(stream.events)  # closed by the cancel, before the stream had ended by itself
    assert Message.objects.filter(job_id=execution, role="assistant").count() == 0


@pytest.mark.parametrize("name", ["DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL", "HOME", "DJANGO_DB_TOKEN"])
def test_an_agent_spec_cannot_name_the_servers_own_secrets_as_its_key(team, api_as, name):
    """A tenant cannot name a worker variable at all: api_key_env is accepted only when
    it names the key variable of a connection the project may use."""
    r = api_as(team.owner).post("/api/projects/alpha/agent-specs", {
        "agent_id": "thief", "provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key_env": name,
    })
    assert r.status_code == 400 and r.json()["code"] == "provider_config", r.content


@pytest.mark.slow
def test_streamed_tokens_reach_the_page_in_batches_while_the_model_generates(fake, llm_session, dialect, worker, client):
    """Tokens appear on the session page as they arrive, batched into
    a few ``message.delta`` events (never one per token), under a visible "generating" state; the
    final answer replaces it."""
    words = [f"w{i}" for i in range(60)]
    fake.add(dialect.text(" ".join(words), stream=True, pieces=60, delay=0.05))  # ~3 s of streaming
    api, sid, _ = llm_session(dialect)
    execution = start_turn(api, sid, "stream to me")
    client.force_login(team_member(api))
    seen = ""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and api.get(f"/api/executions/{execution}").json()["status"] != "succeeded":
        html = client.get(f"/s/{sid}/transcript").content.decode()
        if "generating…" in html and "w5" in html:
            seen = html
        time.sleep(0.1)
    assert seen, "the page never showed the text while the model was generating"
    assert 'class="msg role-assistant generating"' in seen
    done = api.wait(execution)
    assert done["status"] == "succeeded"
    deltas = events(api, sid, "message.delta")
    assert 2 <= len(deltas) < 30, len(deltas)  # batched: far fewer events than the 60 fragments
    assert "".join(d["payload"]["text"] for d in deltas) == " ".join(words)
    final = client.get(f"/s/{sid}/transcript").content.decode()
    assert "generating…" not in final and "w59" in final


def team_member(api):
    """The user behind an API client's bearer token."""
    from accounts.policy import user_for_token

    return user_for_token(api.headers["HTTP_AUTHORIZATION"].split()[1])


def test_tokens_and_cost_are_summed_per_branch_session_and_project(fake, llm_session, dialect, fast):
    """Accounting on the Job, summed per branch/session/project in the
    API and shown on the page."""
    fake.add(dialect.text("one", stream=True, usage=(11, 7)), dialect.text("two", stream=True, usage=(5, 3)))
    api, sid, _ = llm_session(dialect)
    jobs = [run_inline(start_turn(api, sid, "first")), run_inline(start_turn(api, sid, "second"))]
    assert [(j.tokens_in, j.tokens_out) for j in jobs] == [(11, 7), (5, 3)], [(j.status, j.error_reason) for j in jobs]
    session = api.get(f"/api/sessions/{sid}").json()
    assert session["usage"]["tokens_in"] == 16 and session["usage"]["tokens_out"] == 10
    assert float(session["usage"]["cost"]) > 0
    branch = api.get(f"/api/sessions/{sid}/branches").json()[0]
    assert branch["usage"] == session["usage"]
    project = api.get("/api/projects/alpha").json()
    assert project["usage"]["tokens_in"] >= 16
    from django.test import Client

    page = Client()
    page.force_login(team_member(api))
    assert "tokens 16 in / 10 out" in page.get(f"/s/{sid}/jobs").content.decode()
