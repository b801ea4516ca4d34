"""What changes while a second viewer has the session page open, in real headless Chromium against
daphne and a worker: the page was loaded before the change and is never reloaded, yet it shows
what a reload would — a spawned agent's card follows its child to the end, the plots count the
turns, and a turn that was cancelled or failed leaves its marker where it stopped.
"""

import re

import pytest
from playwright.sync_api import expect

from collab.models import Message
from tests.browser.test_live_page import at_rest
from tests.browser.test_session_page import log_in
from tests.conftest import executions, set_limits

pytestmark = [pytest.mark.slow, pytest.mark.browser]

LIVE = 20_000  # ms: how long the page may take to follow a change on a busy machine


def open_page(browser, server, user, sid):
    """A viewer of its own (own browser context), on the session page, following it live; the
    page carries a marker that a reload would lose."""
    page = browser.new_context().new_page()
    page.set_default_timeout(LIVE)
    log_in(page, server, user)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    page.evaluate("window.__notReloaded = true")
    return page


def not_reloaded(page) -> bool:
    return page.evaluate("window.__notReloaded === true")


def start(api, sid, prompt) -> str:
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    return r.json()["execution_id"]


# the user turn starts a helper in the background and answers at once; the helper works a while
# (long enough for the page to show it running) and its result comes home as a follow-up turn
SPAWNING = {
    "user": [
        {"tool_calls": [{"name": "agent", "arguments": {"prompt": "compute", "description": "helper",
                                                         "run_in_background": True}}]},
        {"text": "the helper is on it"},
    ],
    "spawn": [{"sleep_ms": 6000}, {"text": "child says 42"}],
    "followup": [{"text": "thanks for the result"}],
}


def test_a_background_spawn_card_turns_from_running_to_succeeded_when_its_child_finishes(
        team, scripted_session, server, worker, browser):
    """The card of a helper started by an ``agent`` call shows it queued or running on a viewer's
    page, then — with no reload — succeeded once the child has finished, as a reload would."""
    api, sid = scripted_session(team.member, SPAWNING)
    page = open_page(browser, server, team.viewer, sid)
    try:
        root = start(api, sid, "start a helper")
        card = page.locator("#transcript a.attach")
        expect(card).to_have_count(1, timeout=LIVE)
        expect(card).to_contain_text("spawned helper")
        badge = card.locator(".badge.status")
        expect(badge).to_have_text(re.compile(r"^(queued|running)$"), timeout=LIVE)
        (child,) = [j["id"] for j in executions(api, sid) if j["id"] != root]

        assert api.wait(child)["status"] == "succeeded"
        expect(badge).to_have_text("succeeded", timeout=LIVE)
        expect(badge).to_have_class(re.compile(r"\bstatus-succeeded\b"))
        expect(card.locator(".muted").first).to_contain_text(" s")  # its duration, known once it ended
        assert not_reloaded(page)
    finally:
        page.context.close()


def test_the_plots_count_the_turns_once_a_turn_has_ended(team, scripted_session, server, worker, browser):
    """A session with no turn shows "No turns yet"; a viewer who keeps the page open sees the plots
    of the turn once it has ended (its count, the four plots), without a reload."""
    api, sid = scripted_session(team.member, [{"sleep_ms": 300}, {"text": "answer: {{prompt}}"}])
    page = open_page(browser, server, team.viewer, sid)
    try:
        stats = page.locator("#stats")
        expect(stats).to_contain_text("No turns yet")

        job = start(api, sid, "first question")
        assert api.wait(job)["status"] == "succeeded"
        expect(page.locator("#jobs [data-job] .badge").first).to_have_text("succeeded", timeout=LIVE)
        expect(stats).not_to_contain_text("No turns yet", timeout=LIVE)
        expect(stats).to_contain_text("1 turn ·")
        expect(stats.locator("figure.plot")).to_have_count(4)
        assert not_reloaded(page)
    finally:
        page.context.close()


def test_a_cancel_by_one_viewer_shows_the_stopped_marker_on_another_viewers_page(
        team, scripted_session, server, worker, browser):
    """While a turn sleeps, one person cancels it from the job list of their page; a second viewer,
    whose page was open all along, sees "Turn stopped: cancelled" after the turn's prompt — as the
    person who cancelled does — with no reload."""
    api, sid = scripted_session(team.member, [{"sleep_ms": 120_000}, {"text": "never said"}])
    canceller = open_page(browser, server, team.member, sid)
    watcher = open_page(browser, server, team.viewer, sid)
    try:
        job = start(api, sid, "stop me")
        api.wait(job, statuses={"running"})
        prompt = Message.objects.get(session_id=sid, text="stop me")
        for page in (canceller, watcher):
            expect(page.locator(f"#transcript #m-{prompt.pk}")).to_have_count(1, timeout=LIVE)
            expect(page.locator("#running .working")).to_have_text(re.compile("the agent is working"), timeout=LIVE)
        at_rest(watcher, sid)  # what the turn's start set off has landed: the marker can only come later
        expect(watcher.locator("#transcript .stopped")).to_have_count(0)

        row = canceller.locator(f'#jobs li[data-job="{job}"]')
        with canceller.expect_response(lambda r: r.url.endswith(f"/jobs/{job}/cancel")):
            row.locator("button.cancel").click()
        assert api.wait(job)["status"] == "cancelled"

        for page in (watcher, canceller):
            marker = page.locator(f"#transcript #m-{prompt.pk} .stopped.status-cancelled")
            expect(marker).to_contain_text("Turn stopped: cancelled", timeout=LIVE)
            expect(page.locator("#transcript .stopped")).to_have_count(1)
            expect(page.locator("#running")).to_be_hidden()
            expect(page.locator(f'#jobs li[data-job="{job}"] .badge')).to_have_text("stopped")
            assert not_reloaded(page)
    finally:
        canceller.context.close()
        watcher.context.close()


def test_a_failed_turn_shows_turn_failed_after_its_last_row_on_an_open_page(
        team, api_as, scripted_session, server, worker, browser):
    """A turn calls a tool, then runs past the project's time limit and fails. A viewer whose page
    showed its rows while it ran sees "Turn failed", with the limit's code, after the last row the
    turn wrote (its tool result), without a reload."""
    set_limits(api_as(team.owner), max_runtime_seconds=4)
    api, sid = scripted_session(team.member, [
        {"tool_calls": [{"name": "list_agents", "arguments": {}}]},
        {"sleep_ms": 120_000},
        {"text": "never said"},
    ])
    page = open_page(browser, server, team.viewer, sid)
    try:
        job = start(api, sid, "run out of time")
        transcript = page.locator("#transcript")
        expect(transcript.locator("article.role-tool")).to_have_count(1, timeout=LIVE)

        done = api.wait(job)
        assert done["status"] == "failed" and done["error_code"] == "quota.runtime_exceeded", done
        last = Message.objects.filter(job_id=job).exclude(kind="attach").order_by("-depth").first()
        assert last.role == "tool"
        marker = transcript.locator(f"#m-{last.pk} .stopped.status-failed")
        expect(marker).to_contain_text("Turn failed", timeout=LIVE)
        expect(marker).to_contain_text("quota.runtime_exceeded")
        expect(transcript.locator(".stopped")).to_have_count(1)
        expect(page.locator("#running")).to_be_hidden()
        assert not_reloaded(page)
    finally:
        page.context.close()
