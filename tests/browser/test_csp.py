"""The pages work under their Content-Security-Policy in real Chromium:
logging in, the live session page (htmx, its WebSocket extension, the composer) and the tokens
page run without a single policy violation."""

import pytest
from playwright.sync_api import expect

from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("sqlite")]  # layout, not data

RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + e.blockedURI + " " + (e.sample || ""));
});
"""


def test_the_session_page_works_under_its_csp_without_violations(team, scripted_session, server, worker, page):
    _, sid = scripted_session(team.member, [{"sleep_ms": 300}, {"text": "answer: {{prompt}}"}])
    page.add_init_script(RECORD_VIOLATIONS)
    console = []
    page.on("console", lambda m: m.type == "error" and console.append(m.text))

    log_in(page, server, team.member)
    response = page.goto(f"{server.url}/s/{sid}/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")  # the socket is allowed

    page.fill("#composer textarea[name=prompt]", "under a policy")
    page.click("#composer button[type=submit]")
    expect(page.locator("#transcript article.msg.role-assistant .text")).to_have_text("answer: under a policy",
                                                                                       timeout=20_000)
    expect(page.locator("#composer textarea[name=prompt]")).to_have_value("")  # app.js reset it, no inline handler
    assert page.evaluate("window.__csp") == []

    page.goto(f"{server.url}/account/tokens")
    page.fill("input[name=name]", "browser")
    page.click("form.token-form button[type=submit]")
    expect(page.locator("#new-token")).to_contain_text("trl_")
    assert page.evaluate("window.__csp") == []
    assert not [line for line in console if "Content Security Policy" in line], console
