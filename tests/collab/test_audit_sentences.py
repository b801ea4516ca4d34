"""The audit page and the session's activity feed read as sentences
(docs/web-app.md#audit-and-activity-in-sentences): every event type has one, without Python's
repr; free text is redacted and escaped; the audit shows what an admin audits unless asked for
every event, and its JSON-lines export stays as it was; the feed tells a turn in one line."""

import json
import re

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts.models import Role
from accounts.policy import CAPABILITIES
from collab.events import record_project_event, send_event_on_commit, with_full_payloads
from collab.models import Branch, Event, Job, Session
from collab.runtime.loop import run_job
from collab.selectors.activity import activity_page
from collab.selectors.audit import ADMIN_EVENT_TYPES, event_record, project_events
from collab.selectors.sentences import KNOWN_TYPES, Names, event_sentence
from collab.services.archive import do_archive_branch
from tests.conftest import ROOT

REPR = re.compile(r"\{'|'\s*:|\bNone\b|\bTrue\b|\bFalse\b|\[\'")


def _run_turn(api, sid, prompt="first question") -> str:
    """A person's turn, run here to its end exactly as a worker would."""
    job = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).json()["execution_id"]
    run_job(job)
    return job


def _event(sid, type_, payload, actor=None) -> Event:
    with transaction.atomic():
        return send_event_on_commit(sid, type_, payload, actor=actor)


def _project_event(project, type_, payload, actor=None) -> Event:
    with transaction.atomic():
        return record_project_event(project.pk, type_, payload, actor=actor)


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _sentences(html: str) -> list[str]:
    return re.findall(r'<td class="sentence">(.*?)</td>', html, re.S)


def _export(client, slug="alpha", **query) -> list[dict]:
    r = client.get(reverse("collab:audit", args=[slug]), {"format": "jsonl", **query})
    assert r.status_code == 200
    return [json.loads(line) for line in b"".join(r.streaming_content).decode().splitlines()]


# --- every type -------------------------------------------------------------------------------


def _types_the_code_writes() -> set[str]:
    """The event types written by collab/ (a literal handed to the functions that log events) and
    those the contract lists (docs/contract.md#events, which names the ``job.*`` family written
    from a variable)."""
    found = set()
    call = re.compile(r"(?:send_event_on_commit|send_events_on_commit|deferred_event|record_project_event|"
                      r"send_job_event|_audit)\((?:[^()]|\([^()]*\))*?\"([a-z_]+\.[a-z_]+)\"", re.S)
    for path in (ROOT / "collab").rglob("*.py"):
        if "migrations" not in path.parts:
            found |= set(call.findall(path.read_text()))
    found |= {"token.created", "token.revoked"}  # written through _audit(token, type_, …) from a variable
    contract = (ROOT / "docs" / "contract.md").read_text()
    table = contract[contract.index("## Events"):contract.index("## HTTP API")]
    for cell in re.findall(r"^\| ([^|]+) \|", table, re.M):
        found |= set(re.findall(r"`([a-z_]+\.[a-z_]+)`", cell))
    return found


def test_every_event_type_the_code_writes_has_a_sentence():
    written = _types_the_code_writes()
    assert {"branch.archived", "job.succeeded", "member.invited", "webhook.secret_rotated"} <= written
    assert written - KNOWN_TYPES == set()
    assert set(ADMIN_EVENT_TYPES) <= KNOWN_TYPES


# payloads as the code writes them, with the values Python would print as None / False / {…}
SAMPLES = {
    "session.created": {"session": "s1", "title": "Plan launch", "agent_id": None, "branch": "b1"},
    "branch.created": {"branch": "b1", "name": "review", "name_stage": 3, "forked_from": None, "job": None},
    "branch.renamed": {"branch": "b1", "old": "", "name": "review"},
    "branch.archived": {"branch": "b1", "name": "review", "archived_at": "2026-01-01T00:00:00+00:00", "reason": "",
                        "automatic": False, "first": True},
    "branch.internal_changed": {"branch": "b1", "internal": False},
    "message.created": {"id": "m1", "address": "s1:m1", "branch": "b1", "predecessor": None, "role": "assistant",
                        "kind": "normal", "job": "j1", "tool_calls": [{"name": "agent", "arguments": {}}], "text": "x"},
    "message.delta": {"job": "j1", "branch": "b1", "call": 1, "text": "chunk"},
    "child.job": {"job": "j1", "status": "running", "version": 2, "kind": "spawn", "branch": "b1", "is_error": False,
                  "error_code": "", "state": "job.running", "session": "s2"},
    "agent.spawned": {"job": "j1", "session": "s1", "branch": "b1", "name": "researcher", "background": False,
                      "attach": None, "start_from": "clean"},
    "agent.interrupted": {"job": "j1", "task_name": "explorer", "command_id": "interrupt_agent:ab"},
    "delivery.sent": {"kind": "task", "from": "s1:m1", "to": "s1:m2", "target_branch": "b1", "job": None,
                      "inbox_entry": None},
    "delivery.received": {"kind": "message", "from": None, "to": "s1:m2", "target_branch": None, "job": "j1",
                          "inbox_entry": 4},
    "delivery.held": {"hold": 3, "kind": "message", "to": "s1:m2", "target_branch": "b1", "text_preview": "hi"},
    "delivery.approved": {"hold": 3, "job": None, "by": "alice"},
    "delivery.rejected": {"target_branch": "b1", "code": "archived", "text_preview": "hi"},
    "delivery.started": {"inbox_entry": 4, "job": "j1", "to": "s1:m2"},
    "inbox.queued": {"entry": 4, "target_branch": "b1", "from": "s1:m1"},
    "inbox.drained": {"branch": "b1", "jobs": ["j1", "j2"]},
    "inbox.dropped": {"target": "s1:m2", "target_branch": "b1", "text_preview": "old", "reason": "inbox full"},
    "followup.drained": {"job": "j1", "into": None},
    "followup.noticed": {"job": "j1", "caller_job": None},
    "followup.undeliverable": {"job": "j1", "code": "archived", "reason": "agent review is archived"},
    "execution.cancel_requested": {"job": "j1", "command_id": "c1", "cascaded": ["j2", "j3"]},
    "agents.listed": {"scope": "all", "by": "s1:m1", "sessions": 2, "session_ids": ["s1", "s2"]},
    "todo.created": {"todo": 1, "subject": "write tests"},
    "todo.updated": {"todo": 1, "status": "done"},
    "session.visibility_changed": {"session": "s1", "from": "project", "to": "private"},
    "session.metadata_changed": {"session": "s1", "keys": ["graph_id", "topic"]},
    "session.deleted": {"session": "s1", "title": "Plan launch"},
    "session.shared": {"username": "carol", "role": "viewer"},
    "session.unshared": {"username": "carol"},
    "model.retry": {"job": "j1", "branch": "b1", "provider": "openai", "attempt": 1, "max_retries": 3, "status": 429,
                    "code": "rate_limited", "reason": "slow down", "delay_ms": 500},
    "member.invited": {"username": "carol", "role": "member"},
    "member.accepted": {"username": "carol", "role": "member"},
    "member.declined": {"username": "carol", "role": "member"},
    "member.role_changed": {"username": "carol", "role": "maintainer"},
    "member.removed": {"username": "carol"},
    "member.invitation_cancelled": {"username": "carol"},
    "limits.changed": {"changes": {"max_messages": {"from": 8, "to": 12}, "max_cost_per_job": {"from": None, "to": "1.5"}}},
    "project.updated": {"name": "Beta", "watch_policy": "confirm_deliveries"},
    "workspace.changed": {"from": "", "to": "/srv/code"},
    "token.created": {"token": 7, "name": "ci", "user": "bob", "scopes": ["read", "write"], "expires_at": None,
                      "minted_by": None},
    "token.revoked": {"token": 7, "name": "", "user": "bob", "scopes": ["read"], "expires_at": None},
    "agent_spec.created": {"agent_id": "assistant"},
    "agent_spec.changed": {"agent_id": "assistant", "fields": ["model", "system_prompt"]},
    "agent_spec.deleted": {"agent_id": "assistant"},
    "webhook.created": {"webhook": 2, "host": "hooks.example.com", "active": False},
    "webhook.updated": {"webhook": 2, "active": False, "host": {"from": "a.example", "to": "b.example"}},
    "webhook.deleted": {"webhook": 2, "host": "hooks.example.com"},
    "webhook.secret_rotated": {"webhook": 2},
    "approval.requested": {"ask": 5, "kind": "approval", "job": "j1", "branch": "b1", "tool": "run_command",
                           "arguments": {"command": "ls"}, "question": "", "choices": [], "to": None, "expires_at": None},
    "question.asked": {"ask": 6, "kind": "question", "job": "j1", "branch": "b1", "tool": "ask_person",
                       "arguments": {}, "question": "Which one?", "choices": ["a", "b"], "to": "carol",
                       "expires_at": None},
    "approval.decided": {"ask": 5, "job": "j1", "tool": "run_command", "decision": "rejected", "by": "carol",
                         "reason": "not now"},
    "question.answered": {"ask": 6, "job": "j1", "tool": "ask_person", "decision": "answered", "by": "carol"},
    "ask.closed": {"ask": 5, "job": "j1", "status": "cancelled"},
    **{f"job.{status}": {"job": "j1", "status": status, "version": 3, "kind": "user", "branch": "b1",
                         "is_error": status == "failed", "error_code": "model_error" if status == "failed" else ""}
       for status in ("queued", "running", "stopping", "waiting", "succeeded", "failed", "cancelled", "interrupted")},
}


@pytest.mark.parametrize("type_", sorted(KNOWN_TYPES))
def test_each_event_type_reads_as_a_sentence_without_python_repr(type_):
    """Built from a payload like the code's (None, False, lists, nested dicts), with nothing of it
    in the database: the sentence is words, never ``{'key': …}``, ``None`` or ``False``."""
    sentence = event_sentence(type_, SAMPLES[type_], actor=None, session="s1", names=Names(project="alpha"))
    text = re.sub(r"<[^>]+>", "", sentence)
    assert text.strip() and not REPR.search(text), (type_, sentence)
    assert type_ not in text  # a sentence, not the code


def test_an_unknown_type_reads_as_key_value_pairs_in_json():
    sentence = event_sentence("robot.dance", {"moves": ["spin", None], "done": False, "note": "<b>x</b>"},
                              actor="bob", session=None, names=Names())
    assert "moves: [&quot;spin&quot;, null]" in sentence and "done: false" in sentence
    assert "&lt;b&gt;x&lt;/b&gt;" in sentence and "<b>x" not in sentence
    assert not REPR.search(re.sub(r"<[^>]+>", "", sentence))


def test_payload_values_of_an_unexpected_shape_still_read_as_words():
    """Old rows and future writers may put a list or an object where an id or a name was: the
    sentence writes it as JSON rather than failing."""
    odd = {"job": ["j1"], "branch": {"id": "b1"}, "session": [1], "kind": ["user"], "to": {"x": 1}, "name": [None]}
    names = Names(project="alpha")
    for type_ in sorted(KNOWN_TYPES):
        sentence = event_sentence(type_, odd, actor=None, session="s1", names=names)
        assert not REPR.search(re.sub(r"<[^>]+>", "", sentence)), (type_, sentence)


def test_the_sentences_link_what_they_name_and_escape_what_people_typed(team, scripted_session):
    """On the audit page, with the rows read: "member archived branch *review* in session *Plan
    launch*: reason", the branch linked to itself, the session to its page, the reason escaped."""
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    Session.objects.filter(pk=sid).update(title="Plan <launch>")
    branch = Branch.objects.get(session_id=sid, name="main")
    do_archive_branch(branch, user=team.member, reason="done <script>alert(1)</script>")
    html = _logged_in(team.maintainer).get(reverse("collab:audit", args=["alpha"])).content.decode()
    archived = next(s for s in _sentences(html) if "archived" in s)
    assert archived.startswith("member archived branch ")
    assert f'<a href="/s/{sid}/?branch={branch.pk}">main</a>' in archived
    assert f'in session <a href="/s/{sid}/" title="{sid}">Plan &lt;launch&gt;</a>' in archived
    assert archived.endswith(": done &lt;script&gt;alert(1)&lt;/script&gt;")
    assert "<script>" not in html


# --- redaction --------------------------------------------------------------------------------


def test_the_audit_blanks_what_names_a_session_the_reader_may_not_see(team, monkeypatch, scripted_session):
    """A maintainer who may not see a private session (``session.see_all`` raised to owner): an
    event of a session they see that names it — an agent spawned into it, an archive reason
    quoting its id and title, a token named after it — reads "another session", its name and id
    nowhere on the page; the owner, who sees it, reads them."""
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    hidden = Session.objects.create(project=team.alpha, title="Secret merger", visibility="private",
                                    created_by=team.member)
    hidden_branch = Branch.objects.create(session=hidden, name="secret-agent")
    _event(sid, "agent.spawned", {"job": None, "session": hidden.pk, "branch": hidden_branch.pk,
                                  "name": "secret-agent", "background": True}, actor=team.member)
    _event(sid, "branch.archived", {"branch": Branch.objects.get(session_id=sid).pk, "name": "main",
                                    "reason": f"moved to {hidden.pk} (Secret merger)", "automatic": False,
                                    "first": True}, actor=team.member)
    _project_event(team.alpha, "token.created", {"token": 1, "name": f"for {hidden.pk}", "user": "member",
                                                 "scopes": ["read"], "expires_at": None}, actor=team.member)
    monkeypatch.setitem(CAPABILITIES, "session.see_all", Role.OWNER)
    url = reverse("collab:audit", args=["alpha"]) + "?show=all"
    html = _logged_in(team.maintainer).get(url).content.decode()
    for secret in (hidden.pk, "Secret merger", "secret-agent"):
        assert secret not in html, secret
    sentences = " ".join(_sentences(html))
    assert "member spawned an agent in the background into another session" in sentences
    assert "moved to another session (another session)" in sentences
    assert "“for another session”" in sentences
    owners = _logged_in(team.owner).get(url).content.decode()
    assert "Secret merger" in owners and "secret-agent" in owners


# --- what the audit shows -----------------------------------------------------------------------


@pytest.fixture
def audited(team, scripted_session, make_user):
    """A turn (job and message events), an archive, an invitation: admin events and the rest."""
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    job = _run_turn(api, sid)
    branch = Branch.objects.get(session_id=sid, name="main")
    do_archive_branch(branch, user=team.member, reason="done")
    make_user("carol")
    _project_event(team.alpha, "member.invited", {"username": "carol", "role": "member"}, actor=team.owner)
    return sid, job


def test_the_audit_shows_what_an_admin_audits_and_every_event_behind_a_toggle(team, audited):
    sid, job = audited
    client = _logged_in(team.maintainer)
    url = reverse("collab:audit", args=["alpha"])
    default = client.get(url).content.decode()
    types = set(re.findall(r'<tr data-event="\d+" data-type="([^"]+)"', default))
    assert types == {"agent_spec.created", "session.created", "branch.archived", "member.invited"}, types
    assert 'href="?show=all" id="audit-toggle">Show every event</a>' in default
    assert 'href="?show=all&format=jsonl"' not in default and 'href="?format=jsonl"' in default
    every = client.get(url, {"show": "all"}).content.decode()
    all_types = set(re.findall(r'<tr data-event="\d+" data-type="([^"]+)"', every))
    assert {"job.queued", "job.running", "job.succeeded", "message.created", "branch.archived"} <= all_types
    assert 'href="?show=all&format=jsonl"' in every and '<input type="hidden" name="show" value="all">' in every
    assert 'href="?" id="audit-toggle">Show only what an admin audits</a>' in every
    for sentence in _sentences(every):
        assert not REPR.search(re.sub(r"<[^>]+>", "", sentence)), sentence
    # a type asked for is shown whatever the scope; a bad scope is a 400
    asked = client.get(url, {"type": "job."}).content.decode()
    assert set(re.findall(r'data-type="([^"]+)"', asked)) >= {"job.queued", "job.succeeded"}
    assert client.get(url, {"show": "some"}).status_code == 400


def test_the_pager_keeps_the_toggle(team, scripted_session):
    from collab.selectors.audit import PAGE_SIZE

    _, sid = scripted_session(team.member, [{"text": "answer"}])
    for i in range(PAGE_SIZE + 1):
        _event(sid, "todo.created", {"todo": i, "subject": f"task {i}"}, actor=team.member)
    client = _logged_in(team.maintainer)
    url = reverse("collab:audit", args=["alpha"])
    first = client.get(url, {"show": "all", "actor": "member"}).content.decode()
    assert 'href="?actor=member&amp;show=all&page=2">older</a>' in first
    assert 'href="?actor=member&amp;show=all&format=jsonl"' in first
    second = client.get(url, {"show": "all", "actor": "member", "page": 2}).content.decode()
    assert 'href="?actor=member&amp;show=all&page=1">newer</a>' in second
    assert f'member added a to-do in session <a href="/s/{sid}/" title="{sid}">test</a>: task 0' in second


def test_the_export_is_every_event_as_before_whatever_the_toggle(team, audited):
    """The JSON-lines export is a public format: every event matching the filters (not only the
    admin's), each record with the same keys and the whole payload — with or without ``show``."""
    sid, job = audited
    client = _logged_in(team.maintainer)
    lines = _export(client)
    assert lines == _export(client, show="all")
    expected = [json.loads(json.dumps(event_record(e), ensure_ascii=False))
                for e in with_full_payloads(project_events(team.alpha, viewer=team.maintainer))]
    assert lines == expected
    assert {tuple(sorted(line)) for line in lines} == {
        ("actor", "created_at", "id", "payload", "seq", "session", "type")}
    succeeded = next(line for line in lines if line["type"] == "job.succeeded")
    assert succeeded["payload"]["job"] == job and succeeded["payload"]["is_error"] is False
    assert {line["type"] for line in lines} >= {"job.queued", "message.created", "member.invited"}


def test_a_page_of_the_audit_costs_the_same_queries_with_more_sessions(team, scripted_session,
                                                                      django_assert_max_num_queries):
    client = _logged_in(team.maintainer)
    url = reverse("collab:audit", args=["alpha"])

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url, {"show": "all"}).status_code == 200
        return len(queries)

    api, sid = scripted_session(team.member, [{"text": "answer"}])
    _run_turn(api, sid)
    few = count()
    for i in range(3):
        other = api.post("/api/projects/alpha/sessions", {"title": f"more {i}", "agent_id": "bot"}).json()["id"]
        _run_turn(api, other)
        _event(other, "execution.cancel_requested", {"job": Job.objects.filter(session_id=other).first().pk,
                                                     "command_id": "c", "cascaded": []}, actor=team.member)
    assert count() == few
    with django_assert_max_num_queries(20):
        client.get(url, {"show": "all"})


# --- the activity feed --------------------------------------------------------------------------


def test_the_activity_feed_tells_a_turn_in_one_line_with_its_steps_folded(team, scripted_session):
    """Not a line per state change: one line for the turn — who asked which agent on which branch,
    how it ended and how long it took — at the place it was asked; its steps in its details."""
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    job_id = _run_turn(api, sid)
    session = Session.objects.get(pk=sid)
    page = activity_page(session, team.viewer)
    assert [r.type for r in page.rows] == ["turn", "session.created"]
    line = page.rows[0]
    job = Job.objects.get(pk=job_id)
    took = (job.finished_at - job.started_at).total_seconds()
    assert line.seq == Event.objects.get(session_id=sid, type="job.queued").seq
    assert line.sentence.startswith("member asked <code>bot</code> on ")
    assert f'<a href="/s/{sid}/?branch={job.branch_id}">main</a>' in line.sentence
    assert f"succeeded in {took:.1f} s" in line.sentence
    assert "asked by   member" in line.payload_json and f"execution  {job_id}" in line.payload_json
    assert "ended" in line.payload_json and "(succeeded)" in line.payload_json
    assert line.payload_json.count("\n") < 12
