"""One boundary for text (docs/contract.md#results, its last paragraph).

Everything stored passes ``collab.text.clean_text``: NUL and lone surrogates — which
PostgreSQL cannot store and SQLite can — become U+FFFD, so both databases hold the same
thing and no turn ends on a database error. Proved through the API, the tool gateway and
real worker turns (scripted, an OpenAI-compatible model over local HTTP, a sandboxed
``bash`` in a real workspace); every test here runs on PostgreSQL and on SQLite.
"""

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collab.models import Event, Job, Message, Session, Todo
from collab.text import REPLACEMENT, clean_data, clean_text
from tests.collab.fake_llm import OpenAIDialect
from tests.collab.test_providers import KEY_ENV, MODEL, fake, fake_server, operator_connection  # noqa: F401 (fixtures)
from tests.conftest import TERMINAL

NUL, SURROGATE = "\x00", "\ud800"
# text with what PostgreSQL refuses mixed into ordinary and astral characters
UNSAFE_TEXT = st.text(
    alphabet=st.one_of(st.sampled_from([NUL, SURROGATE, "\udfff", "\udc80", "a", "é", "😀", "\n"]), st.characters()),
    max_size=60,
)


def unstorable(value) -> bool:
    """Whether any string in a JSON-shaped value still holds a NUL or a lone surrogate."""
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return any(ch == NUL or 0xD800 <= ord(ch) <= 0xDFFF for ch in text) or "\\u0000" in text


# --- the sanitizer --------------------------------------------------------------------------------


@given(UNSAFE_TEXT)
def test_clean_text_replaces_exactly_the_unstorable_characters(text):
    """Each NUL or lone surrogate becomes one U+FFFD; every other character is kept, in
    place; cleaning twice changes nothing; the result encodes as UTF-8."""
    cleaned = clean_text(text)
    assert len(cleaned) == len(text)
    for before, after in zip(text, cleaned):
        bad = before == NUL or 0xD800 <= ord(before) <= 0xDFFF
        assert after == (REPLACEMENT if bad else before)
    assert clean_text(cleaned) == cleaned
    cleaned.encode("utf-8")  # a lone surrogate would raise here


@given(st.recursive(UNSAFE_TEXT | st.integers() | st.booleans() | st.none(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(UNSAFE_TEXT, inner, max_size=4),
                    max_leaves=12))
def test_clean_data_cleans_every_string_of_a_json_value_keys_included(value):
    cleaned = clean_data(value)
    assert not unstorable(cleaned)
    assert json.loads(json.dumps(cleaned)) == cleaned


# --- the API: every string field, both databases --------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(title=UNSAFE_TEXT, subject=UNSAFE_TEXT.filter(lambda s: clean_text(s).strip()))
def test_api_string_fields_store_the_replacement_character(team, api_as, title, subject):
    """A session title and a todo subject carrying NULs and lone surrogates (sent as
    JSON escapes) are accepted and stored with U+FFFD — never a 500 — and read back the same
    through the API; the events recording them are clean too."""
    api = api_as(team.member)
    r = api.post("/api/projects/alpha/sessions", {"title": title})
    assert r.status_code == 201, r.content
    sid = r.json()["id"]
    assert r.json()["title"] == clean_text(title).strip() == Session.objects.get(pk=sid).title
    assert api.get(f"/api/sessions/{sid}").json()["title"] == clean_text(title).strip()

    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": f"plan {title}"}).status_code == 202
    head = api.get(f"/api/sessions/{sid}").json()["head"]
    body = api.post(f"/api/branches/{sid}:{head}/tools/todo_create",
                    {"arguments": {"subject": subject, "description": title}}).json()
    assert not body["is_error"], body
    todo = Todo.objects.get(session_id=sid)
    assert (todo.subject, todo.description) == (clean_text(subject).strip()[:300], clean_text(title))
    listed = api.post(f"/api/branches/{sid}:{head}/tools/todo_list", {"arguments": {}}).json()
    assert clean_text(subject).strip()[:300] in listed["text"] and not unstorable(listed)
    assert Message.objects.get(session_id=sid, role="user").text == clean_text(f"plan {title}")
    assert not any(unstorable(p) for p in Event.objects.filter(session_id=sid).values_list("payload", flat=True))


def test_a_token_name_and_a_project_name_keep_a_visible_replacement(team, api_as, client):
    """API and page alike store a token name with NUL / surrogate replaced."""
    api = api_as(team.member)
    r = api.post("/api/tokens", {"name": f"ci{NUL}bot{SURROGATE}"})
    assert r.status_code == 201, r.content
    assert r.json()["name"] == f"ci{REPLACEMENT}bot{REPLACEMENT}"
    client.force_login(team.member)
    r = client.post("/account/tokens", {"name": "page\x00token"})
    assert r.status_code == 200
    assert "page\ufffdtoken" in r.content.decode()
    r = api.post("/api/projects", {"slug": "gamma", "name": f"nul{NUL}byte"})
    assert r.status_code == 201 and r.json()["name"] == f"nul{REPLACEMENT}byte", r.content


# --- real turns: scripted model, OpenAI-compatible model, sandboxed bash -----------------------------


def assert_clean_and_terminal(api, sid, execution_id, status="succeeded"):
    """The turn ended (never left running) and nothing stored in its session holds NUL or a
    lone surrogate (messages, tool calls, metadata, events, the job's texts)."""
    done = api.wait(execution_id, statuses=TERMINAL, timeout=60)
    assert done["status"] == status, done
    for m in Message.objects.filter(session_id=sid):
        assert not unstorable([m.text, m.tool_calls, m.metadata, m.tool_call_id]), m.pk
    assert not any(unstorable(p) for p in Event.objects.filter(session_id=sid).values_list("payload", flat=True))
    job = Job.objects.get(pk=execution_id)
    assert not unstorable([job.prompt_text, job.result, job.error_reason])
    return done


@pytest.mark.slow
def test_nul_in_a_prompt_a_tool_argument_a_tool_result_and_a_final_text_ends_the_turn(team, api_as, worker):
    """A prompt with NUL and a lone surrogate, a scripted todo_create whose
    subject has both, todo_list reading it back and a final text echoing it: the worker's turn
    succeeds on both databases, and everything is stored with U+FFFD."""
    owner, api = api_as(team.owner), api_as(team.member)
    script = [
        {"tool_calls": [{"name": "todo_create", "arguments": {"subject": f"sub{NUL}ject{SURROGATE}"}}]},
        {"tool_calls": [{"name": "todo_list", "arguments": {}}]},
        {"text": f"final{NUL}{SURROGATE} {{{{last.text}}}} / {{{{prompt}}}}"},
    ]
    r = owner.post("/api/projects/alpha/agent-specs", {"agent_id": "nul", "script": script})
    assert r.status_code == 201, r.content
    sid = api.post("/api/projects/alpha/sessions", {"title": f"t{NUL}", "agent_id": "nul"}).json()["id"]
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": f"find -print0{NUL}out{SURROGATE}"})
    assert r.status_code == 202, r.content
    done = assert_clean_and_terminal(api, sid, r.json()["execution_id"])

    assert Todo.objects.get(session_id=sid).subject == "sub\ufffdject\ufffd"
    final = Message.objects.get(job_id=done["id"], role="assistant", metadata__final=True).text
    assert final.startswith("final\ufffd\ufffd ") and "sub\ufffdject\ufffd" in final
    assert final.endswith("find -print0\ufffdout\ufffd")
    assert done["result"] == final


def openai_session(team, api_as, fake, stream):  # noqa: F811 (the fixture imported above)
    """Through the API: an OpenAI-compatible AgentSpec aimed at the fake model server, and a
    member's session with it. Returns (member's api client, sid)."""
    owner = api_as(team.owner)
    operator_connection("text-llm", "openai", OpenAIDialect.base_url(fake), KEY_ENV["openai"])
    r = owner.post("/api/projects/alpha/agent-specs", {
        "agent_id": "oai", "provider": "openai", "model": MODEL, "connection": "text-llm",
        "limits": {"stream": stream}})
    assert r.status_code == 201, r.content
    api = api_as(team.member)
    return api, api.post("/api/projects/alpha/sessions", {"title": "llm", "agent_id": "oai"}).json()["id"]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_model_output_with_nul_and_surrogates_is_stored_replaced(team, api_as, fake, worker, stream):  # noqa: F811
    """A model's answer and its tool-call arguments and ids carrying NUL and lone
    surrogates (JSON escapes on the wire, as a real server may send them) reach the database as
    U+FFFD on both databases; the turn succeeds (before: internal_error, or a job left running
    until reconcile on PostgreSQL)."""
    api, sid = openai_session(team, api_as, fake, stream)
    fake.add(
        OpenAIDialect.tools([(f"call{NUL}{SURROGATE}" + "x" * 150, "todo_create", {"subject": f"m{NUL}o{SURROGATE}del"})],
                            text=f"thinking{NUL}", stream=stream),
        OpenAIDialect.text(f"answer{NUL}with{SURROGATE}surrogate", stream=stream),
    )
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"})
    done = assert_clean_and_terminal(api, sid, r.json()["execution_id"])
    assert done["result"] == "answer\ufffdwith\ufffdsurrogate"
    assert Todo.objects.get(session_id=sid).subject == "m\ufffdo\ufffddel"
    call = Message.objects.get(job_id=done["id"], role="assistant", tool_calls__isnull=False)
    assert call.text == "thinking\ufffd"
    assert call.tool_calls[0]["arguments"] == {"subject": "m\ufffdo\ufffddel"}
    result = Message.objects.get(job_id=done["id"], role="tool")
    assert result.tool_call_id.startswith("call\ufffd\ufffdxxx") and len(result.tool_call_id) == 100


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is needed for the sandboxed bash")
def test_bash_output_with_nul_and_non_utf8_file_names_end_an_explorer_turn(team, api_as, run_queued, tmp_path):
    """``printf 'a\\0b'`` (like ``find -print0``) in the sandboxed bash, and
    ``list``/``glob``/``grep`` over a file whose name is not UTF-8, inside a real OpenWork turn:
    the results are stored with U+FFFD and the turn succeeds on both databases."""
    from io import StringIO

    from django.core.management import call_command

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "ok.txt").write_text("needle here\n")
    with open(os.path.join(os.fsencode(workspace), b"bad\xffname.txt"), "wb") as f:
        f.write(b"needle in a badly named file\n")
    call_command("workspace", "alpha", str(workspace), stdout=StringIO())

    owner, api = api_as(team.owner), api_as(team.member)
    script = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "printf 'a\\0b'; find . -print0"}},
                        {"name": "list", "arguments": {}},
                        {"name": "glob", "arguments": {"pattern": "*.txt"}},
                        {"name": "grep", "arguments": {"pattern": "needle"}}]},
        {"text": "done"},
    ]
    r = owner.post("/api/projects/alpha/agent-specs", {"agent_id": "ws", "script": script, "toolset": "openwork"})
    assert r.status_code == 201, r.content
    sid = api.post("/api/projects/alpha/sessions", {"title": "ws", "agent_id": "ws"}).json()["id"]
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "look around"})
    done = assert_clean_and_terminal(api, sid, r.json()["execution_id"])
    results = {m.metadata["tool"]: m for m in Message.objects.filter(job_id=done["id"], role="tool")}
    assert not results["bash"].metadata["is_error"], results["bash"].text
    assert "a\ufffdb" in results["bash"].text and "bad\ufffdname.txt" in results["bash"].text
    for name in ("list", "glob", "grep"):
        assert "bad\ufffdname.txt" in results[name].text and not results[name].metadata["is_error"], results[name].text
    assert "ok.txt" in results["list"].text
