"""OpenWork in the browser (the agent rail): the parent's session page lists its
sub-agents live with status, duration and tokens; a sub-agent's page is a read-only transcript
(no composer, no fork, no cancel); a delivered result is not a user bubble."""

import pytest
from playwright.sync_api import expect

from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SCRIPT = {
    "user": [
        {"tool_calls": [{"name": "spawn_agent", "arguments": {"task_name": "find_auth", "message": "where is auth?"}},
                        {"name": "spawn_agent", "arguments": {"task_name": "find_db", "message": "where is the db?"}}]},
        {"tool_calls": [{"name": "wait_agent", "arguments": {"timeout_ms": 20000}}]},
        {"tool_calls": [{"name": "wait_agent", "arguments": {"timeout_ms": 10000}}]},
        {"text": "summary: {{mailbox}}"},
    ],
    "spawn": [{"sleep_ms": 1500}, {"text": "explored: {{prompt}}"}],
}


def test_the_agent_rail_lists_children_live_and_a_child_page_is_read_only(team, scripted_session, server, worker, page):
    """The rail lists the direct children with status, duration and token total, live;
    opening one shows its whole transcript read-only (no composer, no re-run)."""
    api, sid = scripted_session(team.member, SCRIPT, toolset="openwork")
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    expect(page.locator("#agents .agent")).to_have_count(0)

    page.fill("#composer textarea[name=prompt]", "survey the code")
    page.click("#composer button[type=submit]")

    rail = page.locator("#agents")
    # the children appear while they run, without a reload
    expect(rail.locator(".agent")).to_have_count(2, timeout=20_000)
    expect(rail.locator(".agent").first).to_contain_text("find_auth")
    expect(rail.locator(".agent .badge").first).to_have_text("completed", timeout=30_000)
    expect(rail.locator('[data-agent="find_db"] .badge')).to_have_text("completed", timeout=30_000)
    expect(rail.locator('[data-agent="find_auth"]')).to_contain_text(" s · ")  # a duration once finished
    expect(rail.locator('[data-agent="find_auth"]')).to_contain_text("tokens")

    transcript = page.locator("#transcript")
    expect(transcript.locator("article.msg.role-assistant .text").last).to_contain_text("summary:", timeout=30_000)
    # delivered results are shown as results from the sub-agent, never as a person's bubble
    results = transcript.locator("article.kind-agent_message")
    expect(results).to_have_count(2)
    expect(results.first.locator(".role")).to_contain_text("result from find_")
    expect(transcript.locator("article.role-user.kind-agent_message")).to_have_count(0)

    page.click('#agents [data-agent="find_auth"] a')
    expect(page.locator("#readonly-note")).to_contain_text("find_auth")
    child = page.locator("#transcript")
    expect(child.locator("article.msg.role-user .text")).to_have_text("where is auth?")
    expect(child.locator("article.msg.role-assistant .text")).to_have_text("explored: where is auth?")
    expect(page.locator("#composer")).to_have_count(0)
    expect(page.locator("textarea")).to_have_count(0)
    expect(page.locator("details.fork")).to_have_count(0)
    expect(page.locator("#jobs form")).to_have_count(0)
    expect(page.get_by_text("your role does not allow posting")).to_have_count(0)
    # and the API refuses a person's turn there too
    child_sid = page.url.rstrip("/").split("/")[-1]
    r = api.post(f"/api/sessions/{child_sid}/turns", {"prompt": "hi"})
    assert (r.status_code, r.json()["code"]) == (409, "child_session_read_only")
    # the child is not a session of its own in the project's list, it is listed under its parent
    page.goto(f"{server.url}/p/alpha/")
    expect(page.locator(f'a[href="/s/{sid}/"]').first).to_be_visible()
    expect(page.locator(f'a[href="/s/{child_sid}/"]')).to_have_count(1)
    expect(page.locator(f'li:has(a[href="/s/{sid}/"]) .sub-agents a[href="/s/{child_sid}/"]')).to_have_text("find_auth")
