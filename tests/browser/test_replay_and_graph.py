"""The session page's replay and graph column in real headless Chromium (docs/web-app.md#replay):
the page opens at its newest turn; the graph column is wide, resizable and remembered; a label cut
at a word's end shows whole on hover and focus; branches of one name are told apart; the fork form
is a popover; a replay marks itself, hides what writes, shows a branch archived later as it was
then, and its slider, step and play controls move the whole page through the log."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.test_csp import RECORD_VIOLATIONS
from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("postgres")]  # pages, not data

SCRIPT = [{"text": "answer: {{prompt}} " + "with the reasons spelled out at length " * 12}]
PROMPT = "Compare the three storage engines by latency, durability and operating cost, question {n}"


def _session(scripted_session, team):
    """Six turns on main, a fork "idea" from its first prompt (archived at the end) and a fork
    "plan" from its second answer, run in this process as a worker would."""
    from collab.models import Branch, Message, Session
    from collab.runtime.loop import run_job
    from collab.services.archive import do_archive_branch
    from collab.services.turns import do_fork_and_start

    api, sid = scripted_session(team.member, SCRIPT)
    for n in range(6):
        r = api.post(f"/api/sessions/{sid}/turns", {"prompt": PROMPT.format(n=n)})
        assert r.status_code == 202, r.content
        run_job(r.json()["execution_id"])
    session = Session.objects.get(pk=sid)
    main = list(Message.objects.filter(session_id=sid).order_by("created_at"))
    idea = do_fork_and_start(team.member, session, main[0], "a new idea", name="idea")
    run_job(idea.pk)
    plan = do_fork_and_start(team.member, session, main[1], "make a plan", name="plan")
    run_job(plan.pk)
    do_archive_branch(Branch.objects.get(pk=idea.branch_id), user=team.member, reason="dead end")
    return sid, Branch.objects.get(pk=idea.branch_id), Branch.objects.get(pk=plan.branch_id)


def test_replay_controls_the_graph_column_labels_and_the_fork_popover(team, scripted_session, server, request):
    from collab.models import Branch, Event

    sid, idea, plan = _session(scripted_session, team)
    archived = Event.objects.get(session_id=sid, type="branch.archived").seq
    page = request.getfixturevalue("page")  # Playwright starts only now: the setup above pushed its events
    page.set_viewport_size({"width": 1440, "height": 900})
    page.add_init_script(RECORD_VIOLATIONS)
    log_in(page, server, team.member)
    main = Branch.objects.get(session_id=sid, name="main")
    page.goto(f"{server.url}/s/{sid}/?branch={main.pk}")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")

    # opened at the newest turn: its last row in view, the first one scrolled away
    rows = page.locator("#transcript article[data-message]")
    expect(rows).to_have_count(12)
    expect(rows.last).to_be_in_viewport()
    expect(rows.first).not_to_be_in_viewport()

    # the graph column: wider than the old 360 px on a wide screen, resized by its handle, remembered
    dag = page.locator("#dag")
    before = dag.bounding_box()["width"]
    assert before > 400
    handle = dag.locator(".dag-resize")
    box = handle.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 20)
    page.mouse.down()
    page.mouse.move(box["x"] + 150, box["y"] + 20, steps=4)
    page.mouse.up()
    widened = dag.bounding_box()["width"]
    assert widened > before + 100, (before, widened)
    assert int(page.evaluate("localStorage.getItem('trellis.dag-width')")) == pytest.approx(widened, abs=4)
    handle.focus()
    page.keyboard.press("ArrowLeft")
    assert dag.bounding_box()["width"] < widened

    # a long label is cut at a word's end; hover and keyboard focus show it whole
    cut = dag.locator("[data-node]", has=page.locator("text.label", has_text=re.compile("…$"))).last
    shown = cut.locator("text.label").text_content()[:-1]
    whole = cut.locator("title").text_content().split("\n")[0]
    assert whole.startswith(shown) and whole[len(shown)] in " ,;:.·-—→", (shown, whole)
    cut.hover()
    tip = page.locator("#dag-tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text(whole)
    page.mouse.move(5, 5)
    expect(tip).to_be_hidden()
    cut.focus()
    expect(tip).to_contain_text(whole)
    assert page.evaluate("window.__csp") == []  # its width and place are set through the CSSOM, allowed

    # the fork form is a popover under the row's "Fork" button; two branches named "idea" are told apart
    page.goto(f"{server.url}/s/{sid}/?branch={plan.pk}")
    row = page.locator("#transcript article[data-message]:not(.inherited)").first
    fork = row.locator("details.fork")
    expect(fork.locator("form")).to_be_hidden()
    fork.locator("summary").click()
    expect(fork.locator("form")).to_be_visible()
    fork.locator("input[name=prompt]").press("Escape")
    expect(fork.locator("form")).to_be_hidden()
    fork.locator("summary").click()
    fork.locator("input[name=prompt]").fill("one more idea")
    fork.locator("input[name=name]").fill("idea")
    fork.locator("button[type=submit]").click()
    again = Branch.objects.exclude(pk=idea.pk).get(session_id=sid, name="idea")
    page.wait_for_url(f"{server.url}/s/{sid}/?branch={again.pk}")
    expect(page.locator(f"#branches li[data-branch='{again.pk}'] a")).to_have_text("idea (from plan)")
    expect(page.locator(f"#branches li[data-branch='{idea.pk}'] a")).to_have_text("idea (from main)")
    expect(page.locator(f"#dag line.lane[data-branch='{idea.pk}'] title")).to_contain_text("idea (from main)")
    # and the width dragged to is kept on the new page
    assert dag.bounding_box()["width"] < widened

    # a replay just before "idea" was archived: marked, read-only, "idea" not archived yet
    page.goto(f"{server.url}/s/{sid}/?at={archived - 1}")
    banner = page.locator("#replay")
    last = int(page.locator("#session").get_attribute("data-last-seq"))
    expect(banner).to_contain_text(f"Replay at event {archived - 1} of {last}")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "replay")
    expect(page.locator("#composer")).to_have_count(0)
    expect(page.locator("details.fork")).to_have_count(0)
    expect(page.locator(f"#branches li[data-branch='{idea.pk}']")).not_to_have_class(re.compile(r"\barchived\b"))
    expect(page.locator(f"#branches li[data-branch='{again.pk}']")).to_have_count(0)  # not created yet

    # step forward: the archive happens, in place (no reload), the URL follows
    page.evaluate("window.__notReloaded = true")
    page.locator("#replay-forward").click()
    expect(banner).to_contain_text(f"Replay at event {archived} of {last}")
    expect(page.locator(f"#branches li[data-branch='{idea.pk}']")).to_have_class(re.compile(r"\barchived\b"))
    expect(page.locator("#dag .badge")).to_have_text(f"replay · event {archived}")
    assert page.url == f"{server.url}/s/{sid}/?at={archived}"
    # step back, then the slider from the keyboard
    page.locator("#replay-back").click()
    expect(banner).to_contain_text(f"Replay at event {archived - 1} of")
    slider = page.locator("#replay-at")
    slider.focus()
    page.keyboard.press("Home")
    expect(banner).to_contain_text(f"Replay at event 1 of {last}")
    expect(page.locator("#transcript article[data-message]")).to_have_count(0)
    expect(page.locator("#replay-at")).to_be_focused()
    # play steps through the events by itself; pause stops it
    play = page.locator("#replay-play")
    play.click()
    expect(play).to_have_attribute("aria-pressed", "true")
    expect(banner).to_contain_text("Replay at event 3 of", timeout=10_000)
    page.locator("#replay-play").click()
    expect(page.locator("#replay-play")).to_have_attribute("aria-pressed", "false")
    stopped = page.locator("#replay").get_attribute("data-at")
    page.wait_for_timeout(1500)
    assert page.locator("#replay").get_attribute("data-at") == stopped
    assert page.evaluate("window.__notReloaded === true")
    assert page.evaluate("window.__csp") == []  # the swaps: nothing the CSP refuses
    page.locator("#replay a.replay-live").click()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
