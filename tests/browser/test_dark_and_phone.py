"""The session page in dark mode and at phone width, in real headless Chromium (docs/web-app.md).

Dark mode (prefers-color-scheme: dark): the graph card, its node labels, lanes and edges, and the
transcript's tool-call arguments keep a readable contrast (WCAG: 4.5:1 for text, 3:1 for the
graph's strokes). A phone (390×844): the graph flows in the page, takes at most half the screen,
and the conversation below it is readable and takes the taps; the project page's new-session
title field spans the width.
"""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("sqlite")]  # layout, not data

PHONE = {"width": 390, "height": 844}
TURNS = 8
ROWS = 4 * (TURNS + 1)  # each turn, the fork's too: prompt, tool call, tool result, answer

# Each turn: the agent calls a tool (shown as JSON arguments), reads its result, then answers.
SCRIPT = [
    {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "check {{prompt}}"}}]},
    {"text": "done: {{prompt}}"},
]

# An element's colour and the background it is drawn on: the first ancestor (itself included)
# whose background is not transparent.
COLOURS = """(el, prop) => {
    let box = el, bg = 'rgba(0, 0, 0, 0)';
    while (box) {
        bg = getComputedStyle(box).backgroundColor;
        if (!/^rgba\\(.*,\\s*0\\)$/.test(bg) && bg !== 'transparent') break;
        box = box.parentElement;
    }
    return [getComputedStyle(el)[prop], bg];
}"""


def _rgb(text: str) -> tuple[float, float, float]:
    numbers = re.findall(r"[\d.]+", text)
    assert text.startswith("rgb") and len(numbers) >= 3, text
    if len(numbers) == 4:
        assert float(numbers[3]) == 1, f"{text}: only opaque colours are compared"
    return tuple(float(n) for n in numbers[:3])


def _luminance(text: str) -> float:
    """WCAG 2 relative luminance of an ``rgb(…)`` string."""
    def channel(c):
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in _rgb(text))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    """WCAG 2 contrast ratio of two ``rgb(…)`` strings (1 to 21)."""
    a, b = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def _assert_readable(locator, prop, minimum, what):
    assert locator.count() > 0, f"no {what} on the page"
    for fg, bg in locator.evaluate_all(f"(els, prop) => els.map(el => ({COLOURS})(el, prop))", prop):
        ratio = contrast(fg, bg)
        assert ratio >= minimum, f"{what}: {fg} on {bg} is {ratio:.2f}:1, under {minimum}:1"


def _session_with_tool_calls_and_a_fork(scripted_session, team):
    """A session of ``TURNS`` turns with a tool call each, and a fork from its first prompt, run
    in this process as a worker would (daphne reads the committed rows)."""
    from collab.models import Message, Session
    from collab.runtime.loop import run_job
    from collab.services.turns import do_fork_and_start

    api, sid = scripted_session(team.member, SCRIPT)
    for n in range(TURNS):
        r = api.post(f"/api/sessions/{sid}/turns", {"prompt": f"question {n}"})
        assert r.status_code == 202, r.content
        run_job(r.json()["execution_id"])
    first = Message.objects.filter(session_id=sid, role="user").order_by("created_at").first()
    fork = do_fork_and_start(team.member, Session.objects.get(pk=sid), first, "another way")
    run_job(fork.pk)
    return sid


def _open_session(page, server, team, sid):
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    page.wait_for_load_state("networkidle")  # the refresh the socket's opening triggers has landed


def test_in_dark_mode_the_graph_card_its_labels_and_its_strokes_are_readable(team, scripted_session, server, request):
    sid = _session_with_tool_calls_and_a_fork(scripted_session, team)
    page = request.getfixturevalue("page")  # Playwright starts only now: the setup above pushed its events
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 1440, "height": 900})
    _open_session(page, server, team, sid)
    dag = page.locator("#dag")
    expect(dag.locator("[data-node]")).to_have_count(ROWS)
    card = dag.evaluate("e => getComputedStyle(e).backgroundColor")
    body = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert _luminance(card) < 0.05 and _luminance(body) < 0.05, (card, body)  # a dark card on a dark page
    _assert_readable(dag.locator("[data-node] text.label"), "fill", 4.5, "node label")
    _assert_readable(dag.locator("h2"), "color", 4.5, "graph heading")
    _assert_readable(dag.locator(".dag-replay a"), "color", 4.5, "replay link")
    # lanes, the fork's curve and ring, and the dots are graphics: 3:1 (WCAG 1.4.11)
    _assert_readable(dag.locator("line.lane:not(.archived)"), "stroke", 3, "lane")
    _assert_readable(dag.locator('path[data-edge="fork"]'), "stroke", 3, "fork edge")
    _assert_readable(dag.locator("[data-fork-point] circle.ring"), "stroke", 3, "fork ring")
    _assert_readable(dag.locator("[data-node].role-user circle.dot"), "fill", 3, "node dot")


def test_in_dark_mode_tool_call_arguments_and_the_transcript_are_readable(team, scripted_session, server, request):
    sid = _session_with_tool_calls_and_a_fork(scripted_session, team)
    page = request.getfixturevalue("page")
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 1440, "height": 900})
    _open_session(page, server, team, sid)
    transcript = page.locator("#transcript")
    calls = transcript.locator("article.msg .calls pre code")
    expect(calls.first).to_contain_text('"subject"')
    block = calls.first.evaluate("e => getComputedStyle(e.closest('pre')).backgroundColor")
    assert _luminance(block) < 0.05, block  # the argument block is dark, not a light patch
    _assert_readable(calls, "color", 4.5, "tool-call arguments")
    _assert_readable(transcript.locator("article.msg .calls .tool-name"), "color", 4.5, "tool name")
    _assert_readable(transcript.locator("article.msg .text"), "color", 4.5, "message text")
    _assert_readable(transcript.locator("article.msg header .role"), "color", 4.5, "message role")
    _assert_readable(transcript.locator("article.msg .tool-result > summary"), "color", 4.5, "tool result summary")
    _assert_readable(page.locator("#jobs .job .badge"), "color", 4.5, "job badge")


def test_on_a_phone_the_graph_flows_in_the_page_and_the_conversation_takes_the_taps(team, scripted_session, server, request):
    sid = _session_with_tool_calls_and_a_fork(scripted_session, team)
    context = request.getfixturevalue("browser").new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        _open_session(page, server, team, sid)
        dag = page.locator("#dag")
        expect(dag.locator("[data-node]")).to_have_count(ROWS)
        assert dag.evaluate("e => getComputedStyle(e).position") not in ("sticky", "fixed")
        box = dag.bounding_box()
        assert box["height"] <= 0.5 * PHONE["height"], box
        # the graph keeps all its rows, in a scroll of its own
        assert page.locator("#dag .dag-scroll").evaluate("e => e.scrollHeight > e.clientHeight")

        messages = page.locator("#transcript article.msg")
        assert messages.count() > 8
        message = messages.nth(messages.count() // 2)
        message.evaluate("e => e.scrollIntoView({block: 'center'})")
        expect(message).to_be_in_viewport()
        hit = message.evaluate("""e => {
            const r = e.getBoundingClientRect();
            const x = r.left + r.width / 2, y = Math.min(r.top + r.height / 2, window.innerHeight / 2);
            const top = document.elementFromPoint(x, y);
            return {inside: e.contains(top), inGraph: !!(top && top.closest('#dag')), what: top && top.outerHTML.slice(0, 80)};
        }""")
        assert hit["inside"] and not hit["inGraph"], hit
        # a real tap on the message's link lands on it (opens that message)
        link = message.locator("a.permalink")
        href = link.get_attribute("href")
        link.tap()
        page.wait_for_url(f"{server.url}{href}")
    finally:
        context.close()


def test_on_a_phone_the_new_session_title_field_spans_the_width(team, scripted_session, server, browser):
    scripted_session(team.member, SCRIPT)  # an agent spec, so the form offers one
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        log_in(page, server, team.member)
        page.goto(f"{server.url}/p/alpha/")
        title = page.locator("input[name=title]")
        expect(title).to_be_visible()
        assert title.bounding_box()["width"] >= 0.6 * PHONE["width"], title.bounding_box()
        # the rest of the form still fits the screen and works
        assert page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth")
        title.fill("from a phone")
        page.locator("button", has_text="New session").tap()
        expect(page.locator("header.top .crumb")).to_contain_text("from a phone")
    finally:
        context.close()
