"""The LangGraph-compatible API's assistants, threads, state and checkpoints (docs/langgraph.md),
through HTTP with a Trellis token in ``x-api-key`` as langgraph-sdk sends it: agent specs are
assistants, sessions threads, messages checkpoints, asks interrupts — under the native API's
access and visibility rules."""

import json
import threading
import time

import httpx
import pytest
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import ApiToken, Membership, TokenScope
from langgraph_sdk._sync.client import SyncLangGraphClient
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError
from langgraph_sdk.schema import Thread, ThreadState

from collab.models import AgentSpec, Event, Job, Message, PersonAsk, Session
from collab.services.turns import do_fork_and_start
from tests.conftest import api_client_of, make_spec, turn
from tests.lg.client import ANSWER, APPROVAL, QUESTION, Lg, lg_as, ok, refused

@pytest.fixture
def bot(team):
    """The owner's scripted agent spec ``bot`` in project alpha: a tool call, then an answer."""
    return make_spec(api_client_of(team.owner), "bot", ANSWER)


def new_thread(lg, **metadata) -> dict:
    return ok(lg.post("/threads", {"metadata": {"project": "alpha", "graph_id": "bot", **metadata}}))


def run_turn(user, thread_id, run_queued, prompt="the launch"):
    """A person's turn on the thread through the native API, run to its end."""
    eid = turn(api_client_of(user), thread_id, prompt)
    run_queued()
    return eid


# --- assistants ---------------------------------------------------------------------------------


def test_assistants_are_the_agent_specs_of_the_callers_projects(team, bot):
    make_spec(api_client_of(team.owner), "writer", [{"text": "hi"}])
    make_spec(api_client_of(team.outsider), "spy", [{"text": "hi"}], project="beta")
    member = lg_as(team.member)

    found = ok(member.post("/assistants/search", {"limit": 10}))
    assert sorted(a["graph_id"] for a in found) == ["bot", "writer"]
    (bot_assistant,) = ok(member.post("/assistants/search", {"graph_id": "bot"}))
    assert bot_assistant["assistant_id"] == str(AgentSpec.objects.get(project=team.alpha, agent_id="bot").pk)
    assert bot_assistant["name"] == "bot" and bot_assistant["metadata"]["project"] == "alpha"
    assert bot_assistant["metadata"]["provider"] == "scripted" and bot_assistant["version"] == 1
    assert {"config", "context", "created_at", "updated_at", "description"} <= set(bot_assistant)
    assert ok(member.post("/assistants/search", {"metadata": {"project": "beta"}})) == []
    assert ok(member.post("/assistants/search", {"metadata": {"owner": "x"}})) == []  # no such key: no match
    assert [a["graph_id"] for a in ok(member.post("/assistants/search", {"name": "RIT"}))] == ["writer"]
    assert ok(member.post("/assistants/count", {})) == 2

    first = member.post("/assistants/search", {"limit": 1, "sort_by": "graph_id", "sort_order": "asc"})
    assert [a["graph_id"] for a in ok(first)] == ["bot"] and first["X-Pagination-Next"] == "1"
    last = member.post("/assistants/search", {"limit": 1, "offset": 1, "sort_by": "graph_id", "sort_order": "asc"})
    assert [a["graph_id"] for a in ok(last)] == ["writer"] and "X-Pagination-Next" not in last
    assert ok(member.post("/assistants/search", {"select": ["assistant_id", "graph_id"], "graph_id": "bot"})) == [
        {"assistant_id": bot_assistant["assistant_id"], "graph_id": "bot"}]

    assert ok(member.get(f"/assistants/{bot_assistant['assistant_id']}")) == bot_assistant
    assert ok(member.get("/assistants/bot"))["assistant_id"] == bot_assistant["assistant_id"]  # a graph's name
    schemas = ok(member.get(f"/assistants/{bot_assistant['assistant_id']}/schemas"))
    assert schemas["graph_id"] == "bot" and "messages" in schemas["state_schema"]["properties"]
    assert [n["id"] for n in ok(member.get("/assistants/bot/graph"))["nodes"]] == ["__start__", "agent", "__end__"]

    outsider = lg_as(team.outsider)
    refused(outsider.get(f"/assistants/{bot_assistant['assistant_id']}"), 404, "unknown_assistant")
    refused(outsider.get("/assistants/bot/schemas"), 404, "unknown_assistant")
    assert [a["graph_id"] for a in ok(outsider.post("/assistants/search", {}))] == ["spy"]
    refused(member.get("/assistants/spy"), 404, "unknown_assistant")


def test_assistants_are_read_only_and_unknown_fields_are_refused(team, bot):
    member = lg_as(team.member)
    refused(member.post("/assistants", {"graph_id": "bot"}), 405, "unsupported")
    refused(member.patch("/assistants/bot", {"name": "x"}), 405, "unsupported")
    refused(member.delete("/assistants/bot"), 405, "unsupported")
    refused(member.post("/assistants/search", {"graph": "bot"}), 422, "invalid_request")
    refused(member.post("/assistants/search", {"limit": 0}), 422, "invalid_request")


# --- threads ------------------------------------------------------------------------------------


def test_a_thread_is_a_session_of_the_project_and_agent_its_metadata_names(team, bot):
    member = lg_as(team.member)
    thread = new_thread(member, topic="launch", nested={"a": [1, 2]})
    session = Session.objects.get(pk=thread["thread_id"])
    assert session.project.slug == "alpha" and session.agent_spec.agent_id == "bot"
    assert session.created_by == team.member and session.metadata == {"topic": "launch", "nested": {"a": [1, 2]}}
    assert thread["metadata"] == {"topic": "launch", "nested": {"a": [1, 2]}, "project": "alpha",
                                  "graph_id": "bot", "assistant_id": str(session.agent_spec_id)}
    assert thread["status"] == "idle" and thread["values"] == {"messages": []} and thread["interrupts"] == {}
    assert ok(member.get(f"/threads/{thread['thread_id']}")) == thread
    native = ok(api_client_of(team.member).get(f"/api/sessions/{thread['thread_id']}"))
    assert native["agent_id"] == "bot" and native["project"] == "alpha"

    # the assistant's id picks the spec too; a member of one project needs not name it
    by_id = ok(member.post("/threads", {"metadata": {"assistant_id": str(session.agent_spec_id)}}))
    assert by_id["metadata"]["project"] == "alpha" and by_id["metadata"]["graph_id"] == "bot"
    bare = ok(member.post("/threads", {}))
    assert bare["metadata"] == {"project": "alpha", "graph_id": None, "assistant_id": None}
    refused(member.post("/threads", {"metadata": {"project": "alpha", "graph_id": "nobody"}}), 404, "unknown_agent_id")
    refused(member.post("/threads", {"metadata": {"project": "alpha", "assistant_id": "999999"}}), 404,
            "unknown_assistant")


def test_creating_a_thread_takes_a_role_that_may_start_turns_in_that_project(team, bot):
    refused(lg_as(team.viewer).post("/threads", {"metadata": {"project": "alpha"}}), 403, "forbidden")
    refused(lg_as(team.outsider).post("/threads", {"metadata": {"project": "alpha"}}), 404, "not_found")
    refused(lg_as(team.outsider).post("/threads", {"metadata": {"project": "nowhere"}}), 404, "not_found")
    # the outsider owns beta only: it is their default project
    assert ok(lg_as(team.outsider).post("/threads", {}))["metadata"]["project"] == "beta"
    Membership.objects.create(user=team.outsider, project=team.alpha, role="member")
    refused(lg_as(team.outsider).post("/threads", {}), 400, "project_required")


def test_what_trellis_cannot_honour_is_refused_by_name_never_ignored(team, bot):
    member = lg_as(team.member)
    thread = new_thread(member)
    tid = thread["thread_id"]
    refused(member.post("/threads", {"metadata": {"project": "alpha"}, "bogus": 1}), 422, "invalid_request")
    assert "ttl" in refused(member.post("/threads", {"ttl": {"ttl": 5}}), 422, "unsupported")["detail"]
    assert "supersteps" in refused(member.post("/threads", {"supersteps": [{"updates": []}]}), 422,
                                   "unsupported")["detail"]
    assert "thread_id" in refused(member.post("/threads", {"thread_id": "0123456789ab"}), 422, "unsupported")["detail"]
    assert ok(member.post("/threads", {"thread_id": tid, "if_exists": "do_nothing"}))["thread_id"] == tid
    refused(member.post("/threads", {"thread_id": tid}), 409, "thread_exists")
    refused(member.post("/threads", {"if_exists": "sometimes"}), 422, "invalid_request")
    refused(member.patch(f"/threads/{tid}", {"ttl": 3}), 422, "unsupported")
    refused(member.patch(f"/threads/{tid}", {"metadata": {}, "status": "idle"}), 422, "invalid_request")
    refused(member.get(f"/threads/{tid}", include="ttl"), 422, "unsupported")
    refused(member.post("/threads/search", {"values": {"messages": []}}), 422, "unsupported")
    refused(member.post("/threads/search", {"extract": {"last": "values.messages[-1]"}}), 422, "unsupported")
    refused(member.post("/threads/search", {"status": "sleeping"}), 422, "invalid_request")
    refused(member.post(f"/threads/{tid}/state", {"values": {"messages": []}}), 422, "unsupported")
    refused(member.post(f"/threads/{tid}/history", {"checkpoint": {"checkpoint_ns": "sub"}}), 422, "unsupported")
    refused(member.post(f"/threads/{tid}/history", {"limit": 10, "page": 2}), 422, "invalid_request")
    refused(member.post(f"/threads/{tid}/copy"), 422, "unsupported")
    refused(member.get(f"/threads/{tid}/state", select="nothing"), 400, "invalid_request")
    refused(member.post("/threads", {"metadata": {"project": "alpha", "k": "x" * 20_000}}), 400, "invalid_metadata")


def test_patch_merges_metadata_and_the_threads_own_keys_do_not_change(team, bot):
    member = lg_as(team.member)
    tid = new_thread(member, topic="launch", stage=1)["thread_id"]
    merged = ok(member.patch(f"/threads/{tid}", {"metadata": {"stage": 2, "owner": None, "project": "alpha"}}))
    assert merged["metadata"] == {"topic": "launch", "stage": 2, "owner": None, "project": "alpha", "graph_id": "bot",
                                  "assistant_id": merged["metadata"]["assistant_id"]}
    assert Session.objects.get(pk=tid).metadata == {"topic": "launch", "stage": 2, "owner": None}
    changed = [e.payload for e in Event.objects.filter(session_id=tid, type="session.metadata_changed")]
    assert changed == [{"session": tid, "keys": ["owner", "stage"]}]

    refused(member.patch(f"/threads/{tid}", {"metadata": {"project": "beta"}}), 422, "unsupported")
    refused(member.patch(f"/threads/{tid}", {"metadata": {"graph_id": "writer"}}), 422, "unsupported")
    refused(lg_as(team.viewer).patch(f"/threads/{tid}", {"metadata": {"stage": 3}}), 403, "forbidden")
    refused(lg_as(team.outsider).patch(f"/threads/{tid}", {"metadata": {"stage": 3}}), 404, "not_found")
    assert Session.objects.get(pk=tid).metadata["stage"] == 2


def test_delete_removes_the_session_for_its_creator_or_a_maintainer_never_while_it_runs(team, bot, run_queued):
    member, maintainer = lg_as(team.member), lg_as(team.maintainer)
    mine = new_thread(member)["thread_id"]
    run_turn(team.member, mine, run_queued)
    refused(lg_as(team.outsider).delete(f"/threads/{mine}"), 404, "not_found")
    refused(lg_as(team.viewer).delete(f"/threads/{mine}"), 403, "forbidden")
    theirs = new_thread(maintainer)["thread_id"]
    refused(member.delete(f"/threads/{theirs}"), 403, "forbidden")  # a member deletes only their own

    assert member.delete(f"/threads/{mine}").status_code == 204
    refused(member.get(f"/threads/{mine}"), 404, "not_found")
    assert not Session.objects.filter(pk=mine).exists() and not Message.objects.filter(session_id=mine).exists()
    audit = Event.objects.get(project=team.alpha, type="session.deleted")
    assert audit.payload["session"] == mine and audit.actor == team.member

    busy = new_thread(member)["thread_id"]
    eid = turn(api_client_of(team.member), busy, "go")  # queued, not run
    assert refused(member.delete(f"/threads/{busy}"), 409, "session_busy")["execution_id"] == eid
    assert Session.objects.filter(pk=busy).exists()
    run_queued()
    assert maintainer.delete(f"/threads/{busy}").status_code == 204


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: SQLite runs one write at a time")
def test_a_run_started_while_its_thread_is_being_deleted_is_a_404_never_a_500(transactional_db, team, bot):
    """A run arriving while the thread's deletion holds the session's lock waits for it, then
    finds no thread: a 404 like any missing one, and nothing written (the lock order:
    collab/services/locking.py). Many rounds, each with the deletion committing while the run waits."""
    member = lg_as(team.member)
    for _ in range(8):
        tid = new_thread(member)["thread_id"]
        locked, answered = threading.Event(), []

        def delete_slowly():
            try:
                with transaction.atomic():
                    Session.objects.select_for_update().get(pk=tid)
                    locked.set()
                    time.sleep(0.3)  # the run's request is waiting for this lock now
                    Session.objects.filter(pk=tid).delete()
            finally:
                connection.close()

        deleting = threading.Thread(target=delete_slowly)
        deleting.start()
        assert locked.wait(10)
        answered.append(member.post(f"/threads/{tid}/runs", {"assistant_id": "bot", "input": {
            "messages": [{"role": "user", "content": "now"}]}}))
        deleting.join()
        refused(answered[0], 404, "not_found")
        assert not Job.objects.filter(session_id=tid).exists()


def test_search_filters_by_metadata_status_and_ids_newest_first_in_pages(team, bot, run_queued):
    member = lg_as(team.member)
    a = new_thread(member, topic="a", n=1, flag=True, tags=["x"], **{"odd__key": "v"})["thread_id"]
    b = new_thread(member, topic="b", n=2, flag=False, none=None)["thread_id"]
    c = ok(member.post("/threads", {"metadata": {"project": "alpha", "topic": "a"}}))["thread_id"]
    run_turn(team.member, a, run_queued)  # a is the newest activity now

    def ids(body=None):
        return [t["thread_id"] for t in ok(member.post("/threads/search", body or {}))]

    assert ids() == [a, c, b]
    assert ids({"metadata": {"topic": "a"}}) == [a, c]
    assert ids({"metadata": {"topic": "a", "graph_id": "bot"}}) == [a]
    assert ids({"metadata": {"graph_id": None}}) == [c]
    assert ids({"metadata": {"n": 2}}) == [b] and ids({"metadata": {"flag": True}}) == [a]
    assert ids({"metadata": {"flag": False}}) == [b] and ids({"metadata": {"none": None}}) == [b]
    assert ids({"metadata": {"tags": ["x"]}}) == [a] and ids({"metadata": {"odd__key": "v"}}) == [a]
    assert ids({"metadata": {"n": "2"}}) == [] and ids({"metadata": {"missing": None}}) == []
    assert ids({"metadata": {"project": "beta"}}) == []
    assert ids({"ids": [b, c, "nothere00000"]}) == [c, b]
    assert ids({"sort_by": "created_at", "sort_order": "asc"}) == [a, b, c]

    page = member.post("/threads/search", {"limit": 2})
    assert [t["thread_id"] for t in ok(page)] == [a, c] and page["X-Pagination-Next"] == "2"
    assert ids({"limit": 2, "offset": 2}) == [b]
    assert ok(member.post("/threads/search", {"select": ["thread_id", "status"], "ids": [a]})) == [
        {"thread_id": a, "status": "idle"}]
    assert ok(member.post("/threads/count", {"metadata": {"topic": "a"}})) == 2

    turn(api_client_of(team.member), b, "later")  # queued: b is busy until it runs
    assert ids({"status": "busy"}) == [b] and ok(member.get(f"/threads/{b}"))["status"] == "busy"
    assert set(ids({"status": "idle"})) == {a, c}
    run_queued()
    failed = turn(api_client_of(team.member), c, "x")  # the thread's latest run failed
    Job.objects.filter(pk=failed).update(status="failed", is_error=True, error_code="model_error",
                                         finished_at=timezone.now())
    assert ids({"status": "error"}) == [c] and ok(member.get(f"/threads/{c}"))["status"] == "error"
    assert ids({"sort_by": "status", "sort_order": "asc", "ids": [a, c]}) == [c, a]  # "error" < "idle"
    assert ids({"status": "busy"}) == [] and ok(member.post("/threads/count", {"status": "idle"})) == 2


# --- state and checkpoints ----------------------------------------------------------------------


def test_state_values_are_the_threads_messages_in_langchain_form(team, bot, run_queued):
    member = lg_as(team.member)
    tid = new_thread(member)["thread_id"]
    eid = run_turn(team.member, tid, run_queued)
    nodes = list(Message.objects.filter(session_id=tid).order_by("depth"))
    assert [m.role for m in nodes] == ["user", "assistant", "tool", "assistant"]

    state = ok(member.get(f"/threads/{tid}/state"))
    human, call, result, answer = state["values"]["messages"]
    assert (human["type"], human["content"], human["id"]) == ("human", "the launch", nodes[0].pk)
    assert call["type"] == "ai" and call["id"] == nodes[1].pk
    assert call["tool_calls"] == [{"name": "todo_create", "args": {"subject": "write the plan"},
                                   "id": nodes[1].tool_calls[0]["id"], "type": "tool_call"}]
    assert result["type"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert result["name"] == "todo_create" and result["status"] == "success"
    assert (answer["type"], answer["content"], answer["tool_calls"]) == ("ai", "planned: the launch", [])
    assert state["checkpoint"] == {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": nodes[3].pk,
                                   "checkpoint_map": None}
    assert state["parent_checkpoint"]["checkpoint_id"] == nodes[2].pk
    assert state["next"] == [] and state["tasks"] == [] and state["interrupts"] == []
    assert state["metadata"]["run_id"] == eid and state["metadata"]["step"] == 3
    assert state["metadata"]["source"] == "loop" and state["created_at"]

    thread = ok(member.get(f"/threads/{tid}"))
    assert thread["values"] == state["values"] and thread["status"] == "idle"
    assert ok(member.get(f"/threads/{tid}/state", select=["values.messages"])) == {"values": state["values"]}
    assert set(ok(member.get(f"/threads/{tid}/state", select=["checkpoint", "next"]))) == {"checkpoint", "next"}


def test_every_message_is_a_checkpoint_and_history_walks_back_from_the_latest(team, bot, run_queued):
    member = lg_as(team.member)
    tid = new_thread(member)["thread_id"]
    run_turn(team.member, tid, run_queued)
    nodes = [m.pk for m in Message.objects.filter(session_id=tid).order_by("depth")]

    at_call = ok(member.get(f"/threads/{tid}/state/{nodes[1]}"))
    assert [m["id"] for m in at_call["values"]["messages"]] == nodes[:2]
    assert at_call["checkpoint"]["checkpoint_id"] == nodes[1] and at_call["next"] == []
    posted = ok(member.post(f"/threads/{tid}/state/checkpoint", {"checkpoint": {"checkpoint_id": nodes[1]}}))
    assert posted == at_call

    history = ok(member.post(f"/threads/{tid}/history", {"limit": 10}))
    assert [s["checkpoint"]["checkpoint_id"] for s in history] == nodes[::-1]
    assert history[0] == ok(member.get(f"/threads/{tid}/state"))
    assert [len(s["values"]["messages"]) for s in history] == [4, 3, 2, 1]
    older = ok(member.post(f"/threads/{tid}/history", {"limit": 2, "before": {"configurable": {"checkpoint_id": nodes[2]}}}))
    assert [s["checkpoint"]["checkpoint_id"] for s in older] == [nodes[1], nodes[0]]
    assert [s["checkpoint"]["checkpoint_id"] for s in ok(member.post(
        f"/threads/{tid}/history", {"before": nodes[1]}))] == [nodes[0]]
    assert [s["checkpoint"]["checkpoint_id"] for s in ok(member.post(
        f"/threads/{tid}/history", {"checkpoint": {"checkpoint_id": nodes[2]}, "limit": 1}))] == [nodes[2]]
    inputs = ok(member.post(f"/threads/{tid}/history", {"metadata": {"source": "input"}}))
    assert [s["checkpoint"]["checkpoint_id"] for s in inputs] == [nodes[0]]
    assert ok(member.post(f"/threads/{tid}/history", {"select": ["checkpoint"], "limit": 1})) == [
        {"checkpoint": history[0]["checkpoint"]}]

    other = new_thread(member)["thread_id"]
    assert ok(member.post(f"/threads/{other}/history", {})) == []
    empty = ok(member.get(f"/threads/{other}/state"))
    assert empty["values"] == {"messages": []} and empty["checkpoint"]["checkpoint_id"] is None
    refused(member.get(f"/threads/{other}/state/{nodes[1]}"), 404, "unknown_checkpoint")  # another thread's
    refused(member.post(f"/threads/{other}/history", {"before": nodes[1]}), 404, "unknown_checkpoint")
    refused(member.post(f"/threads/{tid}/state/checkpoint",
                        {"checkpoint": {"thread_id": other, "checkpoint_id": nodes[1]}}), 404, "unknown_checkpoint")


def test_a_fork_is_a_checkpoint_of_its_own_line_and_a_selected_fork_is_the_latest_state(team, bot, run_queued):
    member = lg_as(team.member)
    tid = new_thread(member)["thread_id"]
    run_turn(team.member, tid, run_queued)
    first, call, *_ = Message.objects.filter(session_id=tid).order_by("depth")
    session = Session.objects.get(pk=tid)
    do_fork_and_start(team.member, session, call, "another way", select=True)
    run_queued()
    fork_tip = Message.objects.filter(session_id=tid).exclude(branch_id=first.branch_id).order_by("-depth").first()

    state = ok(member.get(f"/threads/{tid}/state"))
    assert state["checkpoint"]["checkpoint_id"] == fork_tip.pk
    ids = [m["id"] for m in state["values"]["messages"]]
    assert ids[:2] == [first.pk, call.pk] and state["values"]["messages"][2]["content"] == "another way"
    assert state["values"]["messages"][2]["additional_kwargs"]["trellis"]["branch"] == fork_tip.branch_id
    old_tip = Message.objects.filter(branch_id=first.branch_id).order_by("-depth").first()
    assert [m["id"] for m in ok(member.get(f"/threads/{tid}/state/{old_tip.pk}"))["values"]["messages"]][-1] == old_tip.pk


def test_a_turn_waiting_for_an_approval_is_an_interrupt_of_the_thread(team, run_queued):
    spec = make_spec(api_client_of(team.owner), "careful", APPROVAL, approvals=["todo_create"])
    member = lg_as(team.member)
    tid = ok(member.post("/threads", {"metadata": {"project": "alpha", "graph_id": "careful"}}))["thread_id"]
    eid = run_turn(team.member, tid, run_queued)
    assert Job.objects.get(pk=eid).status == "waiting"
    ask = PersonAsk.objects.get(job_id=eid)

    thread = ok(member.get(f"/threads/{tid}"))
    assert thread["status"] == "interrupted" and list(thread["interrupts"]) == [eid]
    (interrupt,) = thread["interrupts"][eid]
    assert interrupt["id"] == ask.pk
    value = interrupt["value"]
    assert value["action_requests"] == [{"name": "todo_create", "args": {"subject": "ship it"},
                                         "description": value["action_requests"][0]["description"]}]
    assert value["review_configs"] == [{"action_name": "todo_create", "allowed_decisions": ["approve", "edit", "reject"]}]
    assert value["trellis"]["kind"] == "approval" and value["trellis"]["run_id"] == eid
    assert value["trellis"]["tool_call_id"] == ask.tool_call_id

    state = ok(member.get(f"/threads/{tid}/state"))
    assert state["interrupts"] == [interrupt] and state["next"] == ["agent"]
    assert state["tasks"][0]["id"] == eid and state["tasks"][0]["interrupts"] == [interrupt]
    assert [t["thread_id"] for t in ok(member.post("/threads/search", {"status": "interrupted"}))] == [tid]
    assert ok(member.get(f"/threads/{tid}/state/{state['parent_checkpoint']['checkpoint_id']}"))["interrupts"] == []
    assert spec  # the spec the thread names


def test_an_ask_person_question_is_an_interrupt_with_its_question_and_choices(team, run_queued):
    make_spec(api_client_of(team.owner), "asker", QUESTION)
    member = lg_as(team.member)
    tid = ok(member.post("/threads", {"metadata": {"project": "alpha", "graph_id": "asker"}}))["thread_id"]
    eid = run_turn(team.member, tid, run_queued)
    (interrupt,) = ok(member.get(f"/threads/{tid}/state"))["interrupts"]
    assert interrupt["value"]["question"] == "Which colour?" and interrupt["value"]["choices"] == ["red", "blue"]
    assert interrupt["value"]["trellis"]["kind"] == "question" and interrupt["value"]["trellis"]["run_id"] == eid
    # the viewer reads the thread, interrupts included, but decides nothing
    assert ok(lg_as(team.viewer).get(f"/threads/{tid}/state"))["interrupts"] == [interrupt]


# --- who sees what ------------------------------------------------------------------------------


def test_a_thread_the_caller_may_not_see_answers_404_everywhere_like_a_missing_one(team, bot, run_queued):
    member = lg_as(team.member)
    tid = new_thread(member, topic="secret")["thread_id"]
    run_turn(team.member, tid, run_queued)
    node = Message.objects.filter(session_id=tid).first().pk
    assert api_client_of(team.member).patch(f"/api/sessions/{tid}", {"visibility": "private"}).status_code == 200

    for other in (team.outsider, team.viewer):
        lg = lg_as(other)
        for thread in (tid, "0123456789ab"):
            for response in (lg.get(f"/threads/{thread}"), lg.get(f"/threads/{thread}/state"),
                             lg.get(f"/threads/{thread}/state/{node}"),
                             lg.post(f"/threads/{thread}/state/checkpoint", {"checkpoint": {"checkpoint_id": node}}),
                             lg.post(f"/threads/{thread}/history", {}),
                             lg.patch(f"/threads/{thread}", {"metadata": {"topic": "mine"}}),
                             lg.delete(f"/threads/{thread}"),
                             lg.post("/threads", {"thread_id": thread, "if_exists": "do_nothing"})):
                assert response.status_code in (404, 422), response.content
                body = response.json()
                assert (response.status_code, body["code"]) in ((404, "not_found"), (422, "unsupported")), body
        assert tid not in [t["thread_id"] for t in ok(lg.post("/threads/search", {"metadata": {"topic": "secret"}}))]
        assert ok(lg.post("/threads/count", {"metadata": {"topic": "secret"}})) == 0
    # the same answers for the hidden thread and for a missing id: nothing tells them apart
    outsider = lg_as(team.outsider)
    assert outsider.get(f"/threads/{tid}").json() == outsider.get("/threads/0123456789ab").json()
    assert (outsider.post("/threads", {"thread_id": tid}).json()
            == outsider.post("/threads", {"thread_id": "0123456789ab"}).json())
    assert ok(lg_as(team.maintainer).get(f"/threads/{tid}"))["metadata"]["topic"] == "secret"


def test_state_names_no_session_the_reader_may_not_see(team, bot, run_queued):
    hidden = new_thread(lg_as(team.maintainer))["thread_id"]
    assert api_client_of(team.maintainer).patch(f"/api/sessions/{hidden}", {"visibility": "private"}).status_code == 200
    tid = new_thread(lg_as(team.maintainer))["thread_id"]
    run_turn(team.maintainer, tid, run_queued, prompt=f"compare with {hidden}")

    member_view = ok(lg_as(team.member).get(f"/threads/{tid}/state"))["values"]["messages"]
    assert hidden not in json.dumps(member_view) and "another session" in member_view[0]["content"]
    assert hidden in ok(lg_as(team.maintainer).get(f"/threads/{tid}/state"))["values"]["messages"][0]["content"]


def test_a_key_in_x_api_key_or_a_bearer_token_and_its_scopes_apply(team, bot):
    assert Lg().post("/threads/search", {}).status_code == 401
    assert Lg("not-a-token").get("/assistants/bot").status_code == 401
    assert ok(lg_as(team.member, header="HTTP_AUTHORIZATION").post("/threads/search", {})) == []
    tid = new_thread(lg_as(team.member))["thread_id"]

    reader = lg_as(team.member, scopes=[TokenScope.READ])
    assert [t["thread_id"] for t in ok(reader.post("/threads/search", {}))] == [tid]
    ok(reader.post("/threads/count", {}))
    ok(reader.post("/assistants/search", {}))
    ok(reader.post(f"/threads/{tid}/history", {}))
    ok(reader.post(f"/threads/{tid}/state/checkpoint", {"checkpoint": {"checkpoint_id": None}}))
    refused(reader.post("/threads", {"metadata": {"project": "alpha"}}), 403, "token_scope")
    refused(reader.patch(f"/threads/{tid}", {"metadata": {"a": 1}}), 403, "token_scope")
    refused(reader.delete(f"/threads/{tid}"), 403, "token_scope")
    writer = lg_as(team.member, scopes=[TokenScope.WRITE])
    refused(writer.get(f"/threads/{tid}"), 403, "token_scope")
    refused(writer.post("/threads/search", {}), 403, "token_scope")


def test_a_search_reads_a_few_queries_per_thread_not_per_message(team, bot, run_queued):
    """Statuses, interrupts and the messages of every listed thread are read together; each
    thread costs only its branch and its line's ids."""
    member = lg_as(team.member)

    def cost():
        with CaptureQueriesContext(connection) as queries:
            listed = ok(member.post("/threads/search", {"limit": 100}))
        return len(listed), len(queries)

    for _ in range(2):
        run_turn(team.member, new_thread(member)["thread_id"], run_queued)
    two, before = cost()
    for _ in range(3):
        run_turn(team.member, new_thread(member)["thread_id"], run_queued, prompt="a longer run " * 5)
    five, after = cost()
    assert (two, five) == (2, 5)
    assert after - before <= 2 * 3, (before, after)


def in_test_transaction(handler):
    """A WSGI application serving each request with ``handler`` in this process and the test's
    transaction: as for the test client, a request's start and end do not close the test's
    database connection."""
    def app(environ, start_response):
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            response = handler(environ, start_response)
            body = b"".join(response)
            response.close()
            return [body]
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)

    return app


def test_langgraph_sdk_reads_assistants_threads_state_and_history_as_its_own(team, bot, run_queued):
    """The pinned ``langgraph-sdk``'s own client, over the real URL stack in this process (a WSGI
    transport: the test's rows are visible), parses what these routes answer; its errors are
    its own exceptions for the status Trellis answered."""
    _, raw = ApiToken.issue(team.member, name="sdk", scopes=TokenScope.values)
    client = SyncLangGraphClient(httpx.Client(transport=httpx.WSGITransport(app=in_test_transaction(get_wsgi_application())),
                                              base_url="http://testserver/lg", headers={"x-api-key": raw}))
    (assistant,) = client.assistants.search(graph_id="bot")
    assert client.assistants.get(assistant["assistant_id"])["graph_id"] == "bot"
    page = client.assistants.search(limit=1, response_format="object")
    assert page["next"] is None and len(page["assistants"]) == 1

    thread = client.threads.create(metadata={"project": "alpha", "topic": "sdk"}, graph_id="bot")
    assert set(Thread.__annotations__) - {"extracted"} <= set(thread)
    run_turn(team.member, thread["thread_id"], run_queued)
    state = client.threads.get_state(thread["thread_id"])
    assert set(ThreadState.__annotations__) <= set(state)
    assert [m["type"] for m in state["values"]["messages"]] == ["human", "ai", "tool", "ai"]
    first = state["values"]["messages"][0]["id"]
    assert client.threads.get_state(thread["thread_id"], checkpoint_id=first)["values"]["messages"][0]["id"] == first
    history = client.threads.get_history(thread["thread_id"], limit=2, before=state["checkpoint"])
    assert [h["checkpoint"]["checkpoint_id"] for h in history] == [
        m["id"] for m in state["values"]["messages"][1:3][::-1]]
    assert [t["thread_id"] for t in client.threads.search(metadata={"topic": "sdk"})] == [thread["thread_id"]]
    assert client.threads.update(thread["thread_id"], metadata={"stage": 2})["metadata"]["stage"] == 2

    with pytest.raises(NotFoundError):
        client.threads.get("0123456789ab")
    with pytest.raises(UnprocessableEntityError):
        client.threads.create(metadata={"project": "alpha"}, ttl=5)
    client.threads.delete(thread["thread_id"])
    assert not Session.objects.filter(pk=thread["thread_id"]).exists()
