"""Bad input is a 4xx with a reason, never a 500 (docs/contract.md#http-api).

Every probe — a lone surrogate or a NUL in string fields, ``Infinity`` /
``1e400`` as a number, NUL and malformed ids / versions / dates in paths, forms and query
strings, OpenWork task names with a trailing newline — on every API route and page, on
PostgreSQL and on SQLite. API errors have the ``{"detail", "code"}`` shape; pages answer a
400/404 page.
"""

import json

import pytest

from collab.models import Branch, Job, Session
from collab.text import REPLACEMENT

NUL, SURROGATE = "\x00", "\ud800"
ERROR_KEYS = {"detail", "code"}


@pytest.fixture
def world(team, api_as, client):
    """A member's session with one turn (queued: no worker), its address, an OpenWork root with
    its address, and the browser logged in as the member."""
    owner, api = api_as(team.owner), api_as(team.member)
    assert owner.post("/api/projects/alpha/agent-specs", {"agent_id": "bot"}).status_code == 201
    assert owner.post("/api/projects/alpha/agent-specs", {"agent_id": "ow", "toolset": "openwork"}).status_code == 201
    sid = api.post("/api/projects/alpha/sessions", {"title": "s", "agent_id": "bot"}).json()["id"]
    eid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).json()["execution_id"]
    head = api.get(f"/api/sessions/{sid}").json()["head"]
    ow_sid = api.post("/api/projects/alpha/sessions", {"title": "ow", "agent_id": "ow"}).json()["id"]
    assert api.post(f"/api/sessions/{ow_sid}/turns", {"prompt": "go"}).status_code == 202
    ow_head = api.get(f"/api/sessions/{ow_sid}").json()["head"]
    client.force_login(team.member)
    return type("World", (), dict(owner=owner, api=api, sid=sid, eid=eid, head=head, address=f"{sid}:{head}",
                                  ow=f"{ow_sid}:{ow_head}", ow_sid=ow_sid, client=client))


def answer(response) -> dict:
    """Never a 500; a 4xx API answer carries exactly the error shape."""
    assert response.status_code < 500, (response.status_code, response.content[:500])
    if response.status_code >= 400 and response["Content-Type"].startswith("application/json"):
        body = response.json()
        assert ERROR_KEYS <= set(body) and body["detail"] and body["code"], body
        return body
    return {}


def raw_post(api, path, raw, method="post"):
    client = api.client
    return getattr(client, method)(path, raw, content_type="application/json", **api.headers)


# --- API: a lone surrogate or a NUL in every string field -------------------------------------------


def string_bodies(w, bad):
    """(method, path, body) for every API route that takes strings, with ``bad`` in each field."""
    return [
        ("post", "/api/projects", {"slug": f"g{bad}", "name": "x"}),
        ("post", "/api/projects", {"slug": "gamma", "name": f"n{bad}"}),
        ("patch", "/api/projects/alpha", {"name": f"n{bad}"}),
        ("patch", "/api/projects/alpha", {"watch_policy": f"off{bad}"}),
        ("post", "/api/projects/alpha/agent-specs", {"agent_id": f"a{bad}"}),
        ("post", "/api/projects/alpha/agent-specs", {"agent_id": "s1", "system_prompt": f"p{bad}",
                                                     "script": [{"text": f"t{bad}"}], "limits": {f"k{bad}": 1}}),
        ("post", "/api/projects/alpha/agent-specs", {"agent_id": "s2", "provider": f"scripted{bad}"}),
        ("post", "/api/projects/alpha/agent-specs", {"agent_id": "s3", "api_key_env": f"KEY{bad}"}),
        ("post", "/api/projects/alpha/sessions", {"title": f"t{bad}", "agent_id": "bot"}),
        ("post", "/api/projects/alpha/sessions", {"title": "t", "agent_id": f"bot{bad}"}),
        ("post", f"/api/sessions/{w.sid}/turns", {"prompt": f"p{bad}"}),
        ("post", f"/api/sessions/{w.sid}/turns", {"prompt": "p", "branch": f"{w.address}{bad}"}),
        ("post", f"/api/sessions/{w.sid}/turns", {"prompt": "p", "agent_id": f"bot{bad}"}),
        ("post", f"/api/executions/{w.eid}/commands", {"command_id": f"c{bad}", "action": "execution.cancel",
                                                       "expected_version": 99, "payload": {}}),
        ("post", f"/api/executions/{w.eid}/commands", {"command_id": "c", "action": f"execution.cancel{bad}",
                                                       "expected_version": 1, "payload": {f"k{bad}": "v"}}),
        ("post", f"/api/branches/{w.address}/archive", {"reason": f"r{bad}"}),
        ("post", f"/api/branches/{w.address}/tools/todo_create", {"arguments": {"subject": f"s{bad}", "description": bad}}),
        ("post", f"/api/branches/{w.address}/tools/send_message", {"arguments": {"to": f"x{bad}", "message": f"m{bad}"}}),
        ("post", f"/api/branches/{w.address}/tools/read_conversation", {"arguments": {"session_id": f"{w.sid}{bad}"}}),
        ("post", f"/api/branches/{w.address}/tools/agent", {"arguments": {"prompt": f"p{bad}", "description": f"d{bad}",
                                                                         "run_in_background": True}}),
        ("post", f"/api/branches/{w.address}/tools/list_agents", {"arguments": {"scope": "all", "source": bad}}),
        ("post", f"/api/branches/{w.ow}/tools/spawn_agent", {"arguments": {"task_name": f"t{bad}", "message": f"m{bad}"}}),
        ("post", f"/api/branches/{w.ow}/tools/followup_task", {"arguments": {"task_name": f"t{bad}", "message": "m"}}),
        ("post", "/api/projects/alpha/members", {"username": f"u{bad}", "role": "member"}),
        ("post", "/api/projects/alpha/members", {"username": "viewer", "role": f"member{bad}"}),
        ("post", "/api/tokens", {"name": f"n{bad}"}),
    ]


@pytest.mark.parametrize("bad", [SURROGATE, NUL, "\udfff" * 3], ids=["surrogate", "nul", "low-surrogates"])
def test_no_api_string_field_answers_500_for_nul_or_a_lone_surrogate(world, bad):
    """Each route answers 2xx (stored with U+FFFD) or a 4xx error with a code."""
    for method, path, body in string_bodies(world, bad):
        r = raw_post(world.owner, path, json.dumps(body), method)  # the owner may call every route
        answer(r)
        if r.status_code < 300:
            assert NUL not in r.content.decode("utf-8") and "\\u0000" not in r.content.decode(), (path, r.content)
            assert "\\ud800" not in r.content.decode() and "\\udfff" not in r.content.decode(), (path, r.content)


def test_what_is_stored_from_bad_strings_reads_back_with_the_replacement(world):
    api = world.api
    r = api.post("/api/projects/alpha/sessions", {"title": f"a{SURROGATE}b{NUL}c", "agent_id": "bot"})
    assert r.status_code == 201 and r.json()["title"] == f"a{REPLACEMENT}b{REPLACEMENT}c"
    r = world.owner.post("/api/projects/alpha/agent-specs", {"agent_id": "nulspec", "script": [{"text": f"t{NUL}"}],
                                                              "limits": {f"k{SURROGATE}": 1}})
    assert r.status_code == 201, r.content
    assert r.json()["script"] == [{"text": f"t{REPLACEMENT}"}] and r.json()["limits"] == {f"k{REPLACEMENT}": 1}
    r = api.post(f"/api/branches/{world.address}/archive", {"reason": f"done{NUL}"})
    assert r.status_code == 200 and r.json()["archive_reason"] == f"done{REPLACEMENT}"


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e400", "-1e400"])
def test_a_non_finite_number_is_a_400_not_a_500(world, literal):
    """``Infinity`` (or a float literal too large for a float) as a limit or any number."""
    owner, api, w = world.owner, world.api, world
    probes = [
        (owner, "patch", "/api/projects/alpha/limits", '{"max_messages": %s}' % literal),
        (owner, "patch", "/api/projects/alpha/limits", '{"max_cost_per_job": %s}' % literal),
        (owner, "patch", "/api/projects/alpha/limits", '{"max_active_turns": %s}' % literal),
        (api, "post", f"/api/executions/{w.eid}/commands",
         '{"command_id": "c", "action": "execution.cancel", "expected_version": %s, "payload": {}}' % literal),
        (api, "post", f"/api/branches/{w.address}/tools/list_agents", '{"arguments": {"limit": %s}}' % literal),
        (api, "post", f"/api/branches/{w.address}/tools/read_conversation",
         '{"arguments": {"session_id": "%s", "max_chars": %s}}' % (w.address, literal)),
        (api, "post", f"/api/branches/{w.address}/tools/job_output",
         '{"arguments": {"job_id": "%s", "timeout": %s, "block": false}}' % (w.eid, literal)),
        (api, "post", f"/api/branches/{w.ow}/tools/wait_agent", '{"arguments": {"timeout_ms": %s}}' % literal),
    ]
    for client, method, path, raw in probes:
        r = raw_post(client, path, raw, method)
        body = answer(r)
        assert r.status_code in (400, 422), (path, r.status_code, r.content)
        assert body["code"] in ("invalid_request", "malformed_request"), body
    assert world.owner.get("/api/projects/alpha/limits").json()["max_messages"] == 8


def test_nul_and_junk_in_api_paths_and_query_strings_are_4xx(world):
    """A NUL (``%00``), an over-long id or a huge number in a path or query string."""
    api, w = world.api, world
    junk = ["%00", "a%00b", "x" * 300, "%F0%9F%98%80", "%ED%A0%80", "..", "99999999999999999999999"]
    for bit in junk:
        for path in [f"/api/sessions/{bit}", f"/api/sessions/{bit}/branches", f"/api/sessions/{bit}/events",
                     f"/api/sessions/{bit}/holds", f"/api/executions/{bit}", f"/api/artifacts/{bit}",
                     f"/api/branches/{bit}/transcript", f"/api/projects/{bit}", f"/api/projects/{bit}/limits",
                     f"/api/projects/{bit}/members"]:
            assert answer(api.get(path)) is not None
            assert api.get(path).status_code in (404, 422), (path, api.get(path).status_code)
        for path in [f"/api/executions/{bit}/commands", f"/api/branches/{bit}/archive",
                     f"/api/branches/{bit}/tools/todo_list", f"/api/sessions/{bit}/turns",
                     f"/api/holds/{bit}/approve", f"/api/projects/{bit}/sessions"]:
            r = api.post(path, {"prompt": "p", "command_id": "c", "action": "execution.cancel", "expected_version": 1})
            answer(r)
            assert 400 <= r.status_code < 500, (path, r.status_code)
        answer(api.delete(f"/api/tokens/{bit}"))
        answer(api.delete(f"/api/projects/alpha/members/{bit}"))
    for params in [{"session": "\x00"}, {"session": w.sid, "status": "\x00"}, {"session": w.sid, "limit": "Infinity"},
                   {"session": w.sid, "limit": "-5"}, {"session": w.sid, "limit": "9" * 30}]:
        answer(api.get("/api/executions", **params))
    for params in [{"after": "\x00"}, {"after": "9" * 30}, {"after": "-1"}, {"limit": "NaN"}]:
        answer(api.get(f"/api/sessions/{w.sid}/events", **params))
    for params in [{"start_turn": "9" * 30}, {"end_turn": "-" + "9" * 30}, {"max_chars": "Infinity"},
                   {"include_function_calls": "\x00"}]:
        answer(api.get(f"/api/branches/{w.address}/transcript", **params))
    answer(api.get(f"/api/sessions/{w.sid}/branches", scope="\x00"))
    answer(api.get(f"/api/sessions/{w.sid}/holds", status="\x00"))
    answer(api.get(f"/api/executions/{w.eid}", wait="Infinity"))


# --- pages: forms and query strings ----------------------------------------------------------------


def test_pages_answer_400_or_404_for_nul_bad_versions_ids_and_dates(world, team):
    """The 11 pages probed: ``/s/…/turns``, fork, new session, token name, ``?branch=``, ``?head=``,
    audit filters (incl. bad dates), cancel with a bad version — never a 500; text fields store
    U+FFFD."""
    c, w = world.client, world
    ok_or_redirect = (200, 302)

    r = c.post(f"/s/{w.sid}/turns", {"prompt": f"page{NUL}prompt"})
    assert r.status_code in ok_or_redirect + (400,), r.status_code  # 400: a turn is already queued? never 500
    r = c.post(f"/s/{w.sid}/turns", {"prompt": "x", "branch": f"{w.address}{NUL}"})
    assert r.status_code == 404
    r = c.post(f"/s/{w.sid}/m/{w.head}%00/fork", {"prompt": "x"})
    assert r.status_code == 404
    r = c.post(f"/s/{w.sid}%00/m/{w.head}/fork", {"prompt": "x"})
    assert r.status_code == 404
    r = c.post(f"/s/{w.sid}/m/{w.head}/fork", {"prompt": f"fork{NUL}"})
    assert r.status_code == 302
    assert "fork\ufffd" in [j.prompt_text for j in Job.objects.select_related("prompt_msg")]

    r = c.post("/p/alpha/sessions", {"title": f"page{NUL}title"})
    assert r.status_code == 302 and Session.objects.filter(title="page\ufffdtitle").exists()
    r = c.post("/p/alpha/sessions", {"title": "t" * 201})
    assert r.status_code == 400
    r = c.post("/p/alpha/sessions", {"title": "t", "agent_id": f"bot{NUL}"})
    assert r.status_code == 404
    r = c.post("/account/tokens", {"name": f"tok{NUL}en"})
    assert r.status_code == 200

    for query in [f"branch={NUL}", "branch=%00", "head=%00", "branch=" + "x" * 500, "head=" + "y" * 500,
                  f"branch={w.sid}%00&head=%00"]:
        for page in (f"/s/{w.sid}/", f"/s/{w.sid}/transcript"):
            r = c.get(f"{page}?{query}")
            assert r.status_code in (200, 404), (page, query, r.status_code)
    assert c.get(f"/s/{w.sid}%00/").status_code == 404

    client = type(c)()
    client.force_login(team.owner)  # the audit page is for maintainers and owners
    for query in ["since=2026-13-45T00:00:00", "until=2026-02-30T10:00:00Z", "since=garbage", "until=%00",
                  "since=9999-12-31T23:59:59%2B99:00"]:
        r = client.get(f"/p/alpha/audit?{query}")
        assert r.status_code == 400, (query, r.status_code)
    for query in ["session=%00", "actor=%00", "type=%00", "type=job.%00", "page=%00", "page=-1", "session=" + "z" * 300,
                  "format=jsonl&actor=%00"]:
        r = client.get(f"/p/alpha/audit?{query}")
        assert r.status_code == 200, (query, r.status_code)
        if "jsonl" in query:
            b"".join(r.streaming_content)

    for version in ["abc", "1.5", "%00", "Infinity"]:
        r = c.post(f"/s/{w.sid}/jobs/{w.eid}/cancel", {"version": version.replace("%00", NUL)})
        assert r.status_code == 400, (version, r.status_code)
    r = c.post(f"/s/{w.sid}/jobs/{w.eid}%00/cancel", {"version": "1"})
    assert r.status_code == 404
    assert client.post("/p/alpha/limits", {"max_messages": "Infinity"}).status_code == 400
    assert client.post("/p/alpha/limits", {"max_cost_per_job": "NaN"}).status_code == 400
    assert client.post("/p/alpha/members", {"action": "add", "username": f"x{NUL}"}).status_code in (400, 404)
    assert client.post("/p/alpha/settings", {"watch_policy": f"off{NUL}"}).status_code == 400


# --- OpenWork task names: full matches, agreeing with the database ---------------------------------------


@pytest.mark.parametrize("name", ["find_auth\n", "a" * 48 + "\n", "a" * 47 + "\n", "\nfind_auth", "find\nauth",
                                  "find_auth\x00", "find_auth\ud800", "a" * 49])
def test_a_task_name_with_a_trailing_newline_is_invalid_on_both_databases(world, name):
    """``re.match(...$)`` accepted ``"find_auth\\n"`` (SQLite stored it,
    PostgreSQL refused it, 48 characters + ``\\n`` crashed the parent turn); now a full match
    refuses it as ``invalid_task_name`` before anything is written."""
    before = (Session.objects.count(), Branch.objects.count(), Job.objects.count())
    r = world.api.post(f"/api/branches/{world.ow}/tools/spawn_agent", {"arguments": {"task_name": name, "message": "m"}})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["is_error"] and body["details"]["code"] == "invalid_task_name", body
    assert body["text"].startswith("invalid_task_name: ")
    assert (Session.objects.count(), Branch.objects.count(), Job.objects.count()) == before


@pytest.mark.parametrize("name", ["find_auth\n", "a" * 47 + "\n"])
def test_the_database_check_agrees_with_the_full_match(world, name):
    """The CHECKs backing the task_name format refuse a trailing newline on SQLite as on
    PostgreSQL (``\\A…\\Z``, never ``^…$``)."""
    from django.db import IntegrityError, transaction

    root = Session.objects.get(pk=world.ow_sid)
    with pytest.raises(IntegrityError), transaction.atomic():
        Session.objects.create(project=root.project, parent_session=root, agent_role="explorer", task_name=name)
    child = Session.objects.create(project=root.project, parent_session=root, agent_role="explorer", task_name="ok")
    with pytest.raises(IntegrityError), transaction.atomic():
        Branch.objects.create(session=child, task_name=name, parent_branch=Branch.objects.get(session=root))
