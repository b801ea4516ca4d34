"""The inbox in real headless Chromium against daphne and a worker (docs/web-app.md#inbox): with
the session page open, a turn stops at a call that needs approval — the call shows "Waiting for a
person" and the header's "Needs you" count turns to 1, with no reload; the count leads to the
inbox, where approving in place removes the item and the count drops to 0, and the turn resumes
and ends succeeded. And on a phone, from the keyboard, the same decision taken on the graph's
waiting node: its card answers in place, and the graph follows the turn to its end."""

import re

import pytest
from playwright.sync_api import expect

from collab.models import PersonAsk
from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]

LIVE = 20_000  # ms: how long the page may take to follow a change on a busy machine
APPROVED_TODO = [
    {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "ship <it>"}}]},
    {"text": "after the call: {{last.text}}"},
]


def test_a_waiting_call_shows_live_and_is_approved_in_place_from_the_inbox(team, scripted_session, server, worker,
                                                                          page):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    page.set_default_timeout(LIVE)
    log_in(page, server, team.member)
    count = page.locator("header.top #needs-you .count")
    expect(count).to_have_text("0")
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")

    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"})
    assert r.status_code == 202, r.content
    eid = r.json()["execution_id"]
    assert api.wait(eid, statuses={"waiting"})["status"] == "waiting"
    ask = PersonAsk.objects.get(job_id=eid)
    call = page.locator("#transcript li.call", has_text="todo_create")
    expect(call.locator(".badge.waiting")).to_have_text("Waiting for a person")  # live: no reload
    expect(count).to_have_text("1")

    expect(call.get_by_role("link", name="Decide in your inbox")).to_have_attribute("href", f"/inbox#item-{ask.pk}")
    page.locator("header.top #needs-you").click()  # the header's count leads to the inbox
    expect(page).to_have_url(f"{server.url}/inbox")
    item = page.locator(f"#item-{ask.pk}")
    expect(item).to_contain_text("wants to call todo_create")
    expect(item.locator("pre.arguments")).to_contain_text('"subject": "ship <it>"')
    item.get_by_role("button", name="Approve", exact=True).click()
    expect(item).to_have_count(0)
    expect(page.locator("#inbox-summary")).to_have_text("Approved. Nothing waits for you.")
    expect(count).to_have_text("0")

    done = api.wait(eid)
    assert done["status"] == "succeeded" and done["result"].startswith("after the call: todo "), done


PHONE = {"width": 390, "height": 844}


def test_on_a_phone_a_waiting_node_is_decided_in_the_graph_from_the_keyboard(team, scripted_session, server, worker,
                                                                            browser):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.set_default_timeout(LIVE)
    try:
        log_in(page, server, team.member)
        page.goto(f"{server.url}/s/{sid}/")
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
        eid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()["execution_id"]
        assert api.wait(eid, statuses={"waiting"})["status"] == "waiting"
        ask = PersonAsk.objects.get(job_id=eid)

        node = page.locator(f'#dag [data-node="{ask.call_message_id}"]')
        expect(node).to_have_class(re.compile(r"\bwaiting\b"))  # live: no reload
        expect(node).to_have_attribute("aria-describedby", f"dag-ask-{ask.pk}")
        card = page.locator(f"#dag-ask-{ask.pk}")
        expect(card.locator("pre.arguments")).to_contain_text('"subject": "ship <it>"')  # text, not markup
        approve = card.get_by_role("button", name="Approve", exact=True)
        approve.scroll_into_view_if_needed()
        expect(approve).to_be_in_viewport()
        box = approve.bounding_box()
        assert box["height"] >= 32 and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box  # tappable

        approve.focus()
        page.keyboard.press("Enter")
        expect(card).to_have_count(0)  # the graph re-rendered once the turn went on
        expect(page.locator("#dag .node.waiting")).to_have_count(0)
        expect(page.locator(f'#dag .lane[data-branch="{ask.branch_id}"][data-live]')).to_have_count(0)  # ended
        expect(page.locator("header.top #needs-you .count")).to_have_text("0")
        done = api.wait(eid)
        assert done["status"] == "succeeded" and done["result"].startswith("after the call: todo "), done
    finally:
        context.close()
