"""Who sees a session, in the browser (docs/contract.md#visibility): the creator makes a session
private and shares it from the session page's small form; a member not on the list then finds
it gone from the project page and its URL answers like a missing session; the listed member
opens it."""

import pytest
from playwright.sync_api import expect

from accounts.models import Membership
from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_the_creator_makes_a_session_private_then_shares_it_from_the_page(team, scripted_session, server,
                                                                                 make_user, page):
    colleague, friend = make_user("colleague"), make_user("friend")
    for user in (colleague, friend):
        Membership.objects.create(user=user, project=team.alpha, role="member")
    _, sid = scripted_session(team.member, [{"text": "x"}])

    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    form = page.locator("#visibility form")
    expect(page.locator("#visibility")).to_have_attribute("data-visibility", "project")
    page.locator("#visibility > summary").click()  # folded at the foot of the side panel
    form.locator("select[name=visibility]").select_option("shared")
    form.locator("textarea[name=shares]").fill("friend viewer")
    form.locator("button[type=submit]").click()
    expect(page.locator("#visibility")).to_have_attribute("data-visibility", "shared")
    expect(page.locator("#visibility textarea[name=shares]")).to_have_value("friend viewer\n")

    other = page.context.browser.new_context()
    try:
        theirs = other.new_page()
        log_in(theirs, server, colleague)
        theirs.goto(f"{server.url}/p/alpha/")
        expect(theirs.locator(f'[data-session="{sid}"]')).to_have_count(0)
        hidden = theirs.goto(f"{server.url}/s/{sid}/")
        hidden_body = theirs.content().replace(sid, "X")
        missing = theirs.goto(f"{server.url}/s/000000000000/")
        assert hidden.status == missing.status == 404
        assert hidden_body == theirs.content().replace("000000000000", "X")
    finally:
        other.close()

    listed = page.context.browser.new_context()
    try:
        theirs = listed.new_page()
        log_in(theirs, server, friend)
        theirs.goto(f"{server.url}/p/alpha/")
        expect(theirs.locator(f'[data-session="{sid}"]')).to_have_count(1)
        assert theirs.goto(f"{server.url}/s/{sid}/").status == 200
        expect(theirs.locator("#visibility form")).to_have_count(0)  # a listed member does not change it
        expect(theirs.locator("#visibility .badge")).to_have_text("shared")
    finally:
        listed.close()
