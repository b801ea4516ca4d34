"""Traces of the agents' turns (docs/operations.md#traces), read by an OTLP/HTTP receiver in this
process (a small ``http.server`` decoding ``ExportTraceServiceRequest``).

End to end on real ``qcluster`` processes started here, one with ``OTEL_EXPORTER_OTLP_ENDPOINT``
naming the receiver and one without it: a person's turn whose agent spawns a child that spawns a
grandchild (foreground, run inline), a background child whose result comes back as a follow-up
turn, and a ``send_message`` to an agent of another session. With tracing on, all of it is one
trace, each turn's ``invoke_agent`` span under the ``execute_tool`` span of the call that admitted
it, and the tokens the ``chat`` spans report add up to the executions' usage as the API shows it;
off, nothing is exported and no job carries a trace context.

The tasks go to queues of their own (``Q_CLUSTER_NAME``), served only by the clusters started here.
"""

import gzip
import os
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from collab.infra import tracing
from collab.models import Job
from tests.collab.test_liveness import stop_cluster
from tests.collab.test_turn_queries import Counted, no_worker  # noqa: F401 (a fixture)
from tests.conftest import (
    ROOT,
    _wait_for_output,
    agent_call,
    cancel,
    execution,
    make_spec,
    open_session,
    poll,
    set_limits,
    settle,
    settle_worker,
    step,
    tool_results,
    turn,
)

pytestmark = pytest.mark.slow

WAIT = 120.0  # generous for a loaded machine; never reached when things work
BG_SLEEP_MS = 3000  # the background child outlives its caller's turn: its result comes back as a follow-up turn


# --- the receiver ------------------------------------------------------------------------------


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every span it was sent, decoded."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[dict] = []
        self.requests = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                spans = []
                for resource_spans in request.resource_spans:
                    resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            spans.append({
                                "path": self.path, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(), "name": span.name, "kind": span.kind,
                                "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                                "status": span.status.code, "status_message": span.status.message,
                                "resource": resource, "scope": scope_spans.scope.name,
                                "schema_url": scope_spans.schema_url,
                            })
                with receiver.lock:
                    receiver.requests += 1
                    receiver.spans += spans
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of(self, execution_ids) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["attributes"].get("trellis.execution.id") in execution_ids]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def decoy():
    """A receiver an untraced worker is pointed at by every OTLP variable but the one that turns
    traces on: it must hear nothing."""
    r = Receiver()
    yield r
    r.close()


# --- the clusters ------------------------------------------------------------------------------


def _without_otel(env: dict) -> dict:
    return {k: v for k, v in env.items() if not k.startswith("OTEL_")}


def start_cluster(env: dict, log):
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"], env=env, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    _wait_for_output(log, "running.", proc, 60)
    proc.log = log
    proc.queue = env["Q_CLUSTER_NAME"]
    return proc


@pytest.fixture(scope="module")
def traced_cluster(process_env, receiver, tmp_path_factory):
    """Two worker processes exporting their spans to ``receiver`` (a batch every 100 ms)."""
    env = dict(_without_otel(process_env), Q_CLUSTER_NAME=process_env["TRELLIS_QUEUE_NAME"] + "-traces",
               TRELLIS_WORKERS="2", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="100")
    proc = start_cluster(env, tmp_path_factory.mktemp("traces") / "qcluster.log")
    yield proc
    stop_cluster(proc)


@pytest.fixture(scope="module")
def untraced_cluster(process_env, decoy, tmp_path_factory):
    """A worker process without ``OTEL_EXPORTER_OTLP_ENDPOINT``, though the trace-specific endpoint
    and a short batch delay name ``decoy``."""
    env = dict(_without_otel(process_env), Q_CLUSTER_NAME=process_env["TRELLIS_QUEUE_NAME"] + "-untraced",
               TRELLIS_WORKERS="1", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{decoy.url}/v1/traces",
               OTEL_BSP_SCHEDULE_DELAY="100")
    proc = start_cluster(env, tmp_path_factory.mktemp("untraced") / "qcluster.log")
    yield proc
    stop_cluster(proc)


@pytest.fixture
def served_by(transactional_db, monkeypatch):
    """``served_by(cluster)``: the turns this test admits go to that cluster's queue. Afterwards
    whatever is still open is cancelled and the workers are let go quiet."""
    from django_q.conf import Conf

    def serve(cluster):
        assert cluster.poll() is None, cluster.log.read_text()[-3000:]
        monkeypatch.setattr(Conf, "CLUSTER_NAME", cluster.queue)
        return cluster

    yield serve
    settle_worker(timeout=30)


# --- the scenario --------------------------------------------------------------------------------


def usage(tokens_in: int, tokens_out: int) -> dict:
    return {"input_tokens": tokens_in, "output_tokens": tokens_out}


def build_tree(api) -> dict:
    """A desk agent in a session of its own (one turn behind it), then a person's turn of
    ``root``: it calls ``mid`` (which calls ``leaf``), then starts ``bg`` in the background and
    sends the desk a message. Returns the sessions, the root's execution and the tokens each
    agent's script reports, per turn kind."""
    set_limits(api, max_spawn_depth=2)
    make_spec(api, "desk", {"user": [{"text": "desk ready", "usage": usage(1, 1)}],
                            "message": [{"text": "noted", "usage": usage(501, 51)}]})
    desk = open_session(api, "desk", title="desk")
    desk_turn = turn(api, desk)
    assert api.wait(desk_turn)["status"] == "succeeded"
    desk_address = f"{desk}:{execution(api, desk_turn)['prompt_msg']}"
    make_spec(api, "leaf", [{"text": "leaf done", "usage": usage(301, 31)}])
    make_spec(api, "mid", [{**step(agent_call("dig", agent_id="leaf", background=False)), "usage": usage(201, 21)},
                           {"text": "mid done", "usage": usage(202, 22)}])
    make_spec(api, "bg", [{"sleep_ms": BG_SLEEP_MS, "text": "bg done", "usage": usage(401, 41)}])
    make_spec(api, "root", {
        "user": [
            {**step(agent_call("plan the work", agent_id="mid", background=False)), "usage": usage(101, 11)},
            {**step(agent_call("later", agent_id="bg"),
                    {"name": "send_message", "arguments": {"to": desk_address, "message": "fyi"}}),
             "usage": usage(102, 12)},
            {"text": "root done", "usage": usage(103, 13)},
        ],
        "followup": [{"text": "got it", "usage": usage(104, 14)}],
    })
    root = open_session(api, "root", title="root")
    root_turn = turn(api, root, "build it")
    jobs = settle(api, root, desk, timeout=WAIT)
    return {"root": root, "desk": desk, "root_turn": root_turn, "desk_turn": desk_turn, "jobs": jobs}


EXPECTED_TOKENS = {  # (kind, agent_id) -> the tokens in and out its script reports over the turn
    ("user", "root"): (101 + 102 + 103, 11 + 12 + 13),
    ("spawn", "mid"): (201 + 202, 21 + 22),
    ("spawn", "leaf"): (301, 31),
    ("spawn", "bg"): (401, 41),
    ("message", "desk"): (501, 51),
    ("followup", "root"): (104, 14),
}


def spec_of(job: dict) -> str:
    return Job.objects.select_related("agent_spec").get(pk=job["id"]).agent_spec.agent_id


def one(spans, **where) -> dict:
    found = [s for s in spans if all((s["attributes"].get(k) if k not in ("name", "parent") else s[k]) == v
                                     for k, v in where.items())]
    assert len(found) == 1, (where, [(s["name"], s["attributes"]) for s in spans])
    return found[0]


# --- tracing on ----------------------------------------------------------------------------------


def test_a_person_turn_and_everything_it_causes_is_one_trace_with_each_turn_under_the_call_that_admitted_it(
        team, api_as, served_by, traced_cluster, receiver):
    served_by(traced_cluster)
    api = api_as(team.owner)
    tree = build_tree(api)
    tree_jobs = [j for j in tree["jobs"] if j["id"] != tree["desk_turn"]]
    by_kind = {(j["kind"], spec_of(j)): j for j in tree_jobs}
    assert set(by_kind) == set(EXPECTED_TOKENS), by_kind
    assert all(j["status"] == "succeeded" for j in tree_jobs), tree_jobs
    ids = {j["id"] for j in tree_jobs}

    # every turn's invoke_agent span, and a chat span per model call, reached the receiver
    expected_chats = Counter({j["id"]: j["model_calls"] for j in tree_jobs})

    def all_exported():
        spans = receiver.of(ids)
        invoked = {s["attributes"]["trellis.execution.id"] for s in spans
                   if s["attributes"].get("gen_ai.operation.name") == "invoke_agent"}
        chats = Counter(s["attributes"]["trellis.execution.id"] for s in spans
                        if s["attributes"].get("gen_ai.operation.name") == "chat")
        return spans if invoked == ids and chats == expected_chats else None

    spans = poll(all_exported, timeout=WAIT, interval=0.1, what="every span of the tree")
    assert len(spans) == len({s["span_id"] for s in spans}), "a span was exported twice"

    # one trace: the person's turn started it, its id derived from that execution's id
    root_trace = f"{tracing.trace_id_of(tree['root_turn']):032x}"
    assert {s["trace_id"] for s in spans} == {root_trace}
    # ... and the desk's own first turn (a person's) is a trace of its own
    desk_own = receiver.of({tree["desk_turn"]})
    assert desk_own and {s["trace_id"] for s in desk_own} == {f"{tracing.trace_id_of(tree['desk_turn']):032x}"}

    invoke = {key: one(spans, **{"gen_ai.operation.name": "invoke_agent", "trellis.execution.id": job["id"]})
              for key, job in by_kind.items()}
    root, mid = invoke[("user", "root")], invoke[("spawn", "mid")]

    def tool_span(of, call_id):
        return one(spans, **{"gen_ai.operation.name": "execute_tool", "trellis.execution.id":
                             of["attributes"]["trellis.execution.id"], "gen_ai.tool.call.id": call_id})

    # the person's turn is the root; the children hang under the calls that admitted them, the
    # follow-up under the completion of the turn whose result it carries
    assert root["parent"] == ""
    assert tool_span(root, "call_0_0")["name"] == "execute_tool agent"
    assert mid["parent"] == tool_span(root, "call_0_0")["span_id"]
    assert invoke[("spawn", "leaf")]["parent"] == tool_span(mid, "call_0_0")["span_id"]
    assert invoke[("spawn", "bg")]["parent"] == tool_span(root, "call_1_0")["span_id"]
    assert tool_span(root, "call_1_1")["name"] == "execute_tool send_message"
    assert invoke[("message", "desk")]["parent"] == tool_span(root, "call_1_1")["span_id"]
    assert invoke[("followup", "root")]["parent"] == invoke[("spawn", "bg")]["span_id"]
    # a turn's model and tool calls hang under its own invoke_agent span
    for span in spans:
        if span["attributes"]["gen_ai.operation.name"] in ("chat", "execute_tool"):
            owner = invoke[next(k for k, j in by_kind.items() if j["id"] == span["attributes"]["trellis.execution.id"])]
            assert span["parent"] == owner["span_id"], span

    # what the job rows carried: the root nothing (it starts the trace), each other the span that
    # admitted it, with the root session in the tracestate
    rows = {j.pk: j.trace_context for j in Job.objects.filter(pk__in=ids)}
    assert rows[tree["root_turn"]] == ""
    for key, job in by_kind.items():
        if key == ("user", "root"):
            continue
        traceparent, state = rows[job["id"]].split(";")
        assert traceparent == f"00-{root_trace}-{invoke[key]['parent']}-01"
        assert state == f"trellis={tree['root']}"

    # the attributes of the GenAI conventions, and Trellis's own
    names = {b["id"]: b["name"] for sid in (tree["root"], tree["desk"])
             for b in api.get(f"/api/sessions/{sid}/branches").json()}
    for key, job in by_kind.items():
        attributes = invoke[key]["attributes"]
        assert invoke[key]["name"] == f"invoke_agent {names[job['branch']]}"
        assert (attributes["gen_ai.agent.name"], attributes["gen_ai.agent.id"], attributes["trellis.branch.id"]) == (
            names[job["branch"]], job["branch"], job["branch"])
        assert attributes["gen_ai.conversation.id"] == job["session"]
        assert attributes["trellis.root_session.id"] == tree["root"]
        assert (attributes["trellis.execution.kind"], attributes["trellis.agent_id"]) == key
        assert attributes["gen_ai.provider.name"] == "scripted"
        assert attributes["trellis.execution.status"] == "succeeded" and invoke[key]["status"] != 2
    for span in spans:
        operation = span["attributes"]["gen_ai.operation.name"]
        assert span["kind"] == {"invoke_agent": 1, "chat": 3, "execute_tool": 1}[operation]  # internal, client
        assert span["schema_url"] == tracing.SCHEMA_URL == f"https://opentelemetry.io/schemas/{tracing.SEMCONV_VERSION}"
        assert span["resource"]["service.name"] == "trellis" and span["path"] == "/v1/traces"
        if operation == "chat":
            assert span["name"] == "chat" and span["attributes"]["gen_ai.provider.name"] == "scripted"
        if operation == "execute_tool":
            assert span["attributes"]["gen_ai.tool.name"] == span["name"].removeprefix("execute_tool ")
            assert span["status"] != 2, span

    # tokens per agent: the chat spans add up to each execution's usage as the API shows it, and
    # the invoke_agent span carries the same sums
    for key, job in by_kind.items():
        shown = execution(api, job["id"])
        chats = [s for s in spans if s["attributes"]["gen_ai.operation.name"] == "chat"
                 and s["attributes"]["trellis.execution.id"] == job["id"]]
        summed = (sum(s["attributes"]["gen_ai.usage.input_tokens"] for s in chats),
                  sum(s["attributes"]["gen_ai.usage.output_tokens"] for s in chats))
        assert summed == (shown["tokens_in"], shown["tokens_out"]) == EXPECTED_TOKENS[key], key
        attributes = invoke[key]["attributes"]
        assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == summed
        assert (attributes["trellis.model_calls"], attributes["trellis.tool_calls"]) == (
            shown["model_calls"], shown["tool_calls"])
    # and the root session's usage is the sum of its turns' chat spans
    in_root = [s for s in spans if s["attributes"]["gen_ai.operation.name"] == "chat"
               and s["attributes"]["gen_ai.conversation.id"] == tree["root"]]
    session_usage = api.get(f"/api/sessions/{tree['root']}").json()["usage"]
    assert (session_usage["tokens_in"], session_usage["tokens_out"]) == (
        sum(s["attributes"]["gen_ai.usage.input_tokens"] for s in in_root),
        sum(s["attributes"]["gen_ai.usage.output_tokens"] for s in in_root))


def test_a_failed_a_cancelled_turn_and_a_refused_tool_call_end_their_spans_in_error_with_their_codes(
        team, api_as, served_by, traced_cluster, receiver):
    served_by(traced_cluster)
    api = api_as(team.owner)
    set_limits(api, max_tokens_per_job=50)
    make_spec(api, "spender", [{**step({"name": "no_such_tool", "arguments": {}}), "usage": usage(10, 0)},
                               {"text": "over budget", "usage": usage(60, 5)}])
    make_spec(api, "sleeper", [{"sleep_ms": 60_000, "text": "late"}])
    spender, sleeper = open_session(api, "spender"), open_session(api, "sleeper")
    failed = turn(api, spender)
    assert api.wait(failed, timeout=WAIT)["error_code"] == "quota.tokens_exhausted"
    stopped = turn(api, sleeper)
    poll(lambda: execution(api, stopped)["status"] == "running", timeout=WAIT, what="the sleeper to run")
    assert cancel(api, stopped).status_code == 202
    assert api.wait(stopped, timeout=WAIT)["status"] == "cancelled"

    def exported():
        spans = receiver.of({failed, stopped})
        return spans if len([s for s in spans if s["attributes"]["gen_ai.operation.name"] == "invoke_agent"]) == 2 \
            and len(spans) == 6 else None  # spender: invoke, 2 chats, 1 tool; sleeper: invoke, 1 chat

    spans = poll(exported, timeout=WAIT, interval=0.1, what="the spans of both turns")
    failed_run = one(spans, **{"gen_ai.operation.name": "invoke_agent", "trellis.execution.id": failed})
    assert (failed_run["status"], failed_run["status_message"]) == (2, "quota.tokens_exhausted")
    assert failed_run["attributes"]["error.type"] == "quota.tokens_exhausted"
    assert failed_run["attributes"]["trellis.execution.status"] == "failed"
    assert (failed_run["attributes"]["gen_ai.usage.input_tokens"], failed_run["attributes"]["gen_ai.usage.output_tokens"]) \
        == (70, 5) == (execution(api, failed)["tokens_in"], execution(api, failed)["tokens_out"])
    refused = one(spans, **{"gen_ai.operation.name": "execute_tool", "trellis.execution.id": failed})
    code = tool_results(failed)[0]["code"]
    assert code and (refused["status"], refused["attributes"]["error.type"]) == (2, code)
    assert refused["attributes"]["gen_ai.tool.name"] == "no_such_tool"

    cancelled_run = one(spans, **{"gen_ai.operation.name": "invoke_agent", "trellis.execution.id": stopped})
    assert (cancelled_run["status"], cancelled_run["status_message"]) == (2, "cancelled")
    assert cancelled_run["attributes"]["trellis.execution.status"] == "cancelled"
    interrupted_call = one(spans, **{"gen_ai.operation.name": "chat", "trellis.execution.id": stopped})
    assert interrupted_call["status"] == 2 and interrupted_call["parent"] == cancelled_run["span_id"]


def test_a_worker_that_stops_sends_the_spans_it_still_holds(team, api_as, served_by, process_env, tmp_path):
    """With a batch delay longer than the test, spans leave a worker only when it stops: the
    finished turn's at its exit, and those of a turn still running then when that turn ends (a
    stopping worker finishes the turns it holds)."""
    late = Receiver()
    try:
        env = dict(_without_otel(process_env), Q_CLUSTER_NAME=process_env["TRELLIS_QUEUE_NAME"] + "-traces-exit",
                   TRELLIS_WORKERS="1", OTEL_EXPORTER_OTLP_ENDPOINT=late.url, OTEL_BSP_SCHEDULE_DELAY="600000")
        cluster = served_by(start_cluster(env, tmp_path / "qcluster.log"))
        try:
            api = api_as(team.owner)
            make_spec(api, "quick", [{"text": "quick", "usage": usage(5, 1)}])
            make_spec(api, "slow", [{"sleep_ms": 2000, "text": "slow", "usage": usage(6, 2)}])
            quick = turn(api, open_session(api, "quick"))
            assert api.wait(quick, timeout=WAIT)["status"] == "succeeded"
            slow = turn(api, open_session(api, "slow"))
            poll(lambda: execution(api, slow)["status"] == "running", timeout=WAIT, what="the slow turn to run")
            assert late.requests == 0  # nothing is sent before the batch delay, or the exit
        finally:
            stop_cluster(cluster)
        assert execution(api, slow)["status"] == "succeeded"
        runs = [s for s in late.of({quick, slow}) if s["attributes"]["gen_ai.operation.name"] == "invoke_agent"]
        assert sorted(s["attributes"]["trellis.execution.id"] for s in runs) == sorted([quick, slow])
    finally:
        late.close()


# --- tracing off ---------------------------------------------------------------------------------


def test_without_the_otlp_endpoint_nothing_is_exported_and_no_job_carries_a_trace_context(
        team, api_as, served_by, untraced_cluster, decoy):
    served_by(untraced_cluster)
    api = api_as(team.owner)
    tree = build_tree(api)
    assert len(tree["jobs"]) == len(EXPECTED_TOKENS) + 1 and all(j["status"] == "succeeded" for j in tree["jobs"])
    assert set(Job.objects.values_list("trace_context", flat=True)) == {""}
    # the scripted usage is counted all the same
    root_usage = api.get(f"/api/sessions/{tree['root']}").json()["usage"]
    assert root_usage["tokens_in"] == sum(t[0] for k, t in EXPECTED_TOKENS.items() if k[1] != "desk")
    stop_cluster(untraced_cluster)  # its exit flushes whatever a tracer would have queued
    assert (decoy.requests, decoy.spans) == (0, [])


def test_while_tracing_is_off_the_turn_path_loads_no_tracing_sdk():
    """The web and worker code, imported as their processes import it, loads neither the
    OpenTelemetry tracing SDK nor its exporter (redis-py loads the SDK's metrics module by itself
    whenever the SDK is installed)."""
    code = ("import django, sys; django.setup(); import collab.tasks, collab.runtime.loop, config.urls, config.asgi; "
            "from collab.infra import tracing; tracing.start(); "
            "print(tracing.ENABLED, sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', "
            "'opentelemetry.exporter'))))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://127.0.0.1:9/v1/traces")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "False []"


# --- in this process: no statement of its own ------------------------------------------------------


@pytest.fixture
def tracing_here(monkeypatch, receiver):
    """Tracing turned on in this process, exporting to ``receiver``, for one test."""
    from collab.infra.per_process import PerProcess

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    built = PerProcess(tracing._Otel)
    monkeypatch.setattr(tracing, "_otel", built)
    monkeypatch.setattr(tracing, "ENABLED", True)
    yield built
    for otel in built._built.values():
        otel.provider.shutdown()


def test_a_traced_turn_writes_the_same_statements_as_an_untraced_one(transactional_db, team, no_worker, receiver,
                                                                      request):
    """Tracing adds no statement to a turn: the trace context rides on the INSERT that admits
    each job. A coordinator's turn with one background spawn, counted untraced and then traced."""
    from collab.models import AgentSpec
    from collab.runtime.loop import run_job
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    AgentSpec.objects.create(project=team.alpha, agent_id="fan", provider="scripted",
                             script={"user": [step(agent_call("child")), {"text": "spawned"}]})

    def counted_turn():
        session = do_create_session(team.member, team.alpha, title="fan", agent_id="fan")
        with Counted() as admission:
            job = do_start_user_turn(team.member, session, "go")
        with Counted() as worker:
            assert run_job(job.pk) == "succeeded"
        child = Job.objects.get(parent_job=job)
        return [" ".join(q.split()) for q in admission.queries + worker.queries], job, child

    untraced, _job, untraced_child = counted_turn()
    assert untraced_child.trace_context == ""
    request.getfixturevalue("tracing_here")
    traced, job, child = counted_turn()
    assert traced == untraced  # the same statements, one by one
    assert child.trace_context.startswith(f"00-{tracing.trace_id_of(job.pk):032x}-")
    spans = poll(lambda: receiver.of({job.pk}) if len(receiver.of({job.pk})) == 4 else None, timeout=WAIT,
                 what="the turn's spans: invoke_agent, 2 chats, 1 tool call")
    spawn_call = one(spans, **{"gen_ai.operation.name": "execute_tool"})
    assert child.trace_context.split("-")[2] == spawn_call["span_id"]


def test_a_turn_that_waits_for_a_person_is_two_runs_in_one_trace_whose_tokens_add_up(
        team, scripted_session, run_queued, tracing_here, receiver):
    """A call that needs a person's approval pauses the turn: its first run's span ends
    ``waiting``, not in error; the run after the decision is a second ``invoke_agent`` span in the
    same trace (the person's turn's), holding the approved call; each counts its own tokens."""
    script = [{**step({"name": "todo_create", "arguments": {"subject": "ship it"}}), "usage": usage(20, 2)},
              {"text": "done", "usage": usage(30, 3)}]
    api, sid = scripted_session(team.member, script, approvals=["todo_create"])
    eid = turn(api, sid)
    run_queued()
    assert execution(api, eid)["status"] == "waiting"
    (item,) = api.get("/api/inbox").json()["items"]
    assert api.post(f"/api/inbox/{item['id']}", {"decision": "approve"}).status_code == 200
    run_queued()
    shown = execution(api, eid)
    assert (shown["status"], shown["tokens_in"], shown["tokens_out"]) == ("succeeded", 50, 5)

    def both_runs():
        spans = receiver.of({eid})
        return spans if len([s for s in spans if s["attributes"]["gen_ai.operation.name"] == "invoke_agent"]) == 2 \
            and len(spans) == 5 else None  # a chat span each; the approved call runs in the second

    spans = poll(both_runs, timeout=WAIT, interval=0.1, what="both runs' spans")
    assert {s["trace_id"] for s in spans} == {f"{tracing.trace_id_of(eid):032x}"}
    first, second = sorted((s for s in spans if s["attributes"]["gen_ai.operation.name"] == "invoke_agent"),
                           key=lambda s: s["attributes"]["trellis.execution.status"] != "waiting")
    assert first["parent"] == second["parent"] == ""
    assert (first["attributes"]["trellis.execution.status"], first["status"]) == ("waiting", 0)
    assert (second["attributes"]["trellis.execution.status"], second["status"]) == ("succeeded", 0)
    assert [(run["attributes"]["gen_ai.usage.input_tokens"], run["attributes"]["gen_ai.usage.output_tokens"])
            for run in (first, second)] == [(20, 2), (30, 3)]
    approved = one(spans, **{"gen_ai.operation.name": "execute_tool"})
    assert approved["parent"] == second["span_id"] and approved["attributes"]["gen_ai.tool.name"] == "todo_create"


# --- the scripted provider's usage -----------------------------------------------------------------


@pytest.mark.parametrize("bad", [{"input_tokens": -1}, {"output_tokens": "many"}, {"tokens": 3},
                                 {"input_tokens": 10_000_001}], ids=["negative", "text", "unknown", "too-many"])
def test_a_script_step_usage_that_is_not_two_token_counts_is_refused_and_the_schema_says_so(team, api_as, bad):
    import jsonschema_rs

    api = api_as(team.owner)
    script = [{"text": "hi", "usage": bad}]
    r = api.post("/api/projects/alpha/agent-specs", {"agent_id": "counter", "provider": "scripted", "script": script})
    assert r.status_code == 400 and r.json()["code"] == "invalid_script", r.content
    schema = api.get("/api/openapi.json").json()["components"]["schemas"]["AgentSpecIn"]["properties"]["script"]
    validator = jsonschema_rs.validator_for(schema)
    assert not validator.is_valid(script)
    assert validator.is_valid([{"text": "hi", "usage": usage(3, 4)}, {"sleep_ms": 1, "usage": None}])


def test_the_tokens_a_script_reports_are_the_turns_usage(team, api_as, run_queued):
    api = api_as(team.owner)
    make_spec(api, "counter", [{**step({"name": "todo_list", "arguments": {}}), "usage": usage(7, 2)},
                               {"sleep_ms": 0, "usage": usage(1, 1)}, {"text": "done", "usage": usage(5, 3)}])
    sid = open_session(api, "counter")
    eid = turn(api, sid)
    shown = api.wait(eid)
    assert (shown["status"], shown["model_calls"], shown["tokens_in"], shown["tokens_out"]) == ("succeeded", 2, 13, 6)
    assert shown["result"] == "done"


def test_no_otlp_endpoint_means_no_traces_and_a_bad_one_stops_the_process(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from collab.conf.otel import traces_from_env

    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    assert traces_from_env() is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert traces_from_env() is True
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert traces_from_env() is False
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert traces_from_env() is False
    for name, value in (("OTEL_TRACES_EXPORTER", "zipkin"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ImproperlyConfigured, match=name):
            traces_from_env()
        monkeypatch.delenv(name)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")

