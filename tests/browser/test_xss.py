"""Stored XSS in real headless Chromium (content is shown only as text).

A person's prompt, a session title, an agent's tool-call arguments, its tool result and
its answer all carry markup that would run script if it were ever inserted as HTML.
The page shows every one of them literally — on the first render, on the live
partial refresh the WebSocket triggers, after a reload, and on the audit page — and
none of the payloads runs: ``window.__xss`` stays undefined.
"""

import json

import pytest
from playwright.sync_api import expect

from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("sqlite")]  # layout, not data

XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
TITLE_XSS = '<img src=x onerror="window.__xss=3">title'


def strings_in(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def assert_no_script_ran(page):
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator("#transcript script, #transcript img").count() == 0


def test_markup_from_people_and_agents_is_shown_as_text_and_never_runs(team, api_as, server, worker, page):
    """The scripted agent calls a tool with the payload, then answers with it; the
    person sends it from the composer. Everything arrives live and is shown literally."""
    owner = api_as(team.owner)
    script = [
        {"sleep_ms": 300},
        {"tool_calls": [{"name": "todo_create", "arguments": {"subject": XSS}}]},
        {"text": XSS},
    ]
    r = owner.post("/api/projects/alpha/agent-specs", {"agent_id": "xss", "provider": "scripted", "script": script})
    assert r.status_code == 201, r.content
    member = api_as(team.member)
    r = member.post("/api/projects/alpha/sessions", {"title": TITLE_XSS, "agent_id": "xss"})
    assert r.status_code == 201, r.content
    sid = r.json()["id"]

    log_in(page, server, team.member)
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    assert TITLE_XSS in page.title()

    page.fill("#composer textarea[name=prompt]", XSS)
    page.click("#composer button[type=submit]")

    transcript = page.locator("#transcript")
    expect(transcript.locator("article.msg.role-user .text")).to_have_text(XSS)
    answer = transcript.locator("article.msg.role-assistant .text").last
    expect(answer).to_have_text(XSS, timeout=30_000)  # arrived live: the socket's event, then the partial refresh
    # tool calls are shown as indented JSON: the payload as a JSON string, literally
    expect(transcript.locator("article.msg.role-assistant .calls code").first).to_contain_text(json.dumps(XSS))
    expect(transcript.locator("article.msg.role-tool .text")).to_contain_text(XSS)
    assert_no_script_ran(page)
    # the markup travelled in the events the socket carried (as JSON string values)
    assert XSS in strings_in(member.get(f"/api/sessions/{sid}/events").json()["events"])

    page.reload()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    expect(page.locator("#transcript article.msg.role-assistant .text").last).to_have_text(XSS)
    expect(page.locator("#transcript article.msg.role-user .text")).to_have_text(XSS)
    assert_no_script_ran(page)

    # the maintainers' audit view renders the same payloads inside event payloads
    # leave the live page first: a partial refresh still in flight after the cookies are gone
    # would set a second CSRF cookie between the login form's render and its submit
    page.goto("about:blank")
    page.context.clear_cookies()
    log_in(page, server, team.maintainer)
    page.goto(f"{server.url}/p/alpha/audit?session={sid}&show=all")  # every event, messages included
    expect(page.locator("table.audit td.sentence").first).to_be_visible()
    for details in page.locator("table.audit details").all():  # each event's payload, unfolded
        details.locator("summary").click()
    expect(page.locator("table.audit pre.payload").first).to_be_visible()
    assert XSS in page.locator("table.audit").inner_text()
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator("table.audit script, table.audit img").count() == 0
    assert dialogs == []

    # control: the payload is live markup in this browser — inserted as HTML, it runs (on a blank
    # page: the site's Content-Security-Policy would block it, and Playwright's own polling, too)
    page.goto("about:blank")
    page.set_content(f"<body>{XSS}</body>")
    page.wait_for_function("window.__xss !== undefined")
