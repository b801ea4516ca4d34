"""Reading a branch, in real headless Chromium against daphne + a worker.

Two people read one session: a fork made by one never moves what the other sees; delivered
results render as cards that lead to the agent that produced them, positioned at its node; a
cancelled turn leaves a marker where it stopped.
"""

import os
import re

import pytest
from playwright.sync_api import expect

from collab.models import Branch, Message
from tests.browser.test_session_page import log_in
from tests.conftest import poll, settle_session

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("sqlite")]  # layout, not data

SCRIPT = {
    "user": [{"sleep_ms": 600}, {"text": "answer: {{prompt}}"}],
    "spawn": [{"text": "child says 42"}],
    "followup": [{"text": "thanks for the result"}],
}
# the first turn starts a background helper (a model's tool call: the gateway's in-process events
# cannot run beside Playwright's loop in this process); a turn cancelled while it sleeps never does
SPAWNING = {**SCRIPT, "user": [
    {"sleep_ms": 600},
    {"tool_calls": [{"name": "agent", "arguments": {"prompt": "compute", "description": "helper", "run_in_background": True}}]},
    {"text": "answer: {{prompt}}"},
]}


def new_page(browser):
    page = browser.new_context().new_page()
    page.set_default_timeout(20_000)
    return page


def turn(api, sid, prompt) -> dict:
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    return r.json()


def test_selection_is_per_viewer_a_fork_by_a_moves_nothing_for_b(team, scripted_session, server, worker, browser):
    """A forks from a message; A's page shows the fork (and marks it in the branch
    list); B, reading main with the page open, still reads main after the live refresh and after a
    reload; someone opening the session afterwards lands on main too."""
    api, sid = scripted_session(team.member, SCRIPT)
    assert api.wait(turn(api, sid, "first question")["execution_id"])["status"] == "succeeded"
    main = Branch.objects.get(session_id=sid, name="main")
    first = Message.objects.get(branch=main, text="first question")

    a, b = new_page(browser), new_page(browser)
    log_in(a, server, team.member)
    log_in(b, server, team.viewer)
    for p in (a, b):
        p.goto(f"{server.url}/s/{sid}/")
        expect(p.locator("#live-status")).to_have_attribute("data-state", "live")
        expect(p.locator("#transcript")).to_have_attribute("data-branch", main.pk)

    row = a.locator(f"#m-{first.pk}")
    row.locator("details.fork summary").click()
    row.locator("input[name=prompt]").fill("try the other way")
    row.locator("button[type=submit]").click()
    a.wait_for_url(re.compile(r"\?branch=\w+$"))
    fork = Branch.objects.exclude(pk=main.pk).get(session_id=sid)
    expect(a.locator("#transcript")).to_have_attribute("data-branch", fork.pk)
    expect(a.locator("#branches li.current")).to_have_attribute("data-branch", fork.pk)
    expect(a.locator("#branches li.current a")).to_have_attribute("aria-current", "page")
    expect(a.locator("#transcript .fork-divider")).to_contain_text("branched from main")
    expect(a.locator("#transcript article.role-assistant .text").last).to_have_text("answer: try the other way")

    # B got the live events (the new branch is listed) but still reads main
    expect(b.locator(f'#branches li[data-branch="{fork.pk}"]')).to_have_count(1)
    expect(b.locator("#transcript")).to_have_attribute("data-branch", main.pk)
    expect(b.locator("#branches li.current")).to_have_attribute("data-branch", main.pk)
    expect(b.locator("#transcript")).not_to_contain_text("try the other way")
    b.reload()
    expect(b.locator("#transcript")).to_have_attribute("data-branch", main.pk)

    c = new_page(browser)
    log_in(c, server, team.maintainer)
    c.goto(f"{server.url}/s/{sid}/")
    expect(c.locator("#transcript")).to_have_attribute("data-branch", main.pk)
    # and A, coming back without a link, finds their own fork
    a.goto(f"{server.url}/s/{sid}/")
    expect(a.locator("#transcript")).to_have_attribute("data-branch", fork.pk)
    for p in (a, b, c):
        p.context.close()


def test_results_are_cards_that_open_the_agent_at_its_node_and_a_cancel_leaves_a_marker(
        team, scripted_session, server, worker, page):
    """A background agent's result comes home as a card (name, status, body) —
    not the "[result from …]" text its caller's model read; its link opens the agent's branch
    scrolled to the node; a turn cancelled mid-way shows "Turn stopped: cancelled" after its
    prompt."""
    api, sid = scripted_session(team.member, SPAWNING)
    assert api.wait(turn(api, sid, "first question")["execution_id"])["status"] == "succeeded"
    main = Branch.objects.get(session_id=sid, name="main")
    settle_session(api, sid, quiet=0.5)
    stop = turn(api, sid, "stop me")
    poll(lambda: api.get(f"/api/executions/{stop['execution_id']}").json()["status"] == "running", what="the turn to run")
    running = api.get(f"/api/executions/{stop['execution_id']}").json()
    r = api.post(f"/api/executions/{stop['execution_id']}/commands",
                 {"command_id": "stop-1", "action": "execution.cancel", "expected_version": running["version"], "payload": {}})
    assert r.status_code == 202, r.content
    assert api.wait(stop["execution_id"])["status"] == "cancelled"

    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    transcript = page.locator("#transcript")
    card = transcript.locator("article.card-result")
    expect(card).to_have_count(1)
    expect(card.locator(".role")).to_contain_text("result from helper")
    expect(card.locator(".badge.status")).to_have_text("succeeded")
    expect(card.locator(".card-body .text")).to_have_text("child says 42")
    expect(card.locator(".card-body .text")).to_be_visible()
    expect(transcript).not_to_contain_text("[result from")
    expect(transcript.locator("article.role-assistant .text").last).to_have_text("thanks for the result")
    marker = transcript.locator(".stopped.status-cancelled")
    expect(marker).to_contain_text("Turn stopped: cancelled")
    prompt = Message.objects.get(branch=main, text="stop me")
    expect(transcript.locator(f"#m-{prompt.pk} .stopped")).to_have_count(1)
    if os.environ.get("TRELLIS_SCREENSHOTS"):
        page.screenshot(path=os.environ["TRELLIS_SCREENSHOTS"] + "/branch-reading-main.png", full_page=True)

    card.locator("a.agent").click()
    page.wait_for_url(re.compile(r"\?branch=\w+&head=\w+$"))
    child = page.locator("#transcript")
    expect(child.locator('article[aria-current="location"]')).to_have_count(1)
    expect(child.locator('article[aria-current="location"]')).to_be_in_viewport()
    expect(child.locator("article.card-spawn .role")).to_contain_text("started by main")
    expect(child.locator("article.card-spawn .text")).to_have_text("compute")
    expect(child).not_to_contain_text("[task from")
    expect(page.locator("#branches li.current a")).to_have_text("helper")
