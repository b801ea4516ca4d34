"""Live updates, cheaply, in real headless Chromium against a real daphne (+ worker).

Each live event makes the page fetch exactly what it changed — the new rows of the shown branch,
one job/branch/agent row, the running indicator — never the page's sections; what a person is
typing survives; a page whose socket drops asks for the gap by ``seq`` and shows every row once.
"""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import transaction
from playwright.sync_api import expect

from tests.browser.test_session_page import log_in
from tests.conftest import poll

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# Every socket the page opens, and a switch that makes opening one fail (a network outage).
TRACK_SOCKETS = """
(() => {
  const Native = window.WebSocket;
  window.__sockets = [];
  window.__holdSockets = false;
  function Tracked(url, protocols) {
    if (window.__holdSockets) throw new Error("offline (held by the test)");
    const socket = protocols === undefined ? new Native(url) : new Native(url, protocols);
    window.__sockets.push({ url: url, socket: socket });
    return socket;
  }
  Tracked.prototype = Native.prototype;
  Tracked.CONNECTING = 0; Tracked.OPEN = 1; Tracked.CLOSING = 2; Tracked.CLOSED = 3;
  window.WebSocket = Tracked;
})();
"""


def shown_rows(page) -> list[str]:
    return page.eval_on_selector_all("#transcript article[data-message]", "rows => rows.map(r => r.dataset.message)")


def lineage_of(branch_name_or_id, sid) -> list[str]:
    from collab.models import Branch
    from collab.selectors.transcript import lineage

    branch = Branch.objects.select_related("tip").get(session_id=sid, name=branch_name_or_id)
    return [m.pk for m in lineage(branch.tip)]


def grow(sid, count: int, text: str = "row") -> list[str]:
    """Append ``count`` messages to the session's main branch, one committed transaction each
    (each one a ``message.created`` event, as a turn writes them).

    Written from a thread of its own, as a worker would: this thread runs Playwright's event
    loop, where the push to the channel layer after commit cannot run (with Redis nothing else
    would carry the event to the socket)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_grow, sid, count, text).result()


def _grow(sid, count, text):
    from django.db import connection

    from collab.models import Branch
    from collab.services.messages import append_message

    try:
        ids = []
        for i in range(count):
            with transaction.atomic():
                branch = Branch.objects.select_related("tip").get(session_id=sid, name="main")
                ids.append(append_message(branch, role=("user", "assistant")[i % 2], text=f"{text} {i}").pk)
        return ids
    finally:
        connection.close()


def test_a_second_viewer_sees_new_rows_live_and_keeps_what_they_are_typing(
        team, scripted_session, server, worker, page):
    """While a worker answers a turn someone else posted, a second viewer's page
    appends the new rows and updates the job row without a reload, and the fork prompt they are
    half-way through typing (focused, its disclosure open) and their composer text are untouched."""
    api, sid = scripted_session(team.member, [{"sleep_ms": 300}, {"text": "answer: {{prompt}}"}])
    first = api.post(f"/api/sessions/{sid}/turns", {"prompt": "first question"}).json()["execution_id"]
    assert api.wait(first)["status"] == "succeeded"

    log_in(page, server, team.maintainer)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    transcript = page.locator("#transcript")
    expect(transcript.locator("article.msg")).to_have_count(2)
    page.evaluate("window.__marker = 42")

    page.fill("#composer textarea[name=prompt]", "a draft for the composer")
    first_row = transcript.locator("article.msg").first
    first_row.locator("details.fork summary").click()
    fork_input = first_row.locator("details.fork input[name=prompt]")
    fork_input.fill("half-typed fork prom")
    fork_input.press("ArrowLeft")  # a caret that is not at the end
    requests = []
    page.on("request", lambda r: requests.append(r.url))

    second = api.post(f"/api/sessions/{sid}/turns", {"prompt": "second question"}).json()["execution_id"]
    expect(transcript.locator("article.msg.role-assistant .text").last).to_have_text("answer: second question", timeout=20_000)
    expect(page.locator(f'#jobs [data-job="{second}"] .badge')).to_have_text("succeeded", timeout=20_000)
    assert api.wait(second)["status"] == "succeeded"

    expect(transcript.locator("article.msg")).to_have_count(4)
    assert shown_rows(page) == lineage_of("main", sid)
    expect(fork_input).to_have_value("half-typed fork prom")
    expect(fork_input).to_be_focused()
    assert fork_input.evaluate("el => el.selectionStart") == len("half-typed fork prom") - 1
    assert first_row.locator("details.fork").evaluate("el => el.open")
    expect(page.locator("#composer textarea[name=prompt]")).to_have_value("a draft for the composer")
    assert page.evaluate("window.__marker") == 42  # no reload
    # only fragments were fetched, never the page or its sections
    paths = [re.sub(r"^https?://[^/]+", "", u) for u in requests]
    sections = {f"/s/{sid}/{part}" for part in ("transcript", "jobs", "branches", "agents")}
    assert not [p for p in paths if p.split("?")[0] in sections | {f"/s/{sid}/"}], paths
    assert any(p.startswith(f"/s/{sid}/rows?") for p in paths), paths

    # their own post swaps the transcript from the composer's answer: the fork text stays too
    with page.expect_response(lambda r: r.url.endswith(f"/s/{sid}/turns")):
        page.click("#composer button[type=submit]")
    expect(transcript.locator("article.msg.role-user .text").last).to_have_text("a draft for the composer")
    expect(fork_input).to_have_value("half-typed fork prom")
    assert first_row.locator("details.fork").evaluate("el => el.open")

    # and the fork they were typing still works
    fork_input.press("End")
    fork_input.type("pt")
    with page.expect_navigation():
        first_row.locator("details.fork button[type=submit]").click()
    assert "?branch=" in page.url


def test_a_dropped_socket_reconnects_from_its_last_seq_with_no_duplicate_and_no_hole(
        team, scripted_session, server, worker, page):
    """The socket is closed and cannot reopen while a whole turn happens; when it
    can, the page reconnects with ``?after=<the last seq it applied>``, gets exactly the gap, and
    shows each row of the branch once, in order — and keeps following live afterwards."""
    api, sid = scripted_session(team.member, [{"sleep_ms": 200}, {"text": "answer: {{prompt}}"}])
    page.add_init_script(TRACK_SOCKETS)
    log_in(page, server, team.viewer)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    assert page.evaluate("window.__sockets.length") == 1

    one = api.post(f"/api/sessions/{sid}/turns", {"prompt": "while connected"}).json()["execution_id"]
    expect(page.locator("#transcript article.msg.role-assistant .text").last).to_have_text("answer: while connected",
                                                                                             timeout=20_000)
    assert api.wait(one)["status"] == "succeeded"
    poll(lambda: int(page.locator("#session").get_attribute("data-last-seq")) == _last_seq(sid), what="all events applied")
    seen = int(page.locator("#session").get_attribute("data-last-seq"))

    page.evaluate("window.__holdSockets = true; window.__sockets[0].socket.close()")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "offline")
    two = api.post(f"/api/sessions/{sid}/turns", {"prompt": "while offline"}).json()["execution_id"]
    assert api.wait(two)["status"] == "succeeded"
    assert _last_seq(sid) > seen  # the gap holds events
    expect(page.locator("#transcript")).not_to_contain_text("while offline")

    page.evaluate("window.__holdSockets = false")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15_000)
    urls = page.evaluate("window.__sockets.map(s => s.url)")
    assert len(urls) == 2 and urls[1].endswith(f"/ws/sessions/{sid}/?after={seen}"), urls
    expect(page.locator("#transcript article.msg.role-assistant .text").last).to_have_text("answer: while offline",
                                                                                             timeout=20_000)
    poll(lambda: int(page.locator("#session").get_attribute("data-last-seq")) == _last_seq(sid), what="the gap applied")
    rows = shown_rows(page)
    assert len(rows) == len(set(rows)) == 4
    assert rows == lineage_of("main", sid)

    three = api.post(f"/api/sessions/{sid}/turns", {"prompt": "after the reconnect"}).json()["execution_id"]
    expect(page.locator("#transcript article.msg.role-assistant .text").last).to_have_text(
        "answer: after the reconnect", timeout=20_000)
    assert api.wait(three)["status"] == "succeeded"
    expect(page.locator("#transcript article.msg")).to_have_count(6)
    assert shown_rows(page) == lineage_of("main", sid)


def _last_seq(sid) -> int:
    from collab.models import Session

    return Session.objects.values_list("last_event_seq", flat=True).get(pk=sid)


def at_rest(page, sid) -> None:
    """The page applied every event of the session so far and what they set off has finished:
    nothing scheduled, fetching or swapping (``<body data-live-quiet="1">``, static/collab/app.js)."""
    expect(page.locator("#session")).to_have_attribute("data-last-seq", str(_last_seq(sid)))
    expect(page.locator("body")).to_have_attribute("data-live-quiet", "1")


def _requests_for_one_new_row(page, server, sid) -> list[tuple[str, int]]:
    """Open the session, append one message, and return the (path, response size) of every request
    the page made for that one event, once it has gone quiet."""
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    before = len(shown_rows(page))
    seen = []
    # every request but the header's "Needs you" poll, which runs on a clock of its own
    page.on("requestfinished", lambda r: "/inbox/count" not in r.url and seen.append(r))
    at_rest(page, sid)  # anything the page load itself set off has finished
    assert seen == [], [r.url for r in seen]

    (new,) = grow(sid, 1, "the newest")
    expect(page.locator(f"#transcript #m-{new}")).to_have_count(1)
    at_rest(page, sid)  # the activity panel and the graph refresh on their own (throttled) timers
    assert len(shown_rows(page)) == before + 1
    out = []
    for r in seen:
        path = re.sub(r"^https?://[^/]+", "", r.url).replace(sid, "SID").replace(_main(sid), "MAIN")
        path = re.sub(r"after=[^&]+", "after=LAST", path)
        path = re.sub(r"since=[^&]+", "since=FIRST", path)
        out.append((path, len(r.response().body())))
    return sorted(out)


def test_the_requests_per_live_event_do_not_grow_with_the_session(team, scripted_session, server, page):
    """Bounded work per event per viewer: one new message costs the same requests
    — the same fragments, of about the same size — on a session of 5 messages as on one of 50."""
    _, small = scripted_session(team.member, [{"text": "x"}], agent_id="small")
    _, large = scripted_session(team.member, [{"text": "x"}], agent_id="large")
    grow(small, 5)
    grow(large, 50)
    log_in(page, server, team.member)

    at_5 = _requests_for_one_new_row(page, server, small)
    at_50 = _requests_for_one_new_row(page, server, large)

    assert [p for p, _ in at_5] == [p for p, _ in at_50], (at_5, at_50)
    # three requests: the new row (with the running indicator out of band), the activity panel and
    # the DAG column's newest block (at most selectors.dag.SINCE_MAX_ROWS rows, whatever the length)
    assert [p for p, _ in at_5] == ["/s/SID/activity", "/s/SID/dag?since=FIRST", "/s/SID/rows?branch=MAIN&after=LAST"], at_5
    rows_5 = next(size for p, size in at_5 if p.startswith("/s/SID/rows?"))
    rows_50 = next(size for p, size in at_50 if p.startswith("/s/SID/rows?"))
    assert abs(rows_5 - rows_50) < 200, (rows_5, rows_50)  # one row's worth, whatever the length
    assert rows_50 < 4000, rows_50


def _main(sid) -> str:
    from collab.models import Branch

    return Branch.objects.get(session_id=sid, name="main").pk


def _deltas(sid, job, branch, parts):
    from django.db import connection

    from collab.events import send_event_on_commit

    try:
        for part in parts:
            with transaction.atomic():
                send_event_on_commit(sid, "message.delta", {"job": job, "branch": branch, "call": 1, "text": part})
    finally:
        connection.close()


def test_a_burst_of_streamed_text_updates_only_the_generating_bubble(
        team, scripted_session, server, worker, page):
    """``message.delta`` events patch only the running indicator's generating
    bubble, throttled — a burst of five costs one or two fetches of that one fragment, nothing else."""
    api, sid = scripted_session(team.member, [{"sleep_ms": 8000}, {"text": "done"}])
    log_in(page, server, team.viewer)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")

    job = api.post(f"/api/sessions/{sid}/turns", {"prompt": "stream"}).json()["execution_id"]
    api.wait(job, statuses={"running"})
    expect(page.locator("#running .working")).to_have_text("the agent is working…", timeout=20_000)
    at_rest(page, sid)  # the job and activity fetches of the turn's start
    requests = []
    page.on("request", lambda r: "/inbox/count" not in r.url  # the header's poll: a clock of its own
            and requests.append(re.sub(r"^https?://[^/]+", "", r.url)))

    parts = [f"part{i} " for i in range(5)]
    with ThreadPoolExecutor(1) as pool:
        pool.submit(_deltas, sid, job, _main(sid), parts).result()
    expect(page.locator("#running article.generating .text")).to_have_text("part0 part1 part2 part3 part4")
    expect(page.locator("#running .working")).to_have_text("generating…")
    at_rest(page, sid)
    running = [p for p in requests if p.startswith(f"/s/{sid}/running?")]
    assert 1 <= len(running) <= 2, requests
    assert running == requests, requests  # deltas are not listed in the activity panel: nothing else


def test_a_page_far_behind_after_a_reconnect_reloads_its_transcript_once(team, scripted_session, server, page):
    """More rows arrived while the socket was down than one live fetch carries;
    the page reloads its transcript (one fetch, typed text kept) and still shows every row once."""
    from collab.selectors.pages import LIVE_ROWS

    _, sid = scripted_session(team.member, [{"text": "x"}])
    grow(sid, 3)
    page.add_init_script(TRACK_SOCKETS)
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    first_row = page.locator("#transcript article.msg").first
    first_row.locator("details.fork summary").click()
    first_row.locator("details.fork input[name=prompt]").fill("typed before the outage")

    page.evaluate("window.__holdSockets = true; window.__sockets[0].socket.close()")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "offline")
    grow(sid, LIVE_ROWS + 5, "while away")
    requests = []
    page.on("request", lambda r: requests.append(re.sub(r"^https?://[^/]+", "", r.url)))
    page.evaluate("window.__holdSockets = false")

    expect(page.locator("#transcript article.msg")).to_have_count(LIVE_ROWS + 8, timeout=20_000)
    at_rest(page, sid)
    assert shown_rows(page) == lineage_of("main", sid)
    assert [p for p in requests if p.startswith(f"/s/{sid}/transcript")] == [f"/s/{sid}/transcript?branch={_main(sid)}"]
    expect(first_row.locator("details.fork input[name=prompt]")).to_have_value("typed before the outage")
