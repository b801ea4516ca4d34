"""The real, pinned ``langgraph-sdk`` (docs/langgraph.md) against a live Trellis — a daphne
process serving ``/lg`` and a django-q2 worker running the turns — with its sync and its async
client, as a team's scripts use it: find the assistant, open a thread, run, read the state and
its history, stream in each mode, double-text a busy thread with each multitask strategy, join
a run after a dropped connection (no frame missed, none repeated), search threads, fork from a
checkpoint, decide an interrupt, cancel; and another user's client gets a 404 for every one of
those things."""

import asyncio

import httpx
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.errors import ConflictError

from accounts.models import ApiToken, TokenScope
from collab.models import Job
from tests.conftest import api_client_of, make_spec, poll
from tests.lg.client import ANSWER, APPROVAL, SLOW, human

pytestmark = pytest.mark.slow

STEPS = [  # a run that goes on after its first frames: a tool call, a pause, the answer
    {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "step"}}]},
    {"sleep_ms": 1500},
    {"text": "stepped: {{prompt}}"},
]


def token_of(user) -> str:
    _, raw = ApiToken.issue(user, name="langgraph-sdk", scopes=TokenScope.values)
    return raw


@pytest.fixture
def specs(team):
    owner = api_client_of(team.owner)
    made = {name: make_spec(owner, name, script) for name, script in
            (("bot", ANSWER), ("steps", STEPS), ("slow", SLOW))}
    made["careful"] = make_spec(owner, "careful", APPROVAL, approvals=["todo_create"])
    return made


def test_the_sync_client_walks_through_the_whole_api(team, specs, server, worker):
    """langgraph-sdk's sync client, step by step through the API (docs/langgraph.md), and another
    user's client refused with a 404 at every step."""
    client = get_sync_client(url=f"{server.url}/lg", api_key=token_of(team.member))
    outsider = get_sync_client(url=f"{server.url}/lg", api_key=token_of(team.outsider))

    # assistants.search → threads.create
    (bot,) = [a for a in client.assistants.search(graph_id="bot") if a["graph_id"] == "bot"]
    assert bot["metadata"]["project"] == "alpha"
    assert [a for a in outsider.assistants.search(graph_id="bot") if a["metadata"].get("project") == "alpha"] == []
    thread = client.threads.create(metadata={"project": "alpha", "topic": "plans"}, graph_id="bot")
    tid = thread["thread_id"]

    # runs.wait → threads.get_state / get_history
    values = client.runs.wait(tid, bot["assistant_id"], input=human("the plan"))
    assert [m["type"] for m in values["messages"]] == ["human", "ai", "tool", "ai"]
    assert values["messages"][-1]["content"] == "planned: the plan"
    state = client.threads.get_state(tid)
    assert state["values"] == values and state["next"] == []
    history = client.threads.get_history(tid, limit=10)
    assert history[0]["checkpoint"]["checkpoint_id"] == values["messages"][-1]["id"]

    # runs.stream in each mode
    for mode, expected in (("values", ["values"] * 4), ("updates", ["updates"] * 3),
                           ("messages-tuple", ["messages"] * 3)):
        parts = list(client.runs.stream(tid, "bot", input=human(mode), stream_mode=mode))
        assert parts[0].event == "metadata" and parts[-1].event == "end", parts
        assert [p.event for p in parts[1:-1]] == expected, (mode, parts)
        assert parts[-1].data["status"] == "success"
    last = client.threads.get_state(tid)["values"]["messages"]
    assert parts[-2].data[0] == last[-1] and parts[-2].data[1]["run_id"] == parts[0].data["run_id"]

    # runs.create with each multitask_strategy on a busy thread
    busy = client.threads.create(metadata={"project": "alpha"}, graph_id="slow")["thread_id"]

    def running():
        run = client.runs.create(busy, "slow", input=human("long"))
        poll(lambda: client.runs.get(busy, run["run_id"])["status"] == "running", what="the slow run to start")
        return run["run_id"]

    first = running()
    with pytest.raises(ConflictError):
        client.runs.create(busy, "bot", input=human("no"), multitask_strategy="reject")
    queued = client.runs.create(busy, "bot", input=human("later"), multitask_strategy="enqueue")
    assert queued["status"] == "pending"
    interrupting = client.runs.create(busy, "bot", input=human("now"), multitask_strategy="interrupt")
    assert client.runs.join(busy, interrupting["run_id"])["messages"][-1]["content"] == "planned: now"
    assert client.runs.get(busy, first)["status"] == "interrupted"
    assert client.runs.get(busy, queued["run_id"])["status"] == "success"
    second = running()
    rolled = client.runs.create(busy, "bot", input=human("over"), multitask_strategy="rollback")
    after = client.runs.join(busy, rolled["run_id"])["messages"]
    assert after[-1]["content"] == "planned: over"
    assert Job.objects.get(pk=second).prompt_msg_id not in [m["id"] for m in after]  # rolled back
    assert client.threads.get_state(busy)["values"]["messages"] == after
    assert client.runs.get(busy, second)["status"] in ("running", "interrupted")  # stopping on its own branch

    # runs.join / join_stream after a dropped connection: no gap, no duplicate
    dropped = []
    for part in client.runs.stream(tid, "steps", input=human("walk"), stream_mode="values"):
        dropped.append(part)
        if len(dropped) == 3:  # metadata, the input, the tool call: the connection drops here
            break
    rid = dropped[0].data["run_id"]
    rest = list(client.runs.join_stream(tid, rid, stream_mode="values", last_event_id=dropped[-1].id))
    whole = list(client.runs.join_stream(tid, rid, stream_mode="values", last_event_id="-1"))
    assert dropped[1:] + rest == whole[1:]
    assert [p.event for p in whole] == ["metadata"] + ["values"] * 4 + ["end"]
    assert whole[-2].data["messages"][-1]["content"] == "stepped: walk"
    assert client.runs.join(tid, rid) == whole[-2].data

    # threads.search
    found = client.threads.search(metadata={"project": "alpha", "topic": "plans"})
    assert [t["thread_id"] for t in found] == [tid]
    assert outsider.threads.search(metadata={"topic": "plans"}) == []

    # a fork from a checkpoint
    at = values["messages"][0]["id"]
    forked = client.runs.wait(tid, "bot", input=human("instead"), checkpoint_id=at)
    assert [m["content"] for m in forked["messages"][:2]] == ["the plan", "instead"]
    assert client.threads.get_state(tid)["values"] == forked

    # an interrupt, resumed
    careful = client.threads.create(metadata={"project": "alpha"}, graph_id="careful")["thread_id"]
    paused = client.runs.wait(careful, "careful", input=human("ship"))
    (interrupt,) = paused["__interrupt__"]
    assert client.threads.get(careful)["status"] == "interrupted"
    assert client.threads.get_state(careful)["interrupts"] == [interrupt]
    resumed = client.runs.wait(careful, "careful", command={"resume": {"type": "edit", "edited_action": {
        "name": "todo_create", "args": {"subject": "ship it today"}}}})
    assert "__interrupt__" not in resumed and resumed["messages"][-1]["content"].startswith("after the call:")
    assert "ship it today" in resumed["messages"][-2]["content"] + resumed["messages"][-1]["content"]

    # cancel
    slow = client.threads.create(metadata={"project": "alpha"}, graph_id="slow")["thread_id"]
    run = client.runs.create(slow, "slow", input=human("forever"))
    poll(lambda: client.runs.get(slow, run["run_id"])["status"] == "running", what="the run to start")
    client.runs.cancel(slow, run["run_id"], wait=True)
    assert client.runs.get(slow, run["run_id"])["status"] == "interrupted"
    assert Job.objects.get(pk=run["run_id"]).status == "cancelled"

    # another user's client: a 404 for every one of those
    refusals = [
        lambda: outsider.threads.get(tid), lambda: outsider.threads.get_state(tid),
        lambda: outsider.threads.get_history(tid), lambda: outsider.runs.get(tid, rid),
        lambda: outsider.runs.list(tid), lambda: outsider.runs.wait(tid, "bot", input=human("x")),
        lambda: outsider.runs.create(tid, "bot", input=human("x")),
        lambda: list(outsider.runs.stream(tid, "bot", input=human("x"))),
        lambda: outsider.runs.join(tid, rid),
        lambda: list(outsider.runs.join_stream(tid, rid, last_event_id="-1")),
        lambda: outsider.runs.cancel(slow, run["run_id"]),
        lambda: outsider.runs.wait(careful, "careful", command={"resume": True}),
    ]
    for refusal in refusals:
        with pytest.raises(httpx.HTTPStatusError) as refused:
            refusal()
        assert refused.value.response.status_code == 404  # NotFoundError, or plain httpx's from runs.wait/join
    assert Job.objects.filter(started_by=team.outsider).count() == 0


def test_the_async_client_runs_streams_and_rejoins_a_dropped_stream(team, specs, server, worker):
    """langgraph-sdk's async client: a thread, a run waited for, a stream of ``messages-tuple``
    and ``updates`` dropped after its first frames and joined again exactly where it stopped, the
    run joined; another user's async client gets 404s; a stream asked to cancel its run when its
    client leaves does."""
    url = f"{server.url}/lg"
    member, other = token_of(team.member), token_of(team.outsider)

    async def walk():
        client = get_client(url=url, api_key=member)
        outsider = get_client(url=url, api_key=other)
        (steps,) = [a for a in await client.assistants.search(graph_id="steps") if a["graph_id"] == "steps"]
        tid = (await client.threads.create(metadata={"project": "alpha"}, graph_id="steps"))["thread_id"]
        waited = await client.runs.wait(tid, steps["assistant_id"], input=human("one"))
        assert waited["messages"][-1]["content"] == "stepped: one"

        modes = ["updates", "messages-tuple"]
        dropped = []
        stream = client.runs.stream(tid, "steps", input=human("two"), stream_mode=modes)
        async for part in stream:
            dropped.append(part)
            if len(dropped) == 3:  # metadata, the tool call as a message and as an update
                break
        await stream.aclose()  # the connection drops here
        rid = dropped[0].data["run_id"]
        rest = [p async for p in client.runs.join_stream(tid, rid, stream_mode=modes, last_event_id=dropped[-1].id)]
        whole = [p async for p in client.runs.join_stream(tid, rid, stream_mode=modes, last_event_id="-1")]
        assert dropped[1:] + rest == whole[1:]
        assert [p.event for p in whole[1:-1]] == ["messages", "updates"] * 3 and whole[-1].event == "end"
        joined = await client.runs.join(tid, rid)
        assert joined["messages"][-1] == whole[-2].data["agent"]["messages"][0]

        for refusal in (outsider.threads.get_state(tid), outsider.runs.get(tid, rid), outsider.runs.join(tid, rid),
                        outsider.runs.wait(tid, "steps", input=human("x"))):
            with pytest.raises(httpx.HTTPStatusError) as refused:
                await refusal
            assert refused.value.response.status_code == 404

        # on_disconnect="cancel": the run stops when its stream's client goes away
        stream = client.runs.stream(tid, "slow", input=human("long"), on_disconnect="cancel")
        async for part in stream:
            if part.event == "values":
                left = part
                break
        await stream.aclose()  # the client goes away: its connection closes
        return rid, left.data["messages"][-1]["id"]

    rid, prompt = asyncio.run(walk())
    assert Job.objects.get(pk=rid).status == "succeeded"
    abandoned = Job.objects.get(prompt_msg_id=prompt)
    poll(lambda: Job.objects.get(pk=abandoned.pk).status == "cancelled", what="the abandoned run to be cancelled")
