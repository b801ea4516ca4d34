"""The LangGraph-compatible runs (docs/langgraph.md#runs, #streaming, #interrupts), through HTTP
with a Trellis token in ``x-api-key`` as langgraph-sdk sends it: a run is a person's turn on the
thread's branch; its output, its Server-Sent Events (resumable exactly), the four multitask
strategies, a run from a checkpoint, interrupts decided by ``command.resume``, cancel — under the
native API's access rules, and every field Trellis cannot honour refused by name before anything
is written."""

import json

import pytest
from asgiref.sync import async_to_sync

from accounts.models import TokenScope
from collab.models import Job, Message, PersonAsk
from tests.conftest import api_client_of, make_spec, poll
from tests.lg.client import ANSWER, APPROVAL, QUESTION, SLOW, human, lg_as, ok, refused

def body_of(response) -> bytes:
    """A whole answer; a streamed one read to its end as a server would send it (its async body
    under the test client's wrapper, which ends the request as a server does)."""
    if not response.streaming:
        return response.content

    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)()


def frames_of(response) -> list[dict]:
    """The SSE frames of a whole stream: ``{"id", "event", "data"}`` (data parsed)."""
    assert response.status_code == 200, (response.status_code, body_of(response))
    assert response["Content-Type"].startswith("text/event-stream")
    frames = []
    for block in body_of(response).decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if fields:
            frames.append({"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields["data"])})
    return frames


@pytest.fixture
def world(team):
    """The owner's scripted specs in alpha; a member's thread (``bot``) and their /lg client."""
    owner = api_client_of(team.owner)
    specs = {name: make_spec(owner, name, script) for name, script in
             (("bot", ANSWER), ("slow", SLOW), ("question", QUESTION))}
    specs["careful"] = make_spec(owner, "careful", APPROVAL, approvals=["todo_create"])
    lg = lg_as(team.member)

    def thread(agent="bot"):
        return ok(lg.post("/threads", {"metadata": {"project": "alpha", "graph_id": agent}}))["thread_id"]

    return type("World", (), {"lg": lg, "specs": specs, "thread": staticmethod(thread), "team": team})


def test_a_background_run_is_a_turn_its_join_answers_the_state_it_left(world, run_queued):
    """``POST /threads/{id}/runs`` admits the person's turn (``pending``, the run's id the
    execution's); once it has run, ``GET`` says ``success`` and ``join`` answers the thread's
    values: the input as a human message, the tool call as an ai message with ``tool_calls``, its
    result as a tool message with ``tool_call_id``, the answer."""
    lg, tid = world.lg, world.thread()
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("the plan")}))
    job = Job.objects.get(pk=run["run_id"])
    assert (run["thread_id"], run["status"], run["assistant_id"]) == (tid, "pending", str(job.agent_spec_id))
    assert run["multitask_strategy"] == "enqueue" and job.session_id == tid and job.kind == "user"
    run_queued()
    assert ok(lg.get(f"/threads/{tid}/runs/{run['run_id']}"))["status"] == "success"
    joined = json.loads(body_of(lg.get(f"/threads/{tid}/runs/{run['run_id']}/join")))
    kinds = [(m["type"], m["content"]) for m in joined["messages"]]
    assert kinds[0] == ("human", "the plan") and kinds[-1] == ("ai", "planned: the plan")
    call, result = joined["messages"][1], joined["messages"][2]
    assert call["tool_calls"][0]["name"] == "todo_create" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert [r["run_id"] for r in ok(lg.get(f"/threads/{tid}/runs"))] == [run["run_id"]]


def test_join_stream_gives_each_mode_and_resumes_after_any_frame_exactly(world, run_queued):
    """A finished run's stream from its start (``Last-Event-ID: -1``): ``metadata``, then per
    message ``messages`` (ai and tool), ``updates`` (not for the input) and ``values`` (the state
    up to it), then ``end``. Resumed after any frame's id it gives exactly the frames that
    followed it — no gap, no repeat — and a bad id is a 400."""
    lg, tid = world.lg, world.thread()
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("go")}))
    run_queued()
    path = f"/threads/{tid}/runs/{run['run_id']}/stream"
    modes = {"stream_mode": ["values", "updates", "messages-tuple"]}
    frames = frames_of(lg.get(path, headers={"HTTP_LAST_EVENT_ID": "-1"}, **modes))
    assert frames[0]["event"] == "metadata" and frames[0]["data"]["run_id"] == run["run_id"]
    assert frames[-1] == {"id": None, "event": "end", "data": {"run_id": run["run_id"], "status": "success"}}
    events = [f["event"] for f in frames[1:-1]]
    assert events == ["values",  # the input
                      "messages", "updates", "values",  # the tool call
                      "messages", "updates", "values",  # its result
                      "messages", "updates", "values"]  # the answer
    last_values = frames[-2]["data"]["messages"]
    assert [m["type"] for m in last_values] == ["human", "ai", "tool", "ai"]
    assert frames[-3]["data"] == {"agent": {"messages": [last_values[-1]]}}
    assert frames[6]["data"] == {"tools": {"messages": [last_values[2]]}}
    assert frames[-4]["data"][0] == last_values[-1] and frames[-4]["data"][1]["run_id"] == run["run_id"]
    ids = [f["id"] for f in frames[:-1]]
    assert len(set(ids)) == len(ids)
    for n, frame in enumerate(frames[:-1]):
        rest = frames_of(lg.get(path, headers={"HTTP_LAST_EVENT_ID": frame["id"]}, **modes))
        assert rest == frames[n + 1:], (n, frame["id"])
    refused(lg.get(path, headers={"HTTP_LAST_EVENT_ID": "soon"}), 400, "invalid_last_event_id")
    only_values = frames_of(lg.get(path, headers={"HTTP_LAST_EVENT_ID": "-1"}, stream_mode="values"))
    assert [f["event"] for f in only_values] == ["metadata"] + ["values"] * 4 + ["end"]
    # joined without an id, a run that is over has nothing more to say
    assert [f["event"] for f in frames_of(lg.get(path))] == ["metadata", "end"]


def _jobs():
    return Job.objects.count()


@pytest.mark.parametrize("field, value, named", [
    ("metadata", {"k": "v"}, "metadata"),
    ("context", {"model": "x"}, "context"),
    ("config", {"recursion_limit": 5}, "config.recursion_limit"),
    ("config", {"configurable": {"temperature": 1}}, "config.configurable.temperature"),
    ("interrupt_before", ["tools"], "interrupt_before"),
    ("interrupt_after", "*", "interrupt_after"),
    ("webhook", "https://example.com/hook", "webhook"),
    ("if_not_exists", "create", "if_not_exists"),
    ("after_seconds", 5, "after_seconds"),
    ("durability", "exit", "durability"),
    ("stream_mode", ["values", "debug"], "stream_mode"),
    ("feedback_keys", ["score"], "feedback_keys"),
    ("input", {"messages": [{"role": "user", "content": "a"}], "notes": "b"}, "input.notes"),
    ("input", {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "input.messages"),
    ("input", {"messages": [{"role": "ai", "content": "a"}]}, "input.messages[0].type"),
    ("input", {"messages": [{"type": "human", "content": [{"type": "image_url", "image_url": "x"}]}]},
     "input.messages[0].content[0]"),
    ("command", {"goto": "agent"}, "command.goto"),
])
def test_what_trellis_cannot_honour_is_refused_by_name_before_anything_is_written(world, field, value, named):
    """Every LangGraph field a run cannot honour is a 422 ``unsupported`` naming it — never
    silently ignored — and nothing was admitted; a field LangGraph does not define is a 422 too."""
    lg, tid = world.lg, world.thread()
    before = _jobs()
    body = {"assistant_id": "bot", "input": human("go")}
    if field == "command":
        body.pop("input")
    body[field] = value
    for route in ("", "/wait", "/stream"):
        if route and field == "stream_mode":
            continue
        answer = refused(lg.post(f"/threads/{tid}/runs{route}", body), 422, "unsupported")
        assert answer["field"] == named and named.split("[")[0].split(".")[0] in answer["detail"]
    refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("go"), "temperature": 1}),
            422, "invalid_request")
    refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot"}), 400, "invalid_run")
    refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("go"), "command": {"resume": 1}}),
            400, "invalid_run")
    refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "nobody", "input": human("go")}), 404, "unknown_assistant")
    assert _jobs() == before


def test_input_takes_text_blocks_and_the_assistant_picks_the_spec(world, run_queued):
    """A message's content may be LangChain text blocks (as Agent Chat UI sends them, with its
    own id); the run's ``assistant_id`` (an id or a graph name) picks the spec it runs with."""
    lg, tid = world.lg, world.thread()
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "question", "input": {"messages": [
        {"id": "client-1", "type": "human", "content": [{"type": "text", "text": "pick "}, {"type": "text", "text": "one"}]}]}}))
    job = Job.objects.select_related("agent_spec").get(pk=run["run_id"])
    assert job.agent_spec.agent_id == "question" and run["assistant_id"] == str(job.agent_spec_id)
    assert Message.objects.get(pk=job.prompt_msg_id).text == "pick one"


def test_another_users_client_gets_404_everywhere_and_a_viewer_may_read_not_run(world, run_queued):
    """A thread the caller may not see answers as a missing one on every runs route; a run of
    another thread named under this one is missing too; a viewer reads runs and may not start or
    cancel one (403); deleting a run is not offered (405)."""
    lg, tid = world.lg, world.thread()
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("go")}))
    run_queued()
    rid = run["run_id"]
    outsider = lg_as(world.team.outsider)
    body = {"assistant_id": "bot", "input": human("hi")}
    for response in (outsider.post(f"/threads/{tid}/runs", body), outsider.post(f"/threads/{tid}/runs/wait", body),
                     outsider.post(f"/threads/{tid}/runs/stream", body), outsider.get(f"/threads/{tid}/runs"),
                     outsider.get(f"/threads/{tid}/runs/{rid}"), outsider.get(f"/threads/{tid}/runs/{rid}/join"),
                     outsider.get(f"/threads/{tid}/runs/{rid}/stream"),
                     outsider.post(f"/threads/{tid}/runs/{rid}/cancel"),
                     outsider.client.delete(f"/lg/threads/{tid}/runs/{rid}", **outsider.headers)):
        refused(response, 404, "not_found")
    refused(lg.client.delete(f"/lg/threads/{tid}/runs/{rid}", **lg.headers), 405, "unsupported")
    other = world.thread()
    refused(lg.get(f"/threads/{other}/runs/{rid}"), 404, "unknown_run")
    viewer = lg_as(world.team.viewer)
    assert ok(viewer.get(f"/threads/{tid}/runs/{rid}"))["status"] == "success"
    refused(viewer.post(f"/threads/{tid}/runs", body), 403, "forbidden")
    refused(viewer.post(f"/threads/{tid}/runs/{rid}/cancel"), 403, "forbidden")
    assert Job.objects.filter(session_id=tid).count() == 1


def test_a_run_from_a_checkpoint_forks_there_and_the_thread_follows_the_fork(world, run_queued):
    """``checkpoint_id`` (an earlier message) forks the thread there: the new run's input follows
    that message on a new branch, and the thread's state is the fork's from then on (as
    LangGraph's latest state is); the old line stays in the history. From the latest checkpoint
    a run simply goes on."""
    lg, tid = world.lg, world.thread()
    ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("first")}))
    run_queued()
    first = ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"]
    at = first[0]["id"]  # the first input
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("again"), "checkpoint_id": at}))
    run_queued()
    job = Job.objects.get(pk=run["run_id"])
    assert Message.objects.get(pk=job.prompt_msg_id).predecessor_id == at
    state = ok(lg.get(f"/threads/{tid}/state"))
    messages = state["values"]["messages"]
    assert [(m["type"], m["content"]) for m in messages[:2]] == [("human", "first"), ("human", "again")]
    assert [m["type"] for m in messages[2:]] == ["ai", "tool", "ai"] and messages[-1]["content"] == "planned: again"
    # the latest checkpoint: no fork
    tip = state["checkpoint"]["checkpoint_id"]
    again = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("on"),
                                                 "checkpoint": {"checkpoint_id": tip, "checkpoint_ns": ""}}))
    assert Job.objects.get(pk=again["run_id"]).branch_id == job.branch_id
    refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("x"), "checkpoint_id": "nope"}),
            404, "unknown_checkpoint")


def _interrupted(world, agent="careful", text="go"):
    """A thread whose run waits for a person (its spec's approval, or its question)."""
    lg, tid = world.lg, world.thread(agent)
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": agent, "input": human(text)}))
    return lg, tid, run["run_id"]


def test_a_run_that_waits_for_a_person_is_interrupted_and_shows_its_interrupt(world, run_queued):
    """A run paused for an approval is ``interrupted``; ``join`` answers the values with
    ``__interrupt__`` (the ask's id, LangChain's human-in-the-loop request); its stream ends with
    ``updates`` ``{"__interrupt__"}``, ``values`` carrying it, and ``end`` (interrupted); a new input
    while it waits is refused until it is resumed (409 ``thread_interrupted``)."""
    lg, tid, rid = _interrupted(world)
    run_queued()
    ask = PersonAsk.objects.get(job_id=rid)
    assert ok(lg.get(f"/threads/{tid}/runs/{rid}"))["status"] == "interrupted"
    output = json.loads(body_of(lg.get(f"/threads/{tid}/runs/{rid}/join")))
    (interrupt,) = output["__interrupt__"]
    assert interrupt["id"] == ask.pk
    assert interrupt["value"]["action_requests"][0] == {
        "name": "todo_create", "args": {"subject": "ship it"}, "description": interrupt["value"]["action_requests"][0]["description"]}
    assert [m["type"] for m in output["messages"]] == ["human", "ai"]
    frames = frames_of(lg.get(f"/threads/{tid}/runs/{rid}/stream", headers={"HTTP_LAST_EVENT_ID": "-1"},
                              stream_mode=["updates", "values"]))
    assert [f["event"] for f in frames[-3:]] == ["updates", "values", "end"]
    assert frames[-3]["data"] == {"__interrupt__": [interrupt]}
    assert frames[-2]["data"] == {"messages": output["messages"], "__interrupt__": [interrupt]}
    assert frames[-1]["data"]["status"] == "interrupted"
    refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "careful", "input": human("more")}), 409, "thread_interrupted")


@pytest.mark.parametrize("resume, result", [
    (True, "after the call: "),
    ("approve", "after the call: "),
    ({"decisions": [{"type": "approve"}]}, "after the call: "),
    ({"type": "edit", "edited_action": {"name": "todo_create", "args": {"subject": "ship it monday"}}}, "monday"),
    ({"arguments": {"subject": "ship it friday"}}, "friday"),
    (False, "rejected: rejected by a person"),
    ({"type": "reject", "message": "not today"}, "rejected: not today"),
])
def test_command_resume_decides_the_approval_and_the_same_run_goes_on(world, run_queued, resume, result):
    """``command.resume`` decides the interrupt as the inbox would — approve, edit the call's
    arguments, reject with a reason — and answers the run that waited, which goes on from the
    call it stopped at: its stream from its start shows only what came after the decision."""
    lg, tid, rid = _interrupted(world)
    run_queued()
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "careful", "command": {"resume": resume}}))
    assert run["run_id"] == rid and run["status"] == "pending"
    run_queued()
    assert ok(lg.get(f"/threads/{tid}/runs/{rid}"))["status"] == "success"
    messages = json.loads(body_of(lg.get(f"/threads/{tid}/runs/{rid}/join")))["messages"]
    assert [m["type"] for m in messages] == ["human", "ai", "tool", "ai"]
    assert result in messages[2]["content"] or result in messages[3]["content"]
    frames = frames_of(lg.get(f"/threads/{tid}/runs/{rid}/stream", headers={"HTTP_LAST_EVENT_ID": "-1"},
                              stream_mode="values"))
    assert [f["event"] for f in frames] == ["metadata", "values", "values", "end"]
    assert frames[-1]["data"]["status"] == "success"
    refused(lg.post(f"/threads/{tid}/runs", {"assistant_id": "careful", "command": {"resume": True}}),
            409, "nothing_to_resume")


def test_a_question_is_resumed_with_its_answer_and_bad_resumes_decide_nothing(world, run_queued):
    """An ``ask_person`` question is resumed with the answer (one of its choices); a value that
    does not fit, or a token without the ``holds`` scope (as in the inbox), decides nothing."""
    lg, tid, rid = _interrupted(world, "question")
    run_queued()
    ask = PersonAsk.objects.get(job_id=rid)
    body = {"assistant_id": "question", "command": {"resume": "green"}}
    refused(lg.post(f"/threads/{tid}/runs", body), 400, "invalid_answer")
    refused(lg.post(f"/threads/{tid}/runs", {**body, "command": {"resume": {"colour": "red"}}}), 400, "invalid_resume")
    no_holds = lg_as(world.team.member, scopes=[TokenScope.READ, TokenScope.WRITE])
    refused(no_holds.post(f"/threads/{tid}/runs", {**body, "command": {"resume": "blue"}}), 403, "token_scope")
    viewer = lg_as(world.team.viewer)
    refused(viewer.post(f"/threads/{tid}/runs", {**body, "command": {"resume": "blue"}}), 403, "forbidden")
    ask.refresh_from_db()
    assert ask.status == "pending"
    run = ok(lg.post(f"/threads/{tid}/runs", {**body, "command": {"resume": {ask.pk: "blue"}}}))
    assert run["run_id"] == rid
    run_queued()
    messages = json.loads(body_of(lg.get(f"/threads/{tid}/runs/{rid}/join")))["messages"]
    assert messages[-1]["content"] == "the person said blue"


def test_interrupt_and_rollback_cancel_a_run_that_waits_for_a_person(world, run_queued):
    """A new input with ``multitask_strategy`` ``interrupt`` cancels the run that waits (its
    interrupt closes) and runs on the same line; ``rollback`` cancels it too and runs the input on
    a fork from before that run's input, which the thread follows."""
    lg, tid, rid = _interrupted(world)
    run_queued()
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("instead"),
                                              "multitask_strategy": "interrupt"}))
    assert ok(lg.get(f"/threads/{tid}/runs/{rid}"))["status"] == "interrupted"
    assert Job.objects.get(pk=rid).status == "cancelled" and run["multitask_strategy"] == "interrupt"
    run_queued()
    assert ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"][-1]["content"] == "planned: instead"

    lg, tid, rid = _interrupted(world)
    run_queued()
    first_input = Job.objects.get(pk=rid).prompt_msg_id
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("over"),
                                              "multitask_strategy": "rollback"}))
    run_queued()
    assert Job.objects.get(pk=rid).status == "cancelled"
    messages = ok(lg.get(f"/threads/{tid}/state"))["values"]["messages"]
    assert first_input not in [m["id"] for m in messages] and messages[0]["content"] == "over"
    assert Job.objects.get(pk=run["run_id"]).branch_id != Job.objects.get(pk=rid).branch_id


def test_a_streamed_answer_is_sent_as_chunks_of_one_message(world, run_queued):
    """With ``messages-tuple``, a streaming model's text (``message.delta``) comes as
    ``AIMessageChunk`` pieces sharing one id per model call, and the message they make ends that
    stream as its last chunk (same id, no more text, its tool calls) rather than again whole; a
    message nobody streamed comes whole, with its own id."""
    from django.db import transaction

    from collab.events import send_event_on_commit

    lg, tid = world.lg, world.thread()
    run = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": human("go")}))
    rid = run["run_id"]
    job = Job.objects.get(pk=rid)
    with transaction.atomic():  # as a streaming provider's first model call will have said it
        send_event_on_commit(tid, "message.delta", {"job": rid, "branch": job.branch_id, "call": 0, "text": "thinking"})
    run_queued()
    frames = frames_of(lg.get(f"/threads/{tid}/runs/{rid}/stream", headers={"HTTP_LAST_EVENT_ID": "-1"},
                              stream_mode="messages-tuple"))
    chunks = [f["data"][0] for f in frames if f["event"] == "messages"]
    delta, call, result, answer = chunks
    assert call["id"] == delta["id"] == f"run-{rid}-0" and call["type"] == delta["type"] == "AIMessageChunk"
    assert (call["content"], delta["content"]) == ("", "thinking") and call["chunk_position"] == "last"
    assert call["tool_calls"][0]["name"] == "todo_create"
    assert result["type"] == "tool" and answer["type"] == "ai" and answer["content"] == "planned: go"
    assert answer["id"] == Message.objects.filter(job_id=rid).order_by("-depth").first().pk


@pytest.mark.slow
def test_strategies_wait_stream_and_cancel_on_a_real_worker(world, worker):
    """On a real worker, a run busy on the thread: ``reject`` is a 409, ``enqueue`` waits its turn,
    ``interrupt`` stops it and goes next, ``rollback`` stops it and runs on a fork the thread
    follows; ``runs/wait`` answers when its run is over, ``runs/stream`` streams the run it starts
    (``Location`` to join it again), and ``cancel?wait=1`` answers once the run has stopped."""
    lg = world.lg

    def running(tid):
        slow = ok(lg.post(f"/threads/{tid}/runs", {"assistant_id": "slow", "input": human("long")}))
        poll(lambda: ok(lg.get(f"/threads/{tid}/runs/{slow['run_id']}"))["status"] == "running", what="running")
        return slow["run_id"]

    tid = world.thread("slow")
    busy = running(tid)
    body = {"assistant_id": "bot", "input": human("next")}
    answer = refused(lg.post(f"/threads/{tid}/runs", {**body, "multitask_strategy": "reject"}), 409, "branch_busy")
    assert answer["execution_id"] == busy
    queued = ok(lg.post(f"/threads/{tid}/runs", {**body, "multitask_strategy": "enqueue"}))
    assert queued["status"] == "pending"
    done = json.loads(body_of(lg.post(f"/threads/{tid}/runs/wait", {**body, "multitask_strategy": "interrupt"})))
    assert ok(lg.get(f"/threads/{tid}/runs/{busy}"))["status"] == "interrupted"
    assert done["messages"][-1]["content"] == "planned: next"
    assert ok(lg.get(f"/threads/{tid}/runs/{queued['run_id']}"))["status"] == "success"

    tid = world.thread("slow")
    busy = running(tid)
    response = lg.post(f"/threads/{tid}/runs/stream", {**body, "multitask_strategy": "rollback",
                                                       "stream_mode": ["values", "messages-tuple"]})
    frames = frames_of(response)
    rid = frames[0]["data"]["run_id"]
    assert response["Location"].startswith(f"/threads/{tid}/runs/{rid}/stream?stream_mode=values")
    assert response["Content-Location"] == f"/threads/{tid}/runs/{rid}"
    assert [f["event"] for f in frames[:2]] == ["metadata", "values"] and frames[-1]["data"]["status"] == "success"
    assert frames[-2]["data"]["messages"][0]["content"] == "next"  # the fork starts before the rolled-back input
    assert ok(lg.get(f"/threads/{tid}/state"))["values"] == frames[-2]["data"]
    poll(lambda: Job.objects.get(pk=busy).status == "cancelled", what="the rolled-back run to stop")  # on its own branch

    tid = world.thread("slow")
    busy = running(tid)
    stopped = ok(lg.post(f"/threads/{tid}/runs/{busy}/cancel", wait=1))
    assert stopped["status"] == "interrupted" and Job.objects.get(pk=busy).status == "cancelled"
