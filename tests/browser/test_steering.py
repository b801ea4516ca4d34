"""Steering from the session page in real Chromium: a composer that says where
it posts and stays in view, a named fork from a node, archiving with a reason, and an agent spec
made on the spec page that a new session then uses."""

import json

import pytest
from playwright.sync_api import expect

from collab.models import Branch
from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("postgres")]  # pages, not data

LONG_ANSWER = "\n".join(f"line {i} of a long answer" for i in range(120))


def _in_viewport(page, selector) -> bool:
    return page.evaluate(
        """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
                       return r.top >= 0 && r.bottom <= window.innerHeight + 1 && r.height > 0; }""", selector)


def test_the_composer_names_branch_and_agent_and_stays_in_view_while_scrolling(
        team, scripted_session, server, worker, page):
    api, sid = scripted_session(team.member, [{"text": LONG_ANSWER}], agent_id="long-talker")
    for prompt in ("tell me a lot", "and more"):
        assert api.wait(api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).json()["execution_id"])["status"] == "succeeded"
    page.set_viewport_size({"width": 1100, "height": 700})
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#composer-to")).to_have_text("To long-talker on main")
    assert page.evaluate("document.documentElement.scrollHeight") > 3 * 700  # a long transcript

    page.evaluate("window.scrollTo(0, 0)")
    expect(page.locator("#transcript article.msg").first).to_be_in_viewport()
    assert _in_viewport(page, "#composer")
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight / 2)")
    assert _in_viewport(page, "#composer")
    # typing there posts to the branch it names, without leaving the scroll position
    page.fill("#composer textarea[name=prompt]", "short one")
    page.click("#composer button[type=submit]")
    expect(page.locator("#transcript article.msg.role-user .text").last).to_have_text("short one")
    assert _in_viewport(page, "#composer")


def test_a_person_forks_from_a_node_under_a_name_of_their_own(team, scripted_session, server, worker, page):
    api, sid = scripted_session(team.member, [{"text": "answer: {{prompt}}"}])
    assert api.wait(api.post(f"/api/sessions/{sid}/turns", {"prompt": "first question"}).json()["execution_id"])["status"] == "succeeded"
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    first = page.locator("#transcript article.msg.role-user").first
    first.locator("details.fork summary").click()
    first.locator("input[name=name]").fill("careful route")
    first.locator("input[name=prompt]").fill("go slower this time")
    first.locator("button[type=submit]").click()

    expect(page.locator("#composer-to")).to_have_text("To bot on careful route")
    fork = Branch.objects.get(session_id=sid, name="careful route")
    assert page.url.endswith(f"?branch={fork.pk}")
    expect(page.locator("#transcript article.msg.role-assistant .text").last).to_have_text(
        "answer: go slower this time", timeout=20_000)


def test_a_branch_is_archived_with_a_reason_and_then_offers_a_fork(team, scripted_session, server, worker, page):
    api, sid = scripted_session(team.member, [{"text": "answer: {{prompt}}"}])
    assert api.wait(api.post(f"/api/sessions/{sid}/turns", {"prompt": "first question"}).json()["execution_id"])["status"] == "succeeded"
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    page.locator("#archive-branch summary").click()
    page.fill("#archive-branch input[name=reason]", "dead end")
    page.click("#archive-branch button[type=submit]")

    expect(page.locator("#archived-composer")).to_contain_text("is archived — dead end")
    expect(page.locator("#composer")).to_have_count(0)
    main = Branch.objects.get(session_id=sid, name="main")
    assert main.archived and main.archive_reason == "dead end"
    page.fill("#fork-from-here input[name=name]", "fresh start")
    page.fill("#fork-from-here textarea[name=prompt]", "once more")
    page.click("#fork-from-here button[type=submit]")
    expect(page.locator("#composer-to")).to_have_text("To bot on fresh start")
    expect(page.locator("#transcript article.msg.role-assistant .text").last).to_have_text("answer: once more", timeout=20_000)


def test_a_spec_made_on_the_spec_page_runs_a_new_session(team, server, worker, page):
    log_in(page, server, team.owner)
    page.goto(f"{server.url}/p/alpha/")
    page.click("#specs-link")
    page.fill("#spec-form input[name=agent_id]", "page-made")
    page.fill("#spec-form textarea[name=script]", json.dumps([{"text": "made on the page: {{prompt}}"}]))
    page.fill("#spec-form textarea[name=limits]", "[not json")
    page.click("#spec-form button[type=submit]")
    expect(page.locator("#spec-error")).to_contain_text("limits is not valid JSON")  # shown inline, input kept
    expect(page.locator("#spec-form input[name=agent_id]")).to_have_value("page-made")
    page.fill("#spec-form textarea[name=limits]", "")
    page.click("#spec-form button[type=submit]")
    expect(page.locator("#spec-list [data-spec=page-made]")).to_be_visible()
    agent = page.locator('#spec-tools details.tool[data-tool="agent"]')  # its tools, each folded
    expect(agent.locator('tr[data-argument="prompt"]')).to_be_hidden()
    agent.locator("summary").click()
    expect(agent.locator('tr[data-argument="prompt"]')).to_contain_text("required")
    expect(agent.locator("pre.tool-example")).to_contain_text('"name": "agent"')

    page.goto(f"{server.url}/p/alpha/")
    page.fill("input[name=title]", "with the new spec")
    page.select_option("select[name=agent_id]", "page-made")
    page.click("form[action$='/sessions'] button[type=submit]")
    expect(page.locator("#composer-to")).to_have_text("To page-made on main")
    page.fill("#composer textarea[name=prompt]", "hello")
    page.click("#composer button[type=submit]")
    expect(page.locator("#transcript article.msg.role-assistant .text").last).to_have_text(
        "made on the page: hello", timeout=20_000)
