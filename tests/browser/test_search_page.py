"""Search from the header, in real headless Chromium (docs/web-app.md#search): type in the box on
any page, read the snippet, click, land on that message of that branch, scrolled to."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_a_search_from_the_header_lands_on_the_message_it_found(team, server, request):
    from collab.models import Branch, Message, Session

    session = Session.objects.create(project=team.alpha, created_by=team.member, title="Zoo notes")
    main = Branch.objects.create(session=session, name="main")
    tip = None
    for n in range(60):  # a long branch: the message found is far down the page
        text = "The okapi lives in the Ituri <forest>" if n == 45 else f"note {n} about the giraffes"
        tip = Message.objects.create(session=session, branch=main, predecessor=tip, depth=n, turn=n // 2 + 1,
                                     role="user" if n % 2 == 0 else "assistant", text=text)
        if n == 45:
            found = tip
    Branch.objects.filter(pk=main.pk).update(tip=tip)

    page = request.getfixturevalue("page")
    log_in(page, server, team.member)
    box = page.locator("header.top input[name=q]")
    box.fill("zzqx nothing")
    box.press("Enter")
    expect(page.locator("#search-summary")).to_have_text("Nothing matched “zzqx nothing”.")

    box.fill("okapi")
    box.press("Enter")
    results = page.locator("#search-results li")
    expect(results).to_have_count(1)
    expect(results.first.locator(".snippet mark")).to_have_text("okapi")
    expect(results.first.locator(".snippet")).to_have_text("The okapi lives in the Ituri <forest>")
    results.first.locator("a").click()

    page.wait_for_url(re.compile(rf"/s/{session.pk}/\?branch={main.pk}&head={found.pk}$"))
    row = page.locator(f"#transcript #m-{found.pk}")
    expect(row).to_have_attribute("aria-current", "location")
    expect(row).to_be_in_viewport()
