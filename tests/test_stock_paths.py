"""Each bypass of framework behaviour gives the stock path's results (docs/infrastructure.md).

The same conversation — a user turn whose agent writes todos, spawns a background sub-agent
and answers; the sub-agent's result comes back as a follow-up turn; a second user turn — runs
once on Trellis's own paths and once with ``TRELLIS_STOCK`` naming a bypass, through the public
API, with the worker's part run in this process (``run_queued``). What is stored and what the
API answers (messages, executions with their statuses, versions, token counts and results,
events, branches), ids and times aside, is the same.
"""

import re

import pytest

from collab.models import Branch, Event, Job, Message

SCRIPT = {
    "user": [
        {"tool_calls": [{"name": "todo_write", "arguments": {"todos": [
            {"content": "look around", "status": "in_progress"}, {"content": "report", "status": "pending"}]}}]},
        {"tool_calls": [{"name": "agent", "arguments": {
            "prompt": "count the files", "description": "counter", "run_in_background": True}}]},
        {"text": "started {{last.details.execution_id}}"},
        {"text": "second answer"},
    ],
    "spawn": [{"text": "there are 3 files"}],
    "followup": [{"text": "noted the count"}],
}
_ID = re.compile(r"\b[0-9a-f]{12}\b")
_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ][\d:.+-]+Z?( UTC)?|\d+\xa0(second|minute|hour)s? ago|\d+(\.\d+)? s\b")


def _plain(value):
    """``value`` with ids and times made alike (the two runs' rows have their own)."""
    if isinstance(value, str):
        return _TIME.sub("<time>", _ID.sub("<id>", value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items()) if k not in ("created_at", "started_at", "finished_at",
                                                                            "updated_at", "lease_expires_at", "worker")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def conversation(api, sid, run_queued) -> dict:
    for prompt in ("first", "second"):
        assert api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).status_code == 202
        run_queued()
    sessions = [sid, *Job.objects.filter(caller_session_id=sid).values_list("session_id", flat=True)]
    jobs = Job.objects.filter(session_id__in=sessions).order_by("created_at", "id")
    return _plain({
        "messages": [(m.role, m.kind, m.text, m.tool_calls, m.depth)
                     for m in Message.objects.filter(session_id__in=sessions).order_by("created_at", "id")],
        "jobs": [(j.kind, j.status, j.version, j.tokens_in, j.tokens_out, str(j.cost), j.model_calls, j.tool_calls,
                  j.is_error, j.error_code, j.followup_state) for j in jobs],
        "events": [(e.type, e.seq) for e in Event.objects.filter(session_id=sid).order_by("seq")],
        "branches": sorted((b.name, b.archived) for b in Branch.objects.filter(session_id__in=sessions)),
        "executions": api.get("/api/executions", session=sid).json(),
        "session": api.get(f"/api/sessions/{sid}").json(),
        "transcript": api.get(f"/api/sessions/{sid}/events").json(),
    })


@pytest.mark.parametrize("stock", ["prepared", "prepared,push_loop"])
def test_a_conversation_stores_and_answers_the_same_on_the_stock_path(team, scripted_session, run_queued, settings,
                                                                       stock):
    api, own = scripted_session(team.member, SCRIPT, agent_id="own")
    ours = conversation(api, own, run_queued)
    settings.TRELLIS_STOCK = frozenset(stock.split(","))
    api, stock_sid = scripted_session(team.member, SCRIPT, agent_id="stock")
    theirs = conversation(api, stock_sid, run_queued)
    assert {j[0] for j in ours["jobs"]} == {"user", "spawn", "followup"}, ours["jobs"]
    assert {j[1] for j in ours["jobs"]} == {"succeeded"}, ours["jobs"]
    assert len(ours["messages"]) > 8, ours["messages"]
    for part in ours:
        assert _plain_agent(theirs[part]) == _plain_agent(ours[part]), part


def _plain_agent(value):
    """The two runs' specs are named ``own`` and ``stock``: the one difference allowed."""
    if isinstance(value, str):
        return value.replace("stock", "own")
    if isinstance(value, dict):
        return {k: _plain_agent(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_agent(v) for v in value]
    return value


def test_the_stock_path_is_taken_when_named(team, scripted_session, run_queued, settings, monkeypatch):
    """Control: with ``TRELLIS_STOCK=prepared`` no statement is compiled into the process's
    cache: every one is the ORM's, built at its call."""
    from collab.infra import prepared

    settings.TRELLIS_STOCK = frozenset({"prepared"})
    api, sid = scripted_session(team.member, SCRIPT, agent_id="stock")
    monkeypatch.setattr(prepared, "_STATEMENTS", {})
    conversation(api, sid, run_queued)
    assert prepared._STATEMENTS == {}


@pytest.mark.slow
@pytest.mark.one_database("sqlite")  # the middleware's and threads' effects, not the database's
def test_pages_and_the_api_answer_the_same_through_the_stock_middleware_and_request_threads(
        team, api_as, scripted_session, server, process_env, tmp_path):
    """The same requests to two daphne processes on one database — one on Trellis's own
    middleware and request threads, one with ``TRELLIS_STOCK=middleware,request_threads`` (Django's
    middleware classes, WhiteNoise's, asgiref's thread per request): the same statuses, the same
    headers (security headers, CSP, cookies' names and flags, cache headers), the same bodies
    but for tokens and times. A login with its CSRF token, a page, a form POST, API reads and a
    write, a ``?wait=`` that parks and wakes, a static file, a 404 and a refused CSRF POST."""
    from tests.conftest import _stop, free_port, start_daphne

    from accounts.models import ApiToken, TokenScope

    api, sid = scripted_session(team.member, [{"text": "ok"}])
    eid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "stays queued: no worker"}).json()["execution_id"]
    raw = ApiToken.issue(team.member, name="stock", scopes=TokenScope.values)[1]
    port = free_port()
    stock = start_daphne({**process_env, "TRELLIS_STOCK": "middleware,request_threads"}, port, tmp_path / "stock.log")
    from accounts.services import note_home_visit

    note_home_visit(team.member)  # both see a home page after a visit, not the first one's
    try:
        answers = [_exchange(url, sid, eid, raw, team) for url in (server.url, f"http://127.0.0.1:{port}")]
    finally:
        _stop(stock)
    ours, theirs = answers
    assert {a[0]: a[1] for a in ours} == {
        "login page": 200, "login": 302, "projects page": 200, "session page": 200, "csrf refused": 403,
        "static": 200, "missing page": 404, "api read": 200, "api 404": 404, "api bad body": 400,
        "api events": 200, "api wait that parks": 200}
    assert [a[0] for a in ours] == [a[0] for a in theirs]
    for mine, other in zip(ours, theirs):
        assert mine == other, (mine[0], mine, other)
    assert "Exception inside application" not in (tmp_path / "stock.log").read_text()


VOLATILE_HEADERS = {"date", "expires", "last-modified", "content-length", "set-cookie", "x-request-id", "server"}
_PORT = re.compile(r"127\.0\.0\.1:\d+")
_TOKENISH = re.compile(r"[A-Za-z0-9_\-]{32,}")


def _exchange(base: str, sid: str, eid: str, raw_token: str, team) -> list:
    """(what was asked, status, headers, cookies' names and flags, body made alike) for each request."""
    import httpx

    out = []
    with httpx.Client(base_url=base, timeout=60, follow_redirects=False) as web:
        def record(label, r):
            headers = sorted((k, _PORT.sub("<host>", v)) for k, v in r.headers.items() if k.lower() not in VOLATILE_HEADERS)
            cookies = sorted((c.split("=", 1)[0], ";".join(sorted(p.strip().split("=")[0].lower()
                                                                  for p in c.split(";")[1:])))
                             for c in r.headers.get_list("set-cookie"))
            body = r.text if not r.headers.get("content-type", "").startswith("image") else len(r.content)
            out.append((label, r.status_code, headers, cookies,
                        _plain(_TOKENISH.sub("<token>", _PORT.sub("<host>", str(body))))))

        login = web.get("/accounts/login/")
        record("login page", login)
        csrf = web.cookies.get("csrftoken")
        record("login", web.post("/accounts/login/", data={"username": team.member.username, "password": "pw-secret-123",
                                                          "csrfmiddlewaretoken": csrf}))
        record("projects page", web.get("/"))
        record("session page", web.get(f"/s/{sid}/"))
        record("csrf refused", web.post(f"/s/{sid}/turns", data={"prompt": "no token"}))
        record("static", web.get("/static/collab/app.css"))
        record("missing page", web.get("/no/such/page"))
        bearer = {"Authorization": f"Bearer {raw_token}"}
        record("api read", web.get(f"/api/sessions/{sid}", headers=bearer))
        record("api 404", web.get("/api/sessions/000000000000", headers=bearer))
        record("api bad body", web.post(f"/api/sessions/{sid}/turns", content=b"{", headers={
            **bearer, "Content-Type": "application/json"}))
        record("api events", web.get(f"/api/sessions/{sid}/events?after=0", headers=bearer))
        record("api wait that parks", web.get(f"/api/executions/{eid}?wait=1", headers=bearer))
    return out


def test_each_switch_named_in_trellis_stock_takes_the_stock_path(settings, monkeypatch):
    """Control for the switches whose stock path the tests named in docs/infrastructure.md compare:
    with the name set, the worker keeps django-q2's cluster name, a task is enqueued as its plain
    path, the Redis layer has no blocking sender, a plain thread's push goes through
    ``async_to_sync``, and django-q2's own Redis broker class is configured."""
    import os
    import subprocess
    import sys
    import threading

    import django_q.cluster

    from collab import brokers, worker_name
    from collab.realtime import push
    from collab.services.admission import RUN_TURN
    from collab.infra.channel_layer import RedisChannelLayer

    settings.TRELLIS_STOCK = frozenset(STOCK_NAMES)
    humanize = django_q.cluster.humanize
    monkeypatch.setattr(django_q.cluster, "humanize", humanize)
    worker_name.install()
    assert django_q.cluster.humanize is humanize

    sent = []
    monkeypatch.setattr(brokers, "async_task", lambda path, *args, **kwargs: sent.append(path))
    monkeypatch.setattr(brokers, "broker_in_database", lambda: True)
    brokers.hand_to_broker(RUN_TURN, "job")
    assert sent == ["collab.tasks.run_turn"] and type(sent[0]) is str

    assert RedisChannelLayer(hosts=["redis://127.0.0.1:1"]).blocking_sender is None
    settings.TRELLIS_STOCK = frozenset()
    assert RedisChannelLayer(hosts=["redis://127.0.0.1:1"]).blocking_sender is not None
    settings.TRELLIS_STOCK = frozenset(STOCK_NAMES)

    loops = []
    thread = threading.Thread(target=lambda: loops.append(push._push_loop(object())))
    thread.start()
    thread.join()
    assert loops == [None]

    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:6379/15", "DJANGO_SECRET_KEY": "x"}
    probe = "import django; django.setup(); from django.conf import settings; print(settings.Q_CLUSTER.get('broker_class'))"
    for stock, expected in (("brokers", "None"), ("", "collab.brokers.SharedRedis")):
        out = subprocess.run([sys.executable, "-c", probe], env={**env, "TRELLIS_STOCK": stock,
                                                                 "DJANGO_SETTINGS_MODULE": "config.settings"},
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == expected, (stock, out)


def test_an_unknown_stock_name_stops_the_process_at_start_up():
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import django; django.setup()"], capture_output=True, text=True,
                       env={**os.environ, "TRELLIS_STOCK": "prepared,no_such_path", "DJANGO_SECRET_KEY": "x",
                            "DJANGO_SETTINGS_MODULE": "config.settings"})
    assert r.returncode != 0 and "no_such_path" in r.stderr and "known are" in r.stderr


STOCK_NAMES = ("task_queue", "prepared", "request_threads", "middleware", "channel_layer", "push_loop", "brokers",
               "worker_name", "search_literals")


def test_every_stock_name_is_documented():
    from pathlib import Path

    from django.conf import settings

    doc = (Path(__file__).resolve().parent.parent / "docs" / "infrastructure.md").read_text()
    assert set(settings.STOCK_PATHS) == set(STOCK_NAMES)
    assert all(f"## `{name}`" in doc for name in settings.STOCK_PATHS), "each name has its entry"
