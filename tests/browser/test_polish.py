"""Polish in real Chromium: /api/docs renders its operations with no network beyond
this server, the pages fit a phone's width with the side panel below, focus is visible for
keyboard users, and the colours follow prefers-color-scheme."""

import pytest
from playwright.sync_api import expect

from tests.browser.test_csp import RECORD_VIOLATIONS
from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("sqlite")]  # layout, not data

PHONE = {"width": 375, "height": 812}


def _offline(page, server):
    """Refuse every request that leaves this server; return the list of those refused."""
    refused = []

    def route(r):
        if r.request.url.startswith(server.url):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    return refused


def _session_with_content(scripted_session, team):
    from collab.runtime.loop import run_job

    api, sid = scripted_session(team.member, [{"text": "answer: {{prompt}} " + "long words " * 40}])
    for prompt in ("first question", "a second, rather longer question " * 5):
        job = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).json()["execution_id"]
        run_job(job)  # in this process, as a worker would; daphne reads the committed rows
    return sid


def test_api_docs_render_their_operations_offline_under_the_csp(server, page):
    refused = _offline(page, server)
    page.add_init_script(RECORD_VIOLATIONS)
    response = page.goto(f"{server.url}/api/docs")
    assert response.status == 200
    expect(page.locator(".opblock").first).to_be_visible(timeout=15_000)
    assert page.locator(".opblock").count() > 10
    expect(page.locator(".opblock-summary-path", has_text="/api/sessions/{sid}/turns").first).to_be_visible()
    assert refused == []
    assert page.evaluate("window.__csp") == []


def test_pages_fit_a_phone_and_the_side_panel_stacks_below(team, scripted_session, server, browser):
    sid = _session_with_content(scripted_session, team)
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        log_in(page, server, team.member)
        for path in (f"/s/{sid}/", "/p/alpha/", "/", "/account/tokens", "/no/such/page/"):
            page.goto(f"{server.url}{path}")
            width = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
            assert width[0] <= width[1], (path, width)
        page.goto(f"{server.url}/s/{sid}/")
        expect(page.locator("#stats figure.plot")).to_have_count(4)
        main = page.locator("#session > section.main").bounding_box()
        side = page.locator("#session > aside.side").bounding_box()
        assert side["y"] >= main["y"] + main["height"] - 1  # stacked below, not beside
        assert side["width"] > PHONE["width"] * 0.8
    finally:
        context.close()


def test_keyboard_focus_is_visible(team, scripted_session, server, page):
    sid = _session_with_content(scripted_session, team)
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    page.wait_for_load_state("networkidle")  # the refresh the socket's opening triggers has landed
    page.keyboard.press("Tab")
    first = page.evaluate("[document.activeElement.className, getComputedStyle(document.activeElement).outlineStyle]")
    assert first == ["skip", "solid"]  # "Skip to content" shows itself on focus
    page.keyboard.press("Tab")
    brand = page.evaluate("[document.activeElement.className, getComputedStyle(document.activeElement).outlineStyle]")
    assert brand == ["brand", "solid"]
    # an activity row's developer detail opens from the keyboard
    summary = page.locator("#activity ol.events details > summary").first
    summary.focus()
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"
    page.keyboard.press("Enter")
    expect(page.locator("#activity ol.events details").first.locator(".dev pre")).to_be_visible()
    # DAG nodes are <a> elements inside an SVG: a focused node's shape gets the focus colour
    page.evaluate("""document.querySelector('#content').insertAdjacentHTML('afterbegin',
        '<svg width="40" height="40"><a href="#n1" id="node-probe"><circle cx="20" cy="20" r="8"/></a></svg>')""")
    page.focus("#node-probe")
    stroke = page.evaluate("getComputedStyle(document.querySelector('#node-probe circle')).strokeWidth")
    assert stroke == "3px"


@pytest.mark.parametrize("scheme,dark", [("light", False), ("dark", True)])
def test_colours_follow_prefers_color_scheme(team, server, page, scheme, dark):
    page.emulate_media(color_scheme=scheme)
    log_in(page, server, team.member)
    rgb = page.evaluate("getComputedStyle(document.body).backgroundColor")
    r, g, b = (int(x) for x in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3])
    assert ((r + g + b) / 3 < 80) is dark, rgb


def test_the_real_worker_introduces_itself_by_a_neutral_name(worker):
    import re

    log = worker.log.read_text(errors="replace")
    assert re.search(r"Q Cluster trellis-\S+:\d+ \[[^\]]+\] running\.", log), log[-2000:]


def test_the_older_link_opens_the_next_page_and_live_updates_keep_it(team, scripted_session, server, page):
    import threading

    from django.db import connection, transaction

    from collab.events import send_event_on_commit
    from collab.selectors.activity import PAGE_SIZE

    _, sid = scripted_session(team.member, [{"text": "answer"}])
    for i in range(PAGE_SIZE + 7):
        with transaction.atomic():
            send_event_on_commit(sid, "todo.created", {"todo": i, "subject": f"task {i}"}, actor=team.member)
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    rows = page.locator("#activity ol.events > li[data-seq]")
    expect(rows).to_have_count(PAGE_SIZE)
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    # the refresh the socket's opening triggers replaces the panel (and a link clicked meanwhile)
    page.wait_for_load_state("networkidle")
    page.evaluate("window.__marker = 1")
    page.click("#activity ol.events li.older a")
    expect(rows).to_have_count(PAGE_SIZE + 8)  # + the 7 older to-dos and "created the session"
    expect(page.locator("#activity ol.events li.older")).to_have_count(0)
    # a live event re-renders the panel: the opened page stays, the new row on top
    def live_one():  # off Playwright's event-loop thread, where pushing to the channel layer works
        with transaction.atomic():
            send_event_on_commit(sid, "todo.created", {"todo": 99, "subject": "live one"}, actor=team.member)
        connection.close()

    pusher = threading.Thread(target=live_one)
    pusher.start()
    pusher.join()
    expect(rows.first).to_contain_text("live one")
    expect(rows).to_have_count(PAGE_SIZE + 9)
    assert page.evaluate("window.__marker") == 1  # no navigation
    seqs = [int(s) for s in rows.evaluate_all("els => els.map(e => e.dataset.seq)")]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs)
