"""What a chat front end built on LangGraph's ``useStream`` (Agent Chat UI) sends to ``/lg``
works (docs/langgraph.md#chat-front-ends): the server info it asks first, a thread created
without metadata, its runs streamed with the body ``useStream`` builds — the thread head's
checkpoint, ``stream_mode`` with ``custom``, ``stream_subgraphs``, ``stream_resumable``,
``on_disconnect: "continue"`` — and "regenerate": a run without input from the checkpoint
before an answer, which asks the person's message again on a fork the thread follows; and an edit
of the first message, a run from the checkpoint before it (``root``: no message yet)."""

import pytest

from collab.models import Branch, Job, Message, PersonAsk
from tests.conftest import api_client_of, make_spec, tool_results
from tests.lg.client import Lg, lg_as, ok, refused
from tests.lg.test_lg_runs import frames_of

ECHO = [{"text": "echo: {{prompt}}"}]


def chat_message(text: str) -> dict:
    """A person's message as Agent Chat UI makes it: its own id, text blocks."""
    return {"id": f"client-{text}", "type": "human", "content": [{"type": "text", "text": text}]}


def submit(lg, tid, *, input=None, checkpoint=None, command=None) -> list[dict]:
    """``useStream``'s ``submit``: ``runs/stream`` with the body it builds (the head's checkpoint
    without its ``thread_id``, the modes its listeners ask for); the stream's frames."""
    body = {"assistant_id": "echo", "stream_mode": ["values", "messages-tuple", "custom"],
            "stream_subgraphs": True, "stream_resumable": True, "on_disconnect": "continue"}
    if input is not None:
        body["input"] = input
    if command is not None:
        body["command"] = command
    if checkpoint is not None:
        body["checkpoint"] = {k: v for k, v in checkpoint.items() if k != "thread_id"}
    return frames_of(lg.post(f"/threads/{tid}/runs/stream", body))


def history(lg, tid) -> list[dict]:
    return ok(lg.post(f"/threads/{tid}/history", {"limit": 10}))


def first_seen(states: list[dict], message_id: str) -> dict:
    """The oldest state holding the message (``useStream``'s ``firstSeenState``)."""
    return [s for s in states if any(m["id"] == message_id for m in s["values"]["messages"])][-1]


def test_the_server_info_answers_without_a_token_and_names_no_data(db):
    """``GET /info`` (what Agent Chat UI asks to know it reached an Agent Server) and ``GET /ok``
    answer without a token: the version and the optional features, nothing of any tenant."""
    anyone = Lg()
    info = ok(anyone.get("/info"))
    assert info["flags"] == {"assistants": True, "crons": False, "store": False, "langsmith": False}
    assert set(info) == {"version", "server", "flags"}
    assert ok(anyone.get("/ok")) == {"ok": True}
    assert "x-api-key" in refused(anyone.get("/threads/nothing"), 401, "unauthenticated")["detail"]


def test_a_chat_front_end_streams_goes_on_and_regenerates(team, worker):
    """The sequence a ``useStream`` front end sends, on a real worker: a thread without metadata
    (the person's one project), a first message with ``custom`` among the modes (no custom frame:
    a Trellis agent writes none), the next from the thread head's checkpoint (no fork: the run goes
    on), then regenerating each answer — from the checkpoint before it — asks the person's message
    again on a fork (a new root for the first message) and the thread follows it, the old answer
    kept in the DAG; editing the first message runs the new text from ``root``, the checkpoint
    before it, as a new root. From an answer's own checkpoint, or the root, there is nothing to
    ask again: 422 naming ``input``, nothing admitted."""
    make_spec(api_client_of(team.owner), "echo", ECHO)
    lg = lg_as(team.member)
    thread = ok(lg.post("/threads", {}))
    tid = thread["thread_id"]
    assert thread["metadata"]["project"] == "alpha"
    assert history(lg, tid) == []

    frames = submit(lg, tid, input={"messages": [chat_message("hello")]})
    assert {f["event"] for f in frames} == {"metadata", "values", "messages", "end"}
    assert frames[-1]["data"]["status"] == "success"
    first = frames[-2]["data"]["messages"]
    assert [(m["type"], m["content"]) for m in first] == [("human", "hello"), ("ai", "echo: hello")]

    head = history(lg, tid)[0]
    submit(lg, tid, input={"messages": [chat_message("again")]}, checkpoint=head["checkpoint"])
    states = history(lg, tid)
    line = states[0]["values"]["messages"]
    assert [m["content"] for m in line] == ["hello", "echo: hello", "again", "echo: again"]
    assert Branch.objects.filter(session_id=tid).count() == 1  # went on: no fork

    # regenerate the last answer: from the state before it, which ends with "again"
    before_answer = first_seen(states, line[-1]["id"])["parent_checkpoint"]
    assert before_answer["checkpoint_id"] == line[-2]["id"]
    frames = submit(lg, tid, checkpoint=before_answer)
    assert frames[-1]["data"]["status"] == "success"
    now = ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"]
    assert [m["content"] for m in now] == ["hello", "echo: hello", "again", "echo: again"]
    assert now[:2] == line[:2] and now[2]["id"] != line[2]["id"] and now[3]["id"] != line[3]["id"]
    assert Message.objects.get(pk=now[2]["id"]).predecessor_id == line[1]["id"]  # forked before "again"
    assert Message.objects.filter(pk=line[3]["id"]).exists()  # the old answer stays

    # regenerate the first answer: "hello" has nothing before it, so the fork is a new root
    states = history(lg, tid)
    before_first = first_seen(states, now[1]["id"])["parent_checkpoint"]
    assert before_first["checkpoint_id"] == now[0]["id"]
    submit(lg, tid, checkpoint=before_first)
    root = ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"]
    assert [m["content"] for m in root] == ["hello", "echo: hello"] and root[0]["id"] != now[0]["id"]
    assert Message.objects.get(pk=root[0]["id"]).predecessor_id is None
    assert Branch.objects.filter(session_id=tid, forked_from__isnull=True).count() == 2

    # edit the first message: from the checkpoint before it (the root: no message), a new line
    first_state = first_seen(history(lg, tid), root[0]["id"])
    assert first_state["parent_checkpoint"]["checkpoint_id"] == "root"
    at_root = ok(lg.get(f"/threads/{tid}/state/root"))
    assert at_root["values"] == {"messages": []} and at_root["parent_checkpoint"] is None
    submit(lg, tid, input={"messages": [chat_message("howdy")]}, checkpoint=first_state["parent_checkpoint"])
    edited = ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"]
    assert [m["content"] for m in edited] == ["howdy", "echo: howdy"]
    assert Branch.objects.filter(session_id=tid, forked_from__isnull=True).count() == 3

    jobs = Job.objects.count()
    refused(lg.post(f"/threads/{tid}/runs/stream", {"assistant_id": "echo", "checkpoint_id": "root"}), 422,
            "unsupported")  # nothing to ask again before the first message
    answer = refused(lg.post(f"/threads/{tid}/runs/stream", {"assistant_id": "echo", "checkpoint": {
        "checkpoint_id": root[1]["id"], "checkpoint_ns": ""}}), 422, "unsupported")
    assert answer["field"] == "input"
    refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "echo"}), 400, "invalid_run")
    assert Job.objects.count() == jobs


@pytest.mark.parametrize("modes", [["custom"], ["values", "custom"]])
def test_custom_is_an_accepted_stream_mode_of_a_background_run(team, modes):
    """A background run asking for ``custom`` (alone or with others) is admitted: the mode is
    accepted everywhere a run names its modes (its frames are none: a Trellis agent writes no
    custom event). Modes Trellis has no frames for that mean something else are still refused."""
    make_spec(api_client_of(team.owner), "echo", ECHO)
    lg = lg_as(team.member)
    tid = ok(lg.post("/threads", {}))["thread_id"]
    body = {"assistant_id": "echo", "input": {"messages": [chat_message("hi")]}}
    assert ok(lg.post(f"/threads/{tid}/runs", {**body, "stream_mode": modes}))["status"] == "pending"
    refused(lg.post(f"/threads/{tid}/runs", {**body, "stream_mode": ["values", "events"]}), 422, "unsupported")


def test_a_page_of_another_origin_may_call_lg_with_a_token_and_nothing_else(team, settings):
    """A chat front end on its own origin calls ``/lg`` from the browser: the preflight allows its
    method and headers (``x-api-key``, ``Last-Event-ID``), an answer is readable by it and exposes
    ``Content-Location`` / ``Location`` (where ``runs.stream`` learns its run), and no credentials
    are allowed (the session cookie never counts on ``/lg``). ``/api`` and the pages get no CORS
    header at all; ``TRELLIS_LG_CORS_ORIGINS`` narrows the origins."""
    from django.test import Client

    origin = "http://localhost:3000"
    lg = lg_as(team.member)
    preflight = lg.client.options("/lg/threads", HTTP_ORIGIN=origin, HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST",
                                  HTTP_ACCESS_CONTROL_REQUEST_HEADERS="x-api-key, content-type, last-event-id")
    assert preflight.status_code == 200
    assert preflight["Access-Control-Allow-Origin"] == "*"
    allowed = {h.strip() for h in preflight["Access-Control-Allow-Headers"].split(",")}
    assert {"x-api-key", "content-type", "last-event-id"} <= allowed
    assert "POST" in preflight["Access-Control-Allow-Methods"]
    assert "Access-Control-Allow-Credentials" not in preflight

    answer = lg.client.post("/lg/threads", "{}", content_type="application/json", HTTP_ORIGIN=origin, **lg.headers)
    assert answer.status_code == 200 and answer["Access-Control-Allow-Origin"] == "*"
    assert {"content-location", "location"} <= {h.strip() for h in answer["Access-Control-Expose-Headers"].split(",")}

    browser = Client()
    browser.force_login(team.member)
    assert browser.get("/lg/threads/x", HTTP_ORIGIN=origin).status_code == 401  # the cookie is no credential here
    for path in ("/api/projects", "/"):
        assert "Access-Control-Allow-Origin" not in browser.get(path, HTTP_ORIGIN=origin)

    settings.CORS_ALLOW_ALL_ORIGINS, settings.CORS_ALLOWED_ORIGINS = False, ["https://chat.example.com"]
    assert "Access-Control-Allow-Origin" not in lg.client.get("/lg/info", HTTP_ORIGIN=origin)
    assert lg.client.get("/lg/info", HTTP_ORIGIN="https://chat.example.com")["Access-Control-Allow-Origin"] \
        == "https://chat.example.com"


def test_a_run_from_the_root_of_a_thread_without_messages_simply_starts_it(team, run_queued):
    """The root is an empty thread's latest checkpoint too: a run from it goes on the thread's own
    branch (no new root), as a run from the latest checkpoint does."""
    make_spec(api_client_of(team.owner), "echo", ECHO)
    lg = lg_as(team.member)
    tid = ok(lg.post("/threads", {}))["thread_id"]
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"messages": [chat_message("hi")]},
                                              "checkpoint": {"checkpoint_id": "root", "checkpoint_ns": ""}}))
    run_queued()
    assert Branch.objects.filter(session_id=tid).count() == 1
    assert Job.objects.get(pk=run["run_id"]).branch.forked_from_id is None
    assert [m["content"] for m in ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"]] == ["hi", "echo: hi"]
    assert ok(lg.post(f"/threads/{tid}/history", {"checkpoint": {"checkpoint_id": "root"}}))[0]["checkpoint"]["checkpoint_id"] == "root"
    assert ok(lg.post(f"/threads/{tid}/history", {"before": "root"})) == []


def test_a_second_root_made_through_lg_reads_on_the_session_page_and_the_native_api(team, run_queued):
    """An edit of the first message made through ``/lg`` is a second root of the session's DAG:
    the session's page, its graph and the native API show both lines (the old one kept), and a
    person's next turn there goes on the new one, which the thread follows."""
    from django.test import Client

    make_spec(api_client_of(team.owner), "echo", ECHO)
    lg = lg_as(team.member)
    tid = ok(lg.post("/threads", {}))["thread_id"]
    body = {"assistant_id": "echo"}
    ok(lg.post(f"/threads/{tid}/runs", {**body, "input": {"messages": [chat_message("first try")]}}))
    run_queued()
    ok(lg.post(f"/threads/{tid}/runs", {**body, "input": {"messages": [chat_message("second try")]},
                                        "checkpoint_id": "root"}))
    run_queued()
    browser = Client()
    browser.force_login(team.member)
    for path in (f"/s/{tid}/", f"/s/{tid}/dag"):
        page = browser.get(path)
        assert page.status_code == 200, path
        assert b"first try" in page.content and b"second try" in page.content, path
    api = api_client_of(team.member)
    roots = [b for b in api.get(f"/api/sessions/{tid}/branches").json() if not b["forked_from"]]
    assert len(roots) == 2
    ok(lg.post(f"/threads/{tid}/runs", {**body, "input": {"messages": [chat_message("and on")]}}))
    run_queued()
    line = [m["content"] for m in ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"]]
    assert line == ["second try", "echo: second try", "and on", "echo: and on"]


def test_a_run_naming_another_assistant_is_offered_that_assistants_tools(team, run_queued):
    """A run's ``assistant_id`` may name another spec than its thread's (a thread created without
    one, as a chat front end creates it, has none): the turn runs with that spec — its toolset's
    tools offered and dispatched, not the thread's."""
    owner = api_client_of(team.owner)
    make_spec(owner, "echo", ECHO)
    make_spec(owner, "ow", [{"tool_calls": [{"name": "interrupt_agent", "arguments": {"task_name": "nobody"}}]},
                            {"text": "done"}], toolset="openwork")
    lg = lg_as(team.member)
    for metadata in ({}, {"graph_id": "echo"}):
        tid = ok(lg.post("/threads", {"metadata": metadata}))["thread_id"]
        run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "ow", "input": {"messages": [chat_message("go")]}}))
        run_queued()
        (result,) = tool_results(run["run_id"])
        assert result["tool"] == "interrupt_agent" and result["code"] != "unknown_tool", result
        assert ok(lg.get(f"/threads/{tid}/runs/{run['run_id']}"))["status"] == "success"


def test_a_fork_deals_with_what_is_open_on_the_branch_it_leaves_by_the_strategy(team, run_queued):
    """Asking again (or any run from an earlier checkpoint) leaves the thread's branch: a run
    waiting there for a person holds the thread as for a new input (409 ``thread_interrupted``
    with ``enqueue`` or ``reject``: nothing admitted), while ``interrupt`` cancels it first — its
    ask closed, the thread's interrupts none — and the fork runs."""
    owner = api_client_of(team.owner)
    make_spec(owner, "careful", [{"tool_calls": [{"name": "todo_create", "arguments": {"subject": "ship"}}]},
                                 {"text": "after the call: {{last.text}}"}], approvals=["todo_create"])
    lg = lg_as(team.member)
    tid = ok(lg.post("/threads", {}))["thread_id"]
    first = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "careful", "input": {"messages": [chat_message("q")]}}))
    run_queued()
    assert ok(lg.get(f"/threads/{tid}/runs/{first['run_id']}"))["status"] == "interrupted"
    prompt = Job.objects.get(pk=first["run_id"]).prompt_msg_id
    jobs = Job.objects.count()
    for strategy in (None, "enqueue", "reject"):
        body = {"assistant_id": "careful", "checkpoint_id": prompt}
        if strategy:
            body["multitask_strategy"] = strategy
        answer = refused(lg.post(f"/threads/{tid}/runs", body), 409, "thread_interrupted")
        assert answer["run_id"] == first["run_id"]
    assert Job.objects.count() == jobs
    again = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "careful", "checkpoint_id": prompt,
                                                 "multitask_strategy": "interrupt"}))
    assert again["multitask_strategy"] == "interrupt"
    assert Job.objects.get(pk=first["run_id"]).status == "cancelled"
    assert not PersonAsk.objects.filter(job_id=first["run_id"], status="pending").exists()
    assert ok(lg.get(f"/threads/{tid}/state"))["interrupts"] == []


@pytest.mark.parametrize("checkpoint, status, code, field", [
    ({"checkpoint_id": "X", "zzz": 1}, 422, "unsupported", "checkpoint.zzz"),
    ({"checkpoint_id": "X", "configurable": {"checkpoint_id": "X"}}, 422, "unsupported", "checkpoint.configurable"),
    ({"checkpoint_id": "X", "checkpoint_map": {"sub": "y"}}, 422, "unsupported", "checkpoint.checkpoint_map"),
    ({"checkpoint_id": "X", "thread_id": "0123456789ab"}, 400, "invalid_checkpoint", None),
])
def test_a_runs_checkpoint_is_a_checkpoint_of_its_thread_and_nothing_more(team, run_queued, checkpoint, status,
                                                                         code, field):
    """A run's ``checkpoint`` object holds LangGraph's checkpoint keys, of its own thread: another
    key, a subgraph's map, or another thread's id are refused, nothing admitted."""
    make_spec(api_client_of(team.owner), "echo", ECHO)
    lg = lg_as(team.member)
    tid = ok(lg.post("/threads", {}))["thread_id"]
    ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"messages": [chat_message("hi")]}}))
    run_queued()
    first = ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"][0]["id"]
    checkpoint = {k: (first if v == "X" else v) for k, v in checkpoint.items()}
    if "configurable" in checkpoint:
        checkpoint["configurable"] = {"checkpoint_id": first}
    jobs = Job.objects.count()
    answer = refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "echo", "checkpoint": checkpoint,
                                                       "input": {"messages": [chat_message("again")]}}), status, code)
    assert answer.get("field") == field
    assert Job.objects.count() == jobs
