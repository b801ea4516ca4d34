"""Nothing a member reads names a session hidden from them (docs/contract.md#visibility).

The same crossing as ``test_visibility_references``: the creator's private session P and the
project-wide session B reach into each other through their agents. On top of it, what an agent
in B writes names P freely — a model's final answer (an execution's ``result``) quoting P's
address, its branch name and one of its executions, a message sent into B whose header reads
``[message from P:…]``, a follow-up naming P. Then every GET page of the web app and every GET
route of the API, with B's rows in its parameters (each branch of B, a replay, the graph, the
partials), is read as the colleague — a member who may read B but not P — and scanned for P's
id, title, branch name and row ids. A route whose parameter the scan cannot fill fails the
scan: a new route is scanned or the test says so.
"""

import json
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from collab.models import Branch, Job, Message
from tests.collab.test_authorization import PAGE_PATTERNS, ROUTES, bearer_token, call_api, logged_in
from tests.collab.test_visibility_references import (  # noqa: F401 - the fixture
    SECRET_NAME,
    SECRET_TITLE,
    cross,
    crossing,
    head,
    leaked,
    secrets_of,
)

STREAMS = {"/api/executions/{execution_id}/stream"}  # an open stream: its events are the socket's (scanned there)
NOT_READ_BY_A_MEMBER = ("/api/admin",)  # staff routes: a member gets 403 and nothing else


def _fill(route: str, values: dict) -> str:
    def one(match):
        name = match.group(1)
        assert name in values, f"the visibility scan cannot fill {{{name}}} in {route}: add it to the scan"
        return str(values[name])

    return re.sub(r"[{<](?:\w+:)?(\w+)[}>]", one, route)


def _page_route(name: str) -> str:
    from collab import urls

    pattern = next(p for p in urls.urlpatterns if p.name == name)
    return "/" + str(pattern.pattern)


def test_no_page_or_route_a_member_reads_names_a_session_hidden_from_them(team, api_as, crossing):
    c = crossing
    cross(c)
    p_head = head(c.creator, c.private_sid)
    p_job = Job.objects.filter(session_id=c.private_sid).values_list("pk", flat=True).first()
    b_jobs = list(Job.objects.filter(session_id=c.open_sid).order_by("created_at"))
    # an agent in B answers naming where it worked (model output is free text)
    Job.objects.filter(pk=b_jobs[0].pk).update(
        result_text=f"I started {SECRET_NAME} at {p_head}; its execution {p_job} runs in {SECRET_TITLE}.")
    Job.objects.filter(pk=b_jobs[-1].pk).update(
        status="failed", is_error=True, finished_at=timezone.now(), error_reason=f"the branch at {p_head} did not answer")
    secrets = secrets_of(c)
    spawned_here = Branch.objects.get(session_id=c.open_sid, name="visible-work")
    b_head = Message.objects.filter(session_id=c.open_sid).exclude(kind="attach").order_by("-created_at").first()
    values = {
        "sid": c.open_sid, "slug": "alpha", "branch_id": spawned_here.pk, "address": spawned_here.address,
        "mid": b_head.pk, "job_id": b_jobs[0].pk, "execution_id": b_jobs[0].pk, "child_sid": c.open_sid,
        "agent_id": "bot", "hold_id": 1, "token_id": 1, "invitation_id": 1, "webhook_id": 1, "artifact_id": 1,
        "tool": "list_agents", "name": "list_agents", "message_id": b_head.pk, "item_id": "0123456789ab",
    }
    # the creator's own view names P: the scan below would see a leak if the redaction were gone
    assert leaked(json.dumps(c.creator.get("/api/executions", session=c.open_sid).json()), secrets)

    token = bearer_token(c.colleague)
    page = logged_in(c.colleague)
    read = []

    def scan(url: str, response) -> None:
        if response.status_code >= 400:
            return
        body = response.content.decode() if not response.streaming else ""
        read.append(url)
        assert leaked(body, secrets) == [], (url, leaked(body, secrets),
                                             [body[max(0, m.start() - 300):m.end() + 100] for s in leaked(body, secrets) for m in re.finditer(s, body)][:2])

    for method, route, _ in ROUTES:
        if method != "GET" or route in STREAMS or route.startswith(NOT_READ_BY_A_MEMBER):
            continue
        url = _fill(route, values)
        for query in ("", f"?session={c.open_sid}") if route == "/api/executions" else ("",):
            scan(url + query, call_api(token, "GET", url + query))
    branches = list(Branch.objects.filter(session_id=c.open_sid).values_list("pk", flat=True))
    for name, _ in PAGE_PATTERNS:
        url = _fill(_page_route(name), values)
        queries = [""]
        if name in ("session", "session_dag"):
            queries += [f"?branch={b}" for b in branches] + ["?at=5", f"?at={len(secrets)}"]
        for query in queries:
            scan(url + query, page.get(url + query))
    scan("dag", page.get(reverse("collab:session_dag", args=[c.open_sid])))

    assert f"/api/executions?session={c.open_sid}" in read and f"/s/{c.open_sid}/dag" in read, read
    assert len(read) > 30, read


@pytest.mark.parametrize("header_cut", [True, False])
def test_a_graph_label_never_shows_a_hidden_sessions_address(team, api_as, crossing, header_cut):
    """A message delivered into B from P starts with ``[message from P:…]``; its graph label drops
    the header whether the label's snippet holds all of it or ends inside it, and a body that
    names P's address reads "another session" to the colleague (the creator's label keeps it)."""
    from django.db import transaction

    from collab.services.messages import append_message

    c = crossing
    p_head = head(c.creator, c.private_sid)
    header = f"[message from {p_head}]" + (" " * 200 if header_cut else "") + "\n"
    main = Branch.objects.get(session_id=c.open_sid, name="main")
    with transaction.atomic():
        append_message(main, role="user", kind="message", text=header + f"see {p_head} for the plan",
                       metadata={"header": header})
    url = reverse("collab:session_dag", args=[c.open_sid])
    theirs = logged_in(c.colleague).get(url).content.decode()
    assert leaked(theirs, secrets_of(c)) == []
    mine = logged_in(team.member).get(url).content.decode()
    assert (p_head in mine) is (not header_cut), "the creator's label keeps the body's address"
