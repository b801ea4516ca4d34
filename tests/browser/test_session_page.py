"""The session page in real headless Chromium against a real daphne + django-q2 worker.

A person logs in, opens a session, sends a prompt from the composer, and the
agent's answer arrives over the WebSocket while the page stays put
(docs/contract.md#events). Roles decide what the page offers (docs/contract.md#roles-and-capabilities).
"""

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PASSWORD = "pw-secret-123"


def log_in(page, server, user):
    page.goto(f"{server.url}/accounts/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    # LOGIN_REDIRECT_URL is the projects page; the header then names the user.
    expect(page.locator("header.top .who")).to_have_text(user.username)


def test_a_prompt_sent_from_the_composer_is_answered_live_without_a_reload(team, scripted_session, server, worker, page):
    """Send from the composer; the answer arrives over the WebSocket.

    The scripted agent sleeps first, so the answer is written after the POST has
    returned: the POST's own response renders only the prompt, and the answer can
    only reach the page through the socket event and the partial refresh it triggers.
    """
    _, sid = scripted_session(team.member, [{"sleep_ms": 500}, {"text": "answer: {{prompt}}"}])
    log_in(page, server, team.member)

    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    transcript = page.locator("#transcript")
    expect(transcript).not_to_contain_text("answer:")

    # Any navigation would throw this away; it must survive the whole exchange.
    page.evaluate("window.__marker = 42")
    navigations = []
    page.on("framenavigated", lambda frame: frame == page.main_frame and navigations.append(frame.url))

    with page.expect_response(lambda r: r.url.endswith(f"/s/{sid}/turns") and r.request.method == "POST") as posted:
        page.fill("#composer textarea[name=prompt]", "hello from chromium")
        page.click("#composer button[type=submit]")
    response = posted.value
    assert response.ok, response.text()
    assert "hello from chromium" in response.text()
    assert "answer: hello from chromium" not in response.text()  # the answer came later, not with the POST

    answer = transcript.locator("article.msg.role-assistant .text")
    expect(answer).to_have_text("answer: hello from chromium", timeout=20_000)
    expect(transcript.locator("article.msg.role-user .text")).to_have_text("hello from chromium")
    expect(page.locator("#composer textarea[name=prompt]")).to_have_value("")  # the form was reset
    expect(page.locator("#composer-error")).to_have_text("")
    expect(page.locator("#jobs .job .badge").first).to_have_text("succeeded")

    assert page.evaluate("window.__marker") == 42
    assert navigations == []
    assert page.url == f"{server.url}/s/{sid}/"
    assert int(page.locator("#session").get_attribute("data-last-seq")) >= 6  # events came over the socket


def test_a_viewer_reads_the_session_but_gets_no_composer(team, scripted_session, server, worker, page):
    """A viewer may read (project.read) but not start turns (turn.start)."""
    api, sid = scripted_session(team.member, [{"text": "answer: {{prompt}}"}])
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "visible to viewers"})
    assert r.status_code == 202, r.content
    assert api.wait(r.json()["execution_id"])["status"] == "succeeded"

    log_in(page, server, team.viewer)
    response = page.goto(f"{server.url}/s/{sid}/")
    assert response.status == 200
    expect(page.locator("#transcript article.msg.role-assistant .text")).to_have_text("answer: visible to viewers")
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#composer")).to_have_count(0)
    expect(page.locator("textarea[name=prompt]")).to_have_count(0)
    expect(page.get_by_text("your role does not allow posting")).to_be_visible()


def test_an_outsider_gets_a_404_page_for_the_session(team, scripted_session, server, page):
    """Outsiders get the same 404 as for a missing id; nothing of the session shows."""
    _, sid = scripted_session(team.member, [{"text": "secret answer"}])
    log_in(page, server, team.outsider)

    response = page.goto(f"{server.url}/s/{sid}/")
    assert response.status == 404
    expect(page.locator("#transcript")).to_have_count(0)
    expect(page.locator("#composer")).to_have_count(0)
    assert "secret answer" not in page.content()

    # the very same page as for an id that does not exist: existence does not leak
    body = response.text()
    missing = page.goto(f"{server.url}/s/does-not-exist/")
    assert missing.status == 404
    assert missing.text() == body
